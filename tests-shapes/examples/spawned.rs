//! A handler's future is `Send` when its body's is, so it can run in `tokio::spawn`.
#![deny(warnings)]

use diesel::result::Error;
use diesel::sqlite::SqliteConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncMysqlConnection, AsyncPgConnection};
use diesel_inbox::idempotent;

struct Msg {
    id: String,
}

#[idempotent(consumer = "pg", key = msg.id.as_str())]
async fn pg(conn: &mut AsyncPgConnection, msg: &Msg) -> Result<(), Error> {
    let _ = conn;
    Ok(())
}

#[idempotent(consumer = "mysql", key = msg.id)]
async fn mysql(conn: &mut AsyncMysqlConnection, msg: Msg) -> Result<(), Error> {
    let _ = conn;
    Ok(())
}

#[idempotent(consumer = "sqlite", key = &msg.id)]
async fn sqlite(
    conn: &mut SyncConnectionWrapper<SqliteConnection>,
    msg: &Msg,
) -> Result<(), Error> {
    let _ = conn;
    Ok(())
}

fn spawn_all(
    mut pg_conn: AsyncPgConnection,
    mut mysql_conn: AsyncMysqlConnection,
    mut sqlite_conn: SyncConnectionWrapper<SqliteConnection>,
) {
    tokio::spawn(async move { pg(&mut pg_conn, &Msg { id: "a".into() }).await });
    tokio::spawn(async move { mysql(&mut mysql_conn, Msg { id: "b".into() }).await });
    tokio::spawn(async move { sqlite(&mut sqlite_conn, &Msg { id: "c".into() }).await });
}

fn main() {
    let _ = spawn_all;
}
