//! What the broker crates' suites (`brokers/lapin`, `brokers/nats`, `brokers/kafka`)
//! share: the service URLs, a PostgreSQL schema with the outbox, a handler that
//! enqueues one message, relay settings that keep the tests short, and what they ask
//! of the outbox, and a TCP proxy to cut a server off ([`Proxy`]). Not published.

mod proxy;

use std::time::Duration;

use diesel::result::Error;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use diesel_inbox::outbox::{self, OutboxMessage, Outgoing, RelaySettings};
use diesel_inbox::testing::{TestDatabase, select_i64};
use diesel_inbox::{InboxBackend, Outcome, idempotent};

pub use proxy::Proxy;

/// The URL in `variable`; the suite is skipped without it, except under CI (`CI` set),
/// where it fails.
pub fn server_url(variable: &str) -> Option<String> {
    let url = std::env::var(variable).ok().filter(|url| !url.is_empty());
    if url.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{variable} is not set, and CI runs every suite"
        );
        eprintln!("SKIPPED: {variable} is not set");
    }
    url
}

/// A PostgreSQL schema named `name`, with the outbox migrated, or `None` without
/// `POSTGRES_URL`.
pub async fn outbox_database(name: &str) -> Option<TestDatabase<AsyncPgConnection>> {
    let url = server_url("POSTGRES_URL")?;
    let db = TestDatabase::postgres(&url, name)
        .await
        .expect("test schema");
    let mut conn = db.connect().await.expect("connect");
    outbox::migrate(&mut conn)
        .await
        .expect("migrate the outbox");
    Some(db)
}

/// Enqueues `message` for the delivery `key`, then fails if told to, which must roll
/// the message back with the marker.
#[idempotent(consumer = "broker-outbox", key = key)]
pub async fn announce<C>(
    conn: &mut C,
    key: &str,
    message: OutboxMessage,
    fail: bool,
) -> Result<String, Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let id = outbox::enqueue(conn, message).await?;
    if fail {
        return Err(Error::RollbackTransaction);
    }
    Ok(id)
}

/// Polls often, retries soon, and gives up on a publish after 2 s (a third of the
/// lease), so that the tests wait little, also while a broker is away.
pub fn eager() -> RelaySettings {
    RelaySettings::new()
        .with_poll_interval(Duration::from_millis(20))
        .with_backoff(Duration::from_millis(50), Duration::from_millis(300))
        .with_lease(Duration::from_secs(6))
}

/// Announces `count` messages, `message(n)` for delivery `m-{n}`, failing every fourth
/// handler so that its message rolls back; the ids of those that committed.
pub async fn announce_each(
    conn: &mut AsyncPgConnection,
    count: usize,
    message: impl Fn(usize) -> OutboxMessage,
) -> Vec<String> {
    let mut committed = Vec::new();
    for n in 0..count {
        let fail = n % 4 == 3;
        match announce(conn, &format!("m-{n}"), message(n), fail).await {
            Ok(Outcome::Processed(id)) => committed.push(id),
            Err(_) if fail => {}
            other => panic!("delivery m-{n}: {other:?}"),
        }
    }
    committed
}

/// How many messages are not sent yet, parked ones included.
pub async fn unsent(conn: &mut AsyncPgConnection) -> i64 {
    select_i64(
        conn,
        "SELECT COUNT(*) FROM inbox_outbox WHERE sent_at IS NULL",
    )
    .await
    .expect("count unsent")
}

/// Returns once the relay has marked every message sent; panics after 60 s.
pub async fn wait_until_sent(conn: &mut AsyncPgConnection) {
    let drained = async {
        while unsent(conn).await > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), drained)
        .await
        .expect("the relay marks every message sent within 60 s");
}

/// The parked messages, once there are `count` of them; panics after 30 s.
pub async fn parked_once(conn: &mut AsyncPgConnection, count: usize) -> Vec<Outgoing> {
    let all_parked = async {
        loop {
            let parked = outbox::parked(conn, 0, count + 1)
                .await
                .expect("list the parked");
            if parked.len() >= count {
                return parked;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), all_parked)
        .await
        .unwrap_or_else(|_| panic!("{count} messages parked within 30 s"))
}
