//! A `&mut` parameter under `#[cfg]` is not a second connection candidate next to one
//! that every build has; one name under a `#[cfg]` per build is the connection of each.
#![deny(warnings)]

use diesel::result::Error;
use diesel_async::AsyncPgConnection;
use diesel_inbox::idempotent;

#[idempotent(consumer = "cfg-scratch", key = id)]
async fn scratch(
    #[cfg(any())] scratch: &mut Vec<u8>,
    db: &mut AsyncPgConnection,
    id: u64,
) -> Result<(), Error> {
    let _ = db;
    Ok(())
}

#[idempotent(consumer = "cfg-backend", key = id)]
async fn per_backend(
    #[cfg(target_pointer_width = "64")] db: &mut AsyncPgConnection,
    #[cfg(not(target_pointer_width = "64"))] db: &mut diesel_async::AsyncMysqlConnection,
    id: u64,
) -> Result<(), Error> {
    let _ = db;
    Ok(())
}

fn main() {
    let _ = (scratch, per_backend);
}
