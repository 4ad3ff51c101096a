//! Batch handlers: a slice, a `Vec` or an array of messages, a key closure that borrows
//! (no `.clone()`), a body that reads as `for msg in msgs`, and a future that is `Send`,
//! so a batch pump can run in `tokio::spawn`. Generated names stay out of the way of the
//! user's own `Result`, `Ok` and `Vec`.
#![deny(warnings)]

use diesel::result::Error;
use diesel::sqlite::SqliteConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, AsyncMysqlConnection, AsyncPgConnection};
use diesel_inbox::{BatchOutcome, InboxBackend, idempotent};

#[derive(Clone)]
struct Msg {
    id: String,
    amount: i64,
}

#[idempotent(consumer = "pg_batch", batch = msgs, key = |msg| msg.id)]
async fn pg(conn: &mut AsyncPgConnection, msgs: &[Msg]) -> Result<i64, Error> {
    let _ = conn;
    let mut total = 0;
    for msg in msgs {
        total += msg.amount;
    }
    Ok(total)
}

#[idempotent(consumer = "mysql_batch", batch = msgs, key = |msg: &Msg| msg.id.as_str())]
async fn mysql(conn: &mut AsyncMysqlConnection, msgs: Vec<Msg>, tag: &str) -> Result<usize, Error> {
    let _ = (conn, tag);
    Ok(msgs.len())
}

#[idempotent(consumer = "sqlite_batch", batch = msgs, key = |(id, _)| *id)]
async fn sqlite(
    conn: &mut SyncConnectionWrapper<SqliteConnection>,
    msgs: [(u64, i64); 3],
) -> Result<(), Error> {
    let _ = conn;
    for (_, amount) in msgs {
        let _ = amount;
    }
    Ok(())
}

/// Generic over the connection, as a library of handlers is.
#[idempotent(consumer = "generic_batch", batch = msgs, key = |msg| msg.id)]
async fn generic<C>(conn: &mut C, msgs: &Vec<Msg>) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let _ = (conn, msgs);
    Ok(())
}

mod hygiene {
    #![allow(dead_code)]
    struct Result;
    struct Ok;
    struct Vec;
    struct Some;
    mod diesel_inbox {}

    #[::diesel_inbox::idempotent(consumer = "hygiene_batch", batch = msgs, key = |msg| msg.id)]
    async fn shadowed(
        conn: &mut ::diesel_async::AsyncPgConnection,
        msgs: &[super::Msg],
    ) -> ::core::result::Result<(), ::diesel::result::Error> {
        let _ = (conn, msgs);
        ::core::result::Result::Ok(())
    }
}

fn spawn_all(
    mut pg_conn: AsyncPgConnection,
    mut mysql_conn: AsyncMysqlConnection,
    mut sqlite_conn: SyncConnectionWrapper<SqliteConnection>,
    msgs: std::vec::Vec<Msg>,
) {
    let for_pg = msgs.clone();
    tokio::spawn(async move {
        let outcome: BatchOutcome<i64> = pg(&mut pg_conn, &for_pg).await?;
        let _ = outcome.outcomes();
        Ok::<_, Error>(())
    });
    tokio::spawn(async move { mysql(&mut mysql_conn, msgs, "t").await });
    tokio::spawn(async move { sqlite(&mut sqlite_conn, [(1, 1), (2, 2), (3, 3)]).await });
}

fn main() {
    let _ = spawn_all;
    let _ = generic::<AsyncPgConnection>;
}
