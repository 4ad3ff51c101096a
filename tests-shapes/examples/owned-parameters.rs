//! The body owns its parameters as the plain function would: it assigns to them and
//! their fields, moves them, and reads parameters that are `Send` but not `Sync`, while
//! the handler's future stays `Send`. Receivers, tuple patterns and `#[cfg]`'d
//! parameters too. No warnings.
#![deny(warnings)]

use std::cell::Cell;

use diesel::result::Error;
use diesel_async::AsyncPgConnection;
use diesel_inbox::idempotent;

struct Delivery {
    id: u64,
    acked: bool,
}

impl Drop for Delivery {
    fn drop(&mut self) {
        assert!(self.acked);
    }
}

/// `Send` but not `Sync`.
struct Counter(Cell<u64>);

#[idempotent(consumer = "owned-write", key = d.id)]
async fn write(
    conn: &mut AsyncPgConnection,
    mut d: Delivery,
    counter: Counter,
) -> Result<u64, Error> {
    let _ = &mut *conn;
    d.acked = true;
    std::future::ready(()).await;
    Ok(counter.0.get())
}

#[idempotent(consumer = "owned-move", key = id)]
async fn moved(
    conn: &mut AsyncPgConnection,
    id: u64,
    note: String,
    (left, mut right): (u8, Vec<u8>),
) -> Result<String, Error> {
    let _ = conn;
    right.push(left);
    std::future::ready(()).await;
    Ok(format!("{id}{note}{}", right.len()))
}

/// A parameter compiled out is not borrowed either.
#[idempotent(consumer = "owned-cfg", key = id)]
async fn configured(
    conn: &mut AsyncPgConnection,
    id: u64,
    #[cfg(any())] gone: String,
) -> Result<u64, Error> {
    let _ = conn;
    #[cfg(any())]
    drop(gone);
    Ok(id)
}

struct Service {
    seen: Counter,
}

impl Service {
    #[idempotent(consumer = "owned-mut-self", key = id)]
    async fn by_mut(&mut self, conn: &mut AsyncPgConnection, id: u64) -> Result<u64, Error> {
        let _ = conn;
        std::future::ready(()).await;
        Ok(self.seen.0.get() + id)
    }

    #[idempotent(consumer = "owned-self", key = id)]
    async fn by_value(self, conn: &mut AsyncPgConnection, id: u64) -> Result<Counter, Error> {
        let _ = (conn, id);
        std::future::ready(()).await;
        Ok(self.seen)
    }
}

fn spawn_all(
    mut a: AsyncPgConnection,
    mut b: AsyncPgConnection,
    mut c: AsyncPgConnection,
    mut d: AsyncPgConnection,
) {
    tokio::spawn(async move {
        write(
            &mut a,
            Delivery {
                id: 1,
                acked: false,
            },
            Counter(Cell::new(0)),
        )
        .await
    });
    tokio::spawn(async move { moved(&mut b, 1, String::new(), (1, Vec::new())).await });
    tokio::spawn(async move {
        let mut service = Service {
            seen: Counter(Cell::new(0)),
        };
        service.by_mut(&mut c, 1).await.map(|_| ())
    });
    tokio::spawn(async move {
        let service = Service {
            seen: Counter(Cell::new(0)),
        };
        service.by_value(&mut d, 1).await.map(|_| ())
    });
}

fn main() {
    let _ = (spawn_all, configured);
}
