//! `async_fn_in_trait` on a handler that is a public trait's default method, one that a
//! `Self: Sized` bound lets past the default-method check (`trait-default-method.rs`).
//! A known wart, kept on record: rustc's suggestion quotes the attribute where the return
//! type and the body's braces would be, since those stand at the attribute (at the
//! user's tokens rustc would answer the default-method check with `where Self: Sized`).
//! On a trait's declaration the attribute's own error comes first, and an impl's method
//! is not linted.
#![deny(async_fn_in_trait)]

use diesel_async::AsyncPgConnection;

pub trait Projector: Sized {
    #[diesel_inbox::idempotent(consumer = "project", key = id)]
    async fn project(&self, conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
        let _ = (conn, id);
        Ok(())
    }
}

fn main() {}
