//! A batch body may return borrows of its messages, as a plain `async fn` taking
//! `msgs: &'a [Msg]` may: when the return type names the batch's lifetime, the body's
//! messages are borrowed for that lifetime. Over a `'static` batch such a handler's
//! future can be spawned, as the plain function's can.
#![deny(warnings)]

use diesel::result::Error;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use diesel_inbox::{InboxBackend, idempotent};

struct Msg {
    id: u64,
    name: String,
}

#[idempotent(consumer = "lending_names", batch = msgs, key = |msg| msg.id)]
async fn names<'a>(conn: &mut AsyncPgConnection, msgs: &'a [Msg]) -> Result<Vec<&'a str>, Error> {
    let _ = conn;
    Ok(msgs.iter().map(|msg| msg.name.as_str()).collect())
}

#[idempotent(consumer = "lending_first", batch = msgs, key = |msg| msg.id)]
async fn first<'a, C>(conn: &mut C, msgs: &'a Vec<Msg>) -> Result<Option<&'a Msg>, Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let _ = conn;
    Ok(msgs.into_iter().next())
}

#[idempotent(consumer = "lending_mut", batch = msgs, key = |msg| msg.id)]
async fn longest<'m>(
    db: &mut AsyncPgConnection,
    msgs: &'m mut [Msg],
) -> Result<Option<&'m String>, Error> {
    let _ = db;
    Ok(msgs
        .into_iter()
        .map(|msg| &msg.name)
        .max_by_key(|name| name.len()))
}

struct Directory {
    prefix: String,
}

impl Directory {
    #[idempotent(consumer = "lending_method", batch = msgs, key = |msg| msg.id)]
    async fn prefixed<'a>(
        &self,
        conn: &mut AsyncPgConnection,
        msgs: &'a [Msg],
    ) -> Result<Vec<(&'a str, usize)>, Error> {
        let _ = conn;
        Ok(msgs
            .into_iter()
            .map(|msg| (msg.name.as_str(), self.prefix.len()))
            .collect())
    }
}

/// Awaited where the batch lives, the values borrow from it.
async fn deliver(conn: &mut AsyncPgConnection, batch: &[Msg]) -> Result<usize, Error> {
    let outcome = names(conn, batch).await?;
    Ok(outcome.value().map_or(0, Vec::len))
}

/// Spawned over a batch that lives as long as the program.
fn spawned(mut conn: AsyncPgConnection, batch: &'static [Msg]) {
    tokio::spawn(async move {
        let outcome = names(&mut conn, batch).await?;
        Ok::<_, Error>(outcome.into_value().unwrap_or_default())
    });
}

fn main() {
    let _ = (
        first::<AsyncPgConnection>,
        longest,
        Directory::prefixed,
        deliver,
        spawned,
    );
}
