//! A `&'a mut` parameter lends the body what a plain `async fn` would: the body returns
//! a borrow through it for `'a`, after the key and the fast path read it.
#![deny(warnings)]

use diesel::result::Error;
use diesel_async::AsyncPgConnection;
use diesel_inbox::{Outcome, idempotent};

struct Msg {
    id: u64,
    count: u64,
}

#[idempotent(consumer = "borrow_out", key = msg.id, fast_path = msg.count > 0)]
async fn bump<'a>(conn: &mut AsyncPgConnection, msg: &'a mut Msg) -> Result<&'a mut u64, Error> {
    let _ = conn;
    msg.count += 1;
    Ok(&mut msg.count)
}

#[idempotent(consumer = "borrow_out_reassigned", key = id)]
async fn reassigned<'a>(
    conn: &mut AsyncPgConnection,
    id: u64,
    mut current: &'a mut Msg,
    next: &'a mut Msg,
) -> Result<&'a mut Msg, Error> {
    let _ = conn;
    if current.id == id {
        current = next;
    }
    Ok(current)
}

async fn caller(conn: &mut AsyncPgConnection, msg: &mut Msg) {
    let count: Result<Outcome<&mut u64>, Error> = bump(conn, msg).await;
    if let Ok(Outcome::Processed(count)) = count {
        *count += 1;
    }
}

fn main() {
    let _ = (caller, reassigned);
}
