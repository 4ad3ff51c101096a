//! Batch handlers take what a plain `async fn` takes: a `mut` batch the body sorts, a
//! `&mut [M]` batch beside a connection of another name, key closures in every form a
//! closure may have (`move`, typed, with a return type, with an early `return`, with a
//! loop of its own that it `break`s, borrowing a field, using the connection) and a
//! function's path.
#![deny(warnings)]

use diesel::result::Error;
use diesel_async::AsyncPgConnection;
use diesel_inbox::idempotent;

struct Msg {
    id: u64,
    name: String,
    legacy: bool,
}

impl Msg {
    fn key(&self) -> &str {
        &self.name
    }
}

#[idempotent(consumer = "sorted_batch", batch = msgs, key = |msg| msg.id)]
async fn sorted(conn: &mut AsyncPgConnection, mut msgs: Vec<Msg>) -> Result<Vec<u64>, Error> {
    let _ = conn;
    msgs.sort_by_key(|msg| msg.id);
    Ok(msgs.iter().map(|msg| msg.id).collect())
}

#[idempotent(consumer = "mutable_slice_batch", batch = msgs, key = |msg| msg.id)]
async fn mutable_slice(db: &mut AsyncPgConnection, msgs: &mut [Msg]) -> Result<usize, Error> {
    let _ = db;
    Ok(msgs.len())
}

#[idempotent(consumer = "move_key_batch", batch = msgs, key = move |msg| (prefix.as_str(), msg.id))]
async fn move_key(conn: &mut AsyncPgConnection, msgs: &[Msg], prefix: String) -> Result<(), Error> {
    let _ = (conn, msgs);
    Ok(())
}

#[idempotent(consumer = "typed_key_batch", batch = msgs, key = |msg: &Msg| -> u64 { msg.id })]
async fn typed_key(conn: &mut AsyncPgConnection, msgs: &[Msg]) -> Result<(), Error> {
    let _ = (conn, msgs);
    Ok(())
}

#[idempotent(consumer = "path_key_batch", batch = msgs, key = Msg::key)]
async fn path_key(conn: &mut AsyncPgConnection, msgs: &[Msg]) -> Result<(), Error> {
    let _ = (conn, msgs);
    Ok(())
}

#[idempotent(
    consumer = "early_return_key_batch",
    batch = msgs,
    key = |msg| {
        if msg.legacy {
            return msg.name.as_str();
        }
        "current"
    }
)]
async fn early_return_key(conn: &mut AsyncPgConnection, msgs: &[Msg]) -> Result<(), Error> {
    let _ = (conn, msgs);
    Ok(())
}

#[idempotent(consumer = "field_key_batch", batch = msgs, key = |msg| msg.name)]
async fn field_key(conn: &mut AsyncPgConnection, msgs: &[Msg]) -> Result<(), Error> {
    let _ = (conn, msgs);
    Ok(())
}

#[idempotent(
    consumer = "breaking_key_batch",
    batch = msgs,
    key = |msg| {
        let mut prefix = 0_u64;
        for character in msg.name.chars() {
            if character == '-' {
                break;
            }
            prefix += 1;
        }
        (prefix, msg.id)
    }
)]
async fn breaking_key(conn: &mut AsyncPgConnection, msgs: &[Msg]) -> Result<(), Error> {
    let _ = (conn, msgs);
    Ok(())
}

fn backend_name(_: &mut AsyncPgConnection) -> &'static str {
    "pg"
}

#[idempotent(consumer = "connection_key_batch", batch = msgs, key = |msg| (backend_name(conn), msg.id))]
async fn connection_key(conn: &mut AsyncPgConnection, msgs: &[Msg]) -> Result<(), Error> {
    let _ = (conn, msgs);
    Ok(())
}

/// The parameter is named inside the macro, `conn = $c` by its caller.
macro_rules! named_connection {
    ($c:ident) => {
        #[idempotent(consumer = "macro_conn", key = id, conn = $c)]
        async fn macro_conn(
            db: &mut AsyncPgConnection,
            _replica: &mut AsyncPgConnection,
            id: u64,
        ) -> Result<(), Error> {
            let _ = (db, id);
            Ok(())
        }
    };
}

named_connection!(db);

fn main() {
    let _ = (
        sorted,
        mutable_slice,
        move_key,
        typed_key,
        path_key,
        early_return_key,
        field_key,
        breaking_key,
        connection_key,
        macro_conn,
    );
}
