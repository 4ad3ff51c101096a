use std::time::Duration;

use diesel_async::AsyncPgConnection;

#[diesel_inbox::idempotent(consumer = "c", key = id, lease = Duration::from_secs(30), max_attempts = 3)]
async fn handle(conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    let _ = (conn, id);
    Ok(())
}

fn main() {}
