//! The body is checked against the declared return type, as a plain `async fn`'s is, so
//! the usual coercions apply inside it: to a trait object, from `&String` to `&str`,
//! and of an error into a boxed one.
#![deny(warnings)]

use std::error::Error as StdError;
use std::fmt::Display;

use diesel::result::Error;
use diesel_async::AsyncPgConnection;
use diesel_inbox::{Outcome, idempotent};

type BoxError = Box<dyn StdError + Send + Sync>;

struct Named {
    name: String,
}

impl Named {
    #[idempotent(consumer = "coerce-ref", key = id)]
    async fn name(&self, conn: &mut AsyncPgConnection, id: u64) -> Result<&str, Error> {
        let _ = (conn, id);
        Ok(&self.name)
    }
}

#[idempotent(consumer = "coerce-dyn", key = id)]
async fn boxed(conn: &mut AsyncPgConnection, id: u64) -> Result<Box<dyn Display + Send>, Error> {
    let _ = conn;
    Ok(Box::new(id))
}

#[idempotent(consumer = "coerce-error", key = id)]
async fn boxed_error(conn: &mut AsyncPgConnection, id: u64) -> Result<(), BoxError> {
    let _ = conn;
    if id == 0 {
        let e = std::fmt::Error;
        return Err(Box::new(e));
    }
    let e = std::io::Error::other("odd");
    Err(Box::new(e))
}

async fn callers(conn: &mut AsyncPgConnection) {
    let named = Named {
        name: String::from("n"),
    };
    let _: Result<Outcome<&str>, Error> = named.name(conn, 1).await;
    let _: Result<Outcome<Box<dyn Display + Send>>, Error> = boxed(conn, 1).await;
    let _: Result<Outcome<()>, BoxError> = boxed_error(conn, 1).await;
}

fn main() {
    let _ = callers;
}
