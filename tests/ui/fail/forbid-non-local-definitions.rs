//! A known limitation, documented under `# Lints`: the consumer's claim is a
//! `#[macro_export]` macro inside the handler, allowed there, which a `forbid` overrules.
//! `deny(non_local_definitions)` works.
#![forbid(non_local_definitions)]

use diesel_async::AsyncPgConnection;

#[diesel_inbox::idempotent(consumer = "c", key = id)]
async fn handle(conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    let _ = (conn, id);
    Ok(())
}

fn main() {}
