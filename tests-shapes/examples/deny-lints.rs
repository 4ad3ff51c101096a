//! The strict lints at `deny` stay quiet on a handler, as they do at `forbid`
//! (`forbid-lints.rs`).
#![deny(non_local_definitions, future_incompatible, warnings)]

use diesel_async::AsyncPgConnection;

#[diesel_inbox::idempotent(consumer = "deny-lints", key = id)]
async fn handle(conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    let _ = (conn, id);
    Ok(())
}

fn main() {
    let _ = handle;
}
