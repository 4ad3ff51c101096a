#![deny(unused)]

use diesel_async::AsyncPgConnection;

// Only the duplicate is reported: not the connection, which a claim body rarely names.
#[diesel_inbox::idempotent(consumer = "c", key = id, claim, claim)]
async fn handle(conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    Ok(())
}

fn main() {}
