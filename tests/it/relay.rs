//! The outbox relay's own contract, apart from any broker: a round under way settles
//! what it took before the relay stops, a failed publish is retried and an
//! unpublishable one parked, and stopping never waits for a connection. The brokers'
//! publishers are tested against the real brokers in their crates.

use std::sync::Mutex;
use std::time::Duration;

use diesel::sqlite::SqliteConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_inbox::outbox::{
    self, OutboxMessage, Outgoing, PublishError, Publisher, Relay, RelaySettings,
};
use diesel_inbox::testing::{TestDatabase, TestDatabaseError, select_i64};

type Conn = SyncConnectionWrapper<SqliteConnection>;
type Connecting =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Conn, TestDatabaseError>> + Send>>;

/// A broker that takes `delay` to confirm, refuses payloads starting with `refuse`
/// once, and can never take those starting with `never`. Once each too, its client
/// panics on payloads starting with `panic`, and fails those starting with `nul` with a
/// NUL in its error's text, those starting with `long` with 70,000 characters of text,
/// and those starting with `forever` asking to be tried again in `Duration::MAX`.
#[derive(Default)]
struct Recorder {
    delay: Duration,
    published: Mutex<Vec<String>>,
    refused: Mutex<Vec<String>>,
}

impl Publisher for &'static Recorder {
    async fn publish(&self, message: &Outgoing) -> Result<(), PublishError> {
        tokio::time::sleep(self.delay).await;
        let payload = String::from_utf8_lossy(message.payload()).into_owned();
        if payload.starts_with("never") {
            return Err(PublishError::unpublishable("no such destination"));
        }
        let once = ["refuse", "panic", "nul", "long", "forever"]
            .into_iter()
            .find(|prefix| payload.starts_with(prefix));
        if let Some(prefix) = once {
            let mut refused = self.refused.lock().unwrap();
            if !refused.contains(&payload) {
                refused.push(payload);
                drop(refused);
                return Err(match prefix {
                    "panic" => panic!("the client's invariant broke"),
                    "nul" => PublishError::retryable("bad\0frame"),
                    "long" => PublishError::retryable("x".repeat(70_000)),
                    "forever" => PublishError::retryable("later").retry_after(Duration::MAX),
                    _ => PublishError::retryable("the broker is busy"),
                });
            }
        }
        self.published.lock().unwrap().push(payload);
        Ok(())
    }
}

async fn outbox_with(test: &str, payloads: &[&str]) -> (TestDatabase<Conn>, Conn) {
    let db = TestDatabase::<Conn>::sqlite(test).await.unwrap();
    let mut conn = db.connect().await.unwrap();
    outbox::migrate(&mut conn).await.unwrap();
    for payload in payloads {
        outbox::enqueue(&mut conn, OutboxMessage::new("d", payload.as_bytes()))
            .await
            .unwrap();
    }
    (db, conn)
}

async fn count(conn: &mut Conn, sql: &str) -> i64 {
    select_i64(conn, sql).await.unwrap()
}

