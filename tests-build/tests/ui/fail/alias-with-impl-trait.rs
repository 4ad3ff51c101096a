use std::fmt::Display;

use diesel_async::AsyncPgConnection;

#[diesel_inbox::idempotent(consumer = "c", key = id)]
async fn handle(conn: &mut AsyncPgConnection, id: u64) -> anyhow::Result<impl Display> {
    let _ = conn;
    Ok(id)
}

fn main() {}
