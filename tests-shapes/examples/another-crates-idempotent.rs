//! Another crate's attribute that happens to be named `idempotent`, below ours, is none of
//! ours: it stays on the handler and applies after ours. Here it is tokio's `main`, which
//! turns the rewritten handler into a blocking function.
#![deny(warnings)]

use diesel_async::AsyncPgConnection;
use diesel_inbox::{Outcome, idempotent};

mod other_attrs {
    pub(crate) use tokio::main as idempotent;
}

#[idempotent(consumer = "below_another", key = id)]
#[other_attrs::idempotent(flavor = "current_thread")]
async fn blocking(conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    let _ = (conn, id);
    Ok(())
}

fn caller(conn: &mut AsyncPgConnection) {
    let _: Result<Outcome<()>, diesel::result::Error> = blocking(conn, 1);
}

fn main() {
    let _ = caller;
}
