//! A `mut` connection parameter can be reassigned in the body, as in a plain `async fn`.
#![deny(warnings)]

use diesel::result::Error;
use diesel_async::AsyncPgConnection;
use diesel_inbox::idempotent;

fn through(conn: &mut AsyncPgConnection) -> &mut AsyncPgConnection {
    conn
}

#[idempotent(consumer = "reassigned", key = id)]
async fn handle(mut conn: &mut AsyncPgConnection, id: u64) -> Result<(), Error> {
    conn = through(conn);
    let _ = conn;
    Ok(())
}

fn main() {
    let _ = handle;
}
