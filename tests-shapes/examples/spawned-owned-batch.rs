//! A batch taken by value (a `Vec`, an array, a `Box<[M]>` or `Box<Vec<M>>`) is the body's own: it gets
//! the new messages themselves, so its future is `Send` with messages that are not
//! `Sync` and can be spawned, as a plain `async fn`'s can. A batch of another type taken
//! by value (`Arc<[M]>`) is lent to the body as before.
#![deny(warnings)]

use std::cell::Cell;
use std::sync::Arc;

use diesel::result::Error;
use diesel_async::AsyncPgConnection;
use diesel_inbox::idempotent;

/// `Send`, not `Sync`.
struct Msg {
    id: u64,
    seen: Cell<bool>,
}

#[idempotent(consumer = "owned_vec", batch = msgs, key = |msg| msg.id)]
async fn owned_vec(conn: &mut AsyncPgConnection, mut msgs: Vec<Msg>) -> Result<Vec<u64>, Error> {
    msgs.sort_by_key(|msg| msg.id);
    let _ = &mut *conn;
    std::future::ready(()).await;
    Ok(msgs
        .into_iter()
        .inspect(|msg| msg.seen.set(true))
        .map(|msg| msg.id)
        .collect())
}

#[idempotent(consumer = "owned_array", batch = msgs, key = |msg| msg.id)]
async fn owned_array(conn: &mut AsyncPgConnection, msgs: [Msg; 2]) -> Result<usize, Error> {
    let _ = &mut *conn;
    std::future::ready(()).await;
    Ok(msgs.len())
}

#[idempotent(consumer = "owned_boxed", batch = msgs, key = |msg| msg.id)]
async fn owned_boxed(conn: &mut AsyncPgConnection, msgs: Box<[Msg]>) -> Result<usize, Error> {
    let _ = &mut *conn;
    std::future::ready(()).await;
    Ok(msgs.len())
}

#[idempotent(consumer = "owned_boxed_vec", batch = msgs, key = |msg| msg.id)]
// The shape under test: clippy would have a user unbox it.
#[allow(clippy::box_collection)]
async fn owned_boxed_vec(
    conn: &mut AsyncPgConnection,
    msgs: Box<Vec<Msg>>,
) -> Result<usize, Error> {
    let _ = &mut *conn;
    std::future::ready(()).await;
    Ok(msgs.len())
}

#[idempotent(consumer = "owned_generic", batch = msgs, key = |msg| msg.id())]
async fn owned_generic<M: Identified + Send>(
    conn: &mut AsyncPgConnection,
    msgs: std::vec::Vec<M>,
) -> Result<usize, Error> {
    let _ = &mut *conn;
    std::future::ready(()).await;
    Ok(msgs.len())
}

trait Identified {
    fn id(&self) -> u64;
}

impl Identified for Msg {
    fn id(&self) -> u64 {
        self.id
    }
}

#[idempotent(consumer = "lent_arc", batch = ids, key = |id| *id)]
async fn lent_arc(conn: &mut AsyncPgConnection, ids: Arc<[u64]>) -> Result<u64, Error> {
    let _ = &mut *conn;
    std::future::ready(()).await;
    Ok(ids.into_iter().sum())
}

fn spawned(mut conn: AsyncPgConnection) {
    let batch = || {
        vec![Msg {
            id: 1,
            seen: Cell::new(false),
        }]
    };
    let [first, second] = [1, 2].map(|id| Msg {
        id,
        seen: Cell::new(false),
    });
    tokio::spawn(async move {
        let _ = owned_vec(&mut conn, batch()).await?;
        let _ = owned_array(&mut conn, [first, second]).await?;
        let _ = owned_boxed(&mut conn, batch().into_boxed_slice()).await?;
        let _ = owned_boxed_vec(&mut conn, Box::new(batch())).await?;
        let _ = owned_generic(&mut conn, batch()).await?;
        lent_arc(&mut conn, Arc::from([1, 2])).await
    });
}

fn main() {
    let _ = spawned;
}
