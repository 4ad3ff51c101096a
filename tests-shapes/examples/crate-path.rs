//! `crate = …` routes every path of the expansion through a renamed dependency or a
//! facade's re-export, written as a path or, as serde and tokio accept, a string.
#![deny(warnings)]

// What `inbox = { package = "diesel-inbox" }` in Cargo.toml gives: `::inbox`.
extern crate diesel_inbox as inbox;

use diesel::result::Error;
use diesel_async::AsyncPgConnection;

/// A crate that re-exports diesel-inbox for its users.
mod facade {
    pub use diesel_inbox as inbox;
}

#[inbox::idempotent(consumer = "renamed", key = id, crate = ::inbox)]
async fn renamed(conn: &mut AsyncPgConnection, id: u64) -> Result<u64, Error> {
    let _ = conn;
    Ok(id)
}

#[facade::inbox::idempotent(consumer = "facade", key = id, crate = crate::facade::inbox)]
async fn through_facade(conn: &mut AsyncPgConnection, id: u64) -> Result<(), Error> {
    let _ = (conn, id);
    Ok(())
}

#[facade::inbox::idempotent(consumer = "facade-string", key = id, crate = "facade::inbox")]
async fn string_form(conn: &mut AsyncPgConnection, id: u64) -> Result<(), Error> {
    let _ = (conn, id);
    Ok(())
}

async fn callers(conn: &mut AsyncPgConnection) {
    let _: Result<inbox::Outcome<u64>, Error> = renamed(conn, 1).await;
    let _: Result<facade::inbox::Outcome<()>, Error> = through_facade(conn, 1).await;
    let _: Result<inbox::Outcome<()>, Error> = string_form(conn, 1).await;
}

fn main() {
    let _ = callers;
}
