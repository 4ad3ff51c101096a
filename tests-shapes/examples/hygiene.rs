//! The expansion names everything absolutely: shadowing prelude and crate names breaks
//! nothing, and the strict lints stay quiet.
#![deny(unused_qualifications, missing_docs, unsafe_code, warnings)]

use diesel_async::AsyncPgConnection;

/// Shadows `Result`.
pub struct Result;
/// Shadows `Ok`, `Err` and `Option`.
pub enum Shadows {
    /// Shadow.
    Ok,
    /// Shadow.
    Err,
    /// Shadow.
    Option,
}
pub use Shadows::{Err, Ok, Option};
/// Shadows `diesel`.
pub mod diesel {}
/// Shadows `Outcome`.
pub struct Outcome;

/// A message.
pub struct Msg {
    /// Its id.
    pub id: u64,
}

/// A handler.
#[diesel_inbox::idempotent(consumer = "hygiene", key = msg.id)]
pub async fn handle(
    conn: &mut AsyncPgConnection,
    msg: &Msg,
) -> ::core::result::Result<u64, ::diesel::result::Error> {
    let _ = conn;
    ::core::result::Result::Ok(msg.id)
}

fn main() {}