fn eager() -> RelaySettings {
    RelaySettings::new()
        .with_poll_interval(Duration::from_millis(10))
        .with_backoff(Duration::from_millis(20), Duration::from_millis(50))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_what_may_pass_and_parks_what_never_will() {
    let (db, mut conn) = outbox_with("relay_settles", &["a", "refuse-b", "never-c", "d"]).await;
    let recorder: &'static Recorder = Box::leak(Box::default());
    let relay = Relay::spawn(db.clone(), recorder, eager());
    tokio::time::timeout(Duration::from_secs(10), async {
        while count(
            &mut conn,
            "SELECT COUNT(*) FROM inbox_outbox WHERE sent_at IS NULL AND parked = 0",
        )
        .await
            > 0
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("every message is sent or parked");
    relay.shut_down().await;

    let mut published = recorder.published.lock().unwrap().clone();
    published.sort();
    assert_eq!(published, ["a", "d", "refuse-b"]);
    let parked = outbox::parked(&mut conn, 0, 10).await.unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].payload(), b"never-c");
    assert_eq!(parked[0].last_error(), Some("no such destination"));
    drop(conn);
    db.cleanup().await.unwrap();
}

/// A publisher that panics, or fails with an error text or a delay that the database
/// could not store, costs its own message a retry and nothing else: the panic ended the
/// relay's task, and the refused text or delay failed the whole round, whose messages,
/// published already, were then neither sent nor settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_publish_failures_hold_back_nothing_else() {
    let payloads = ["a", "panic-b", "nul-c", "long-d", "forever-e", "f"];
    let (db, mut conn) = outbox_with("relay_odd_failures", &payloads).await;
    let recorder: &'static Recorder = Box::leak(Box::default());
    let relay = Relay::spawn(db.clone(), recorder, eager());
    tokio::time::timeout(Duration::from_secs(10), async {
        while count(
            &mut conn,
            "SELECT COUNT(*) FROM inbox_outbox WHERE sent_at IS NOT NULL",
        )
        .await
            < 5
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("every message but the one retried in a century is sent");
    relay.shut_down().await;

    let mut published = recorder.published.lock().unwrap().clone();
    published.sort();
    assert_eq!(published, ["a", "f", "long-d", "nul-c", "panic-b"]);
    let waiting = "SELECT COUNT(*) FROM inbox_outbox WHERE sent_at IS NULL AND parked = 0";
    assert_eq!(count(&mut conn, waiting).await, 1, "forever-e waits");
    drop(conn);
    db.cleanup().await.unwrap();
}

/// With the `metrics` feature the relay counts each message it settles by outcome, a
/// message retried and then sent in both, and records how long each publish took.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn the_relay_counts_what_it_settles() {
    use std::collections::HashMap;

    use diesel_inbox::metrics::{OUTBOX_MESSAGES, OUTBOX_PUBLISH_DURATION};
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let (db, mut conn) = outbox_with("relay_metrics", &["a", "refuse-b", "never-c", "d"]).await;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // The test's runtime has one thread, which the relay's task runs on too.
    let guard = metrics::set_default_local_recorder(&recorder);
    let broker: &'static Recorder = Box::leak(Box::default());
    let relay = Relay::spawn(db.clone(), broker, eager());
    tokio::time::timeout(Duration::from_secs(10), async {
        let unsettled = "SELECT COUNT(*) FROM inbox_outbox WHERE sent_at IS NULL AND parked = 0";
        while count(&mut conn, unsettled).await > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("every message is sent or parked");
    relay.shut_down().await;
    drop(guard);

    let mut settled = HashMap::new();
    let mut publishes = HashMap::new();
    for (key, _unit, description, value) in snapshotter.snapshot().into_vec() {
        assert!(description.is_some(), "{key:?} is described");
        let labels: Vec<_> = key.key().labels().collect();
        assert_eq!(labels.len(), 1, "the outcome only: {labels:?}");
        let outcome = labels[0].value().to_owned();
        match (key.key().name(), value) {
            (OUTBOX_MESSAGES, DebugValue::Counter(count)) => {
                settled.insert(outcome, count);
            }
            (OUTBOX_PUBLISH_DURATION, DebugValue::Histogram(values)) => {
                publishes.insert(outcome, values.len());
            }
            other => panic!("unexpected metric {other:?}"),
        }
    }
    let expected = |pairs: &[(&str, u64)]| -> HashMap<String, u64> {
        pairs
            .iter()
            .map(|(outcome, count)| ((*outcome).to_owned(), *count))
            .collect()
    };
    settled.retain(|_, count| *count > 0);
    assert_eq!(
        settled,
        expected(&[("sent", 3), ("retried", 1), ("parked", 1)])
    );
    let publishes: HashMap<String, u64> = publishes
        .into_iter()
        .map(|(outcome, count)| (outcome, count as u64))
        .collect();
    assert_eq!(publishes, expected(&[("confirmed", 3), ("failed", 2)]));
    drop(conn);
    db.cleanup().await.unwrap();
}

/// Shutting down in the middle of a publish lets it finish and be marked sent, rather
/// than leaving it leased for another relay to publish again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_under_way_is_settled_before_the_relay_stops() {
    let (db, mut conn) = outbox_with("relay_stops", &["slow"]).await;
    let recorder: &'static Recorder = Box::leak(Box::new(Recorder {
        delay: Duration::from_millis(500),
        ..Recorder::default()
    }));
    let relay = Relay::spawn(db.clone(), recorder, eager());
    tokio::time::sleep(Duration::from_millis(200)).await;
    relay.shut_down().await;
    assert_eq!(*recorder.published.lock().unwrap(), ["slow"]);
    assert_eq!(
        count(
            &mut conn,
            "SELECT COUNT(*) FROM inbox_outbox WHERE sent_at IS NULL"
        )
        .await,
        0
    );
    drop(conn);
    db.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutting_down_does_not_wait_for_a_connection() {
    let never_connects = || -> Connecting { Box::pin(std::future::pending()) };
    let recorder: &'static Recorder = Box::leak(Box::default());
    let relay = Relay::spawn(never_connects, recorder, eager());
    tokio::time::sleep(Duration::from_millis(100)).await;
    tokio::time::timeout(Duration::from_secs(5), relay.shut_down())
        .await
        .expect("stops while waiting for a connection");
}

/// A relay polling once an hour publishes a message committed after its first round
/// only when woken; a wake while it is busy is kept for when it is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_relay_looks_at_once() {
    let (db, mut conn) = outbox_with("relay_woken", &["first"]).await;
    let recorder: &'static Recorder = Box::leak(Box::new(Recorder {
        delay: Duration::from_millis(200),
        ..Recorder::default()
    }));
    let settings = RelaySettings::new().with_poll_interval(Duration::from_secs(3_600));
    let relay = Relay::spawn(db.clone(), recorder, settings);
    let waker = relay.waker();
    let published = async |expected: usize| {
        tokio::time::timeout(Duration::from_secs(10), async {
            while recorder.published.lock().unwrap().len() < expected {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{expected} published"));
    };
    // Woken while the first round publishes: the wake waits for the round's end.
    tokio::time::sleep(Duration::from_millis(50)).await;
    outbox::enqueue(&mut conn, OutboxMessage::new("d", "second"))
        .await
        .unwrap();
    waker.wake();
    published(2).await;
    // Woken while it waits for its next poll.
    outbox::enqueue(&mut conn, OutboxMessage::new("d", "third"))
        .await
        .unwrap();
    waker.wake();
    published(3).await;
    relay.shut_down().await;
    assert_eq!(
        *recorder.published.lock().unwrap(),
        ["first", "second", "third"]
    );
    drop(conn);
    db.cleanup().await.unwrap();
}
