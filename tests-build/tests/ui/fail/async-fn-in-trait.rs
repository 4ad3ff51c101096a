//! `async_fn_in_trait` on a handler that is a public trait's default method, one that a
//! `Self: Sized` bound lets past the default-method check (`trait-default-method.rs`).
//! rustc's suggestion reads as for the plain `async fn`, quoting the declared return
//! type and the body's braces (the parentheses around the rewritten return type, which
//! keep `where Self: Sized` from being suggested to that check, stand at the attribute).
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
