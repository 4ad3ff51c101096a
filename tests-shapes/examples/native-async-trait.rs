//! A handler can implement a native `async fn` trait method whose declared output is the
//! rewritten `Result<Outcome<T>, E>`.
#![deny(warnings)]

use std::future::Future;

use diesel::result::Error;
use diesel_async::AsyncPgConnection;
use diesel_inbox::{Outcome, idempotent};

trait Handler {
    fn handle(
        &self,
        conn: &mut AsyncPgConnection,
        id: u64,
    ) -> impl Future<Output = Result<Outcome<()>, Error>> + Send;
}

struct Credit;

impl Handler for Credit {
    #[idempotent(consumer = "trait-credit", key = id)]
    async fn handle(&self, conn: &mut AsyncPgConnection, id: u64) -> Result<(), Error> {
        let _ = conn;
        Ok(())
    }
}

fn main() {
    let _ = <Credit as Handler>::handle;
}
