//! `key` and `fast_path` are evaluated before the transaction, so both may use the
//! connection, even across an `.await`.
#![deny(warnings)]

use diesel::result::Error;
use diesel_async::AsyncPgConnection;
use diesel_inbox::idempotent;

async fn is_redelivery(conn: &mut AsyncPgConnection, id: u64) -> bool {
    let _ = conn;
    std::future::ready(id.is_multiple_of(2)).await
}

fn key_of(conn: &AsyncPgConnection, id: u64) -> u64 {
    let _ = conn;
    id
}

#[idempotent(consumer = "fast-path-conn", key = key_of(conn, id), fast_path = is_redelivery(conn, id).await)]
async fn handle(conn: &mut AsyncPgConnection, id: u64) -> Result<(), Error> {
    let _ = conn;
    Ok(())
}

fn main() {
    let _ = handle;
}
