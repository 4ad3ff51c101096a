//! Methods, generic connections, `impl Trait` and pattern parameters, `where` clauses,
//! tuple keys and preserved attributes.
#![deny(warnings)]

use diesel::result::Error;
use diesel_async::{AsyncConnection, AsyncMysqlConnection, AsyncPgConnection};
use diesel_inbox::{InboxBackend, Outcome, idempotent};

struct Consumer {
    offset_base: i64,
}

impl Consumer {
    #[idempotent(consumer = "method", key = msg)]
    async fn on_message(&self, conn: &mut AsyncPgConnection, msg: &str) -> Result<i64, Error> {
        let _ = conn;
        Ok(self.offset_base + msg.len() as i64)
    }
}

/// Doc comments and other attributes stay on the handler.
#[idempotent(consumer = "generic", key = id, fast_path = false)]
#[allow(clippy::needless_pass_by_value)]
async fn generic<C>(conn: &mut C, id: uuid::Uuid) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let _ = conn;
    Ok(())
}

#[idempotent(consumer = "kafka/orders:v1", key = (topic.as_ref(), partition, offset))]
async fn tuple_key(
    db: &mut AsyncMysqlConnection,
    topic: impl AsRef<str> + Send,
    (partition, offset): (i32, i64),
) -> Result<String, Error> {
    let _ = db;
    Ok(format!("{}:{partition}:{offset}", topic.as_ref()))
}

#[idempotent(consumer = "named-conn", key = key, conn = primary, fast_path = redelivered)]
async fn named_connection(
    primary: &mut AsyncPgConnection,
    _replica: &mut AsyncPgConnection,
    key: String,
    redelivered: bool,
) -> Result<(), Error> {
    let _ = primary;
    Ok(())
}

async fn callers(
    pg: &mut AsyncPgConnection,
    my: &mut AsyncMysqlConnection,
    other: &mut AsyncPgConnection,
) {
    let consumer = Consumer { offset_base: 1 };
    let _: Result<Outcome<i64>, Error> = consumer.on_message(pg, "m").await;
    let _: Result<Outcome<()>, Error> = generic(pg, uuid::Uuid::nil()).await;
    let _: Result<Outcome<String>, Error> = tuple_key(my, "orders", (3, 42)).await;
    let _: Result<Outcome<()>, Error> = named_connection(pg, other, String::from("k"), true).await;
}

fn main() {
    let _ = callers;
}
