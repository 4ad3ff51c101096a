//! `-> Result<impl Trait, E>` works as in a plain `async fn`: the handler returns
//! `Result<Outcome<impl Trait>, E>`.
#![deny(warnings)]

use std::fmt::Display;

use diesel::result::Error;
use diesel_async::AsyncPgConnection;
use diesel_inbox::{Outcome, idempotent};

#[idempotent(consumer = "impl-display", key = id)]
async fn shown(conn: &mut AsyncPgConnection, id: u64) -> Result<impl Display, Error> {
    let _ = conn;
    Ok(id + 1)
}

async fn caller(conn: &mut AsyncPgConnection) -> Option<String> {
    match shown(conn, 1).await {
        Ok(Outcome::Processed(value)) => Some(value.to_string()),
        Ok(Outcome::Duplicate | Outcome::InProgress { .. }) | Err(_) => None,
    }
}

fn main() {
    let _ = caller;
}
