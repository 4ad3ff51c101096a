//! `max_attempts` with a suffix is the number it says.
#![deny(warnings)]

use diesel_async::AsyncPgConnection;
use diesel_inbox::idempotent;

#[idempotent(consumer = "claim_suffixed", key = id, claim, max_attempts = 3u8)]
async fn suffixed(conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    let _ = id;
    Ok(())
}

fn main() {
    let _ = suffixed;
}
