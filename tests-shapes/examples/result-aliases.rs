//! Aliases of `Result` work as return types: the attribute reads `T` and `E` through
//! the alias, and the handler returns `Result<Outcome<T>, E>`.
#![deny(warnings)]

use diesel::QueryResult;
use diesel_async::AsyncPgConnection;
use diesel_inbox::{Outcome, idempotent};

#[idempotent(consumer = "alias-diesel", key = id)]
async fn diesel_alias(conn: &mut AsyncPgConnection, id: u64) -> QueryResult<u64> {
    let _ = conn;
    Ok(id)
}

#[idempotent(consumer = "alias-anyhow", key = id)]
async fn anyhow_alias(conn: &mut AsyncPgConnection, id: u64) -> anyhow::Result<()> {
    let _ = conn;
    anyhow::ensure!(id > 0, "id 0 is reserved");
    Ok(())
}

async fn callers(conn: &mut AsyncPgConnection) {
    let _: Result<Outcome<u64>, diesel::result::Error> = diesel_alias(conn, 1).await;
    let _: Result<Outcome<()>, anyhow::Error> = anyhow_alias(conn, 1).await;
}

fn main() {
    let _ = callers;
}
