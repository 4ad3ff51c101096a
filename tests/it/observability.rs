//! What a handler tells `tracing`: one span per delivery, with the consumer, the key,
//! the outcome and the duration, under OpenTelemetry's messaging names.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use diesel::result::Error;
use diesel::sqlite::SqliteConnection;
use diesel_async::SimpleAsyncConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_inbox::testing::TestDatabase;
use diesel_inbox::{Outcome, idempotent};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;

type Conn = SyncConnectionWrapper<SqliteConnection>;

type Fields = HashMap<String, String>;

/// Every span's fields, in the order the spans were opened.
#[derive(Clone, Default)]
struct Recorded(Arc<Mutex<Vec<(String, Fields)>>>);

struct Collect<'a>(&'a mut Fields);

impl Visit for Collect<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

/// Where in `Recorded` a span's fields are kept.
struct Slot(usize);

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Recorded {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        attrs.record(&mut Collect(&mut fields));
        let mut spans = self.0.lock().unwrap();
        spans.push((attrs.metadata().name().to_owned(), fields));
        let span = ctx.span(id).expect("the span just opened");
        span.extensions_mut().insert(Slot(spans.len() - 1));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).expect("a recorded span is open");
        let extensions = span.extensions();
        let Slot(slot) = extensions.get::<Slot>().expect("every span has a slot");
        values.record(&mut Collect(&mut self.0.lock().unwrap()[*slot].1));
    }
}

struct Credit {
    id: String,
}

#[idempotent(consumer = "traced-credit", key = credit.id.as_str(), fast_path = false)]
async fn traced_credit(conn: &mut Conn, credit: &Credit) -> Result<(), Error> {
    conn.batch_execute("UPDATE accounts SET balance = balance + 1")
        .await
}

/// A SQLite database of the test's own, with the inbox and the one account.
async fn database(name: &str) -> (TestDatabase<Conn>, Conn) {
    let db = TestDatabase::sqlite(name).await.unwrap();
    let mut conn = db.connect().await.unwrap();
    conn.batch_execute(
        "CREATE TABLE accounts (balance BIGINT NOT NULL); INSERT INTO accounts VALUES (0);",
    )
    .await
    .unwrap();
    (db, conn)
}

#[tokio::test]
async fn each_delivery_is_one_span_with_its_consumer_key_and_outcome() {
    let (db, mut conn) = database("tracing").await;

    let recorded = Recorded::default();
    let subscriber = tracing_subscriber::registry().with(recorded.clone());
    let guard = tracing::subscriber::set_default(subscriber);
    let message = Credit { id: "m-1".into() };
    assert_eq!(
        traced_credit(&mut conn, &message).await.unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(
        traced_credit(&mut conn, &message).await.unwrap(),
        Outcome::Duplicate
    );
    let empty = Credit { id: String::new() };
    traced_credit(&mut conn, &empty)
        .await
        .expect_err("an empty key");
    drop(guard);
    db.cleanup().await.unwrap();

    let spans = recorded.0.lock().unwrap();
    let handled: Vec<&Fields> = spans
        .iter()
        .filter(|(name, _)| name == "inbox.process")
        .map(|(_, fields)| fields)
        .collect();
    assert_eq!(handled.len(), 3, "one span per delivery: {spans:?}");
    for fields in &handled {
        assert_eq!(fields["messaging.operation.type"], "process");
        assert_eq!(fields["messaging.consumer.group.name"], "traced-credit");
        assert_eq!(
            fields["code.function.name"],
            "it::observability::traced_credit"
        );
        assert_eq!(fields["inbox.read_first"], "false");
        let duration: f64 = fields["inbox.duration_ms"].parse().unwrap();
        assert!(duration >= 0.0, "{fields:?}");
    }
    assert_eq!(handled[0]["messaging.message.id"], "m-1");
    assert_eq!(handled[0]["inbox.outcome"], "processed");
    assert_eq!(handled[1]["inbox.outcome"], "duplicate");
    assert_eq!(handled[2]["inbox.outcome"], "database_error");
    assert_eq!(handled[2]["error.type"], "Permanent");
    assert!(
        !handled[2].contains_key("messaging.message.id"),
        "{:?}",
        handled[2]
    );
}

#[derive(Debug, thiserror::Error)]
enum LedgerError {
    #[error("database: {0}")]
    Db(#[from] Error),
    #[error("an entry's amount is never negative")]
    Negative,
}

struct Entry {
    id: &'static str,
    amount: i64,
}

#[idempotent(consumer = "traced-entry", key = entry.id, fast_path = false)]
async fn traced_entry(conn: &mut Conn, entry: &Entry) -> Result<(), LedgerError> {
    if entry.amount < 0 {
        return Err(LedgerError::Negative);
    }
    let insert = format!("INSERT INTO ledger VALUES ({})", entry.amount);
    conn.batch_execute(&insert).await?;
    Ok(())
}

/// A handler's error that holds a database error, here the body's own constraint
/// violation, carries its class as `error.type`; an error of the handler's own has none.
#[tokio::test]
async fn a_database_error_from_the_body_is_labelled_with_its_class() {
    let (db, mut conn) = database("body_error").await;
    conn.batch_execute("CREATE TABLE ledger (amount BIGINT NOT NULL CHECK (amount < 1000))")
        .await
        .unwrap();

    let recorded = Recorded::default();
    let subscriber = tracing_subscriber::registry().with(recorded.clone());
    let guard = tracing::subscriber::set_default(subscriber);
    let too_large = Entry {
        id: "e-1",
        amount: 5_000,
    };
    let error = traced_entry(&mut conn, &too_large)
        .await
        .expect_err("the check");
    assert!(matches!(error, LedgerError::Db(_)), "{error}");
    let negative = Entry {
        id: "e-2",
        amount: -1,
    };
    let error = traced_entry(&mut conn, &negative)
        .await
        .expect_err("its own");
    assert!(matches!(error, LedgerError::Negative), "{error}");
    drop(guard);
    db.cleanup().await.unwrap();

    let spans = recorded.0.lock().unwrap();
    let handled: Vec<&Fields> = spans
        .iter()
        .filter(|(name, _)| name == "inbox.process")
        .map(|(_, fields)| fields)
        .collect();
    assert_eq!(handled.len(), 2, "{spans:?}");
    assert_eq!(handled[0]["inbox.outcome"], "handler_error");
    assert_eq!(handled[0]["error.type"], "Permanent", "{:?}", handled[0]);
    assert_eq!(handled[1]["inbox.outcome"], "handler_error");
    assert!(!handled[1].contains_key("error.type"), "{:?}", handled[1]);
}

/// Events, by their message, with the fields they carry.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<Fields>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Events {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        event.record(&mut Collect(&mut fields));
        self.0.lock().unwrap().push(fields);
    }
}

/// Where a claim-mode body stops: it says it has its claim, then waits to be let go.
#[derive(Default)]
struct Gate {
    entered: tokio::sync::Notify,
    proceed: tokio::sync::Notify,
}

#[idempotent(consumer = "traced-receipt", key = id, claim)]
async fn traced_receipt(conn: &mut Conn, id: &str, gate: &Gate, fail: bool) -> Result<u32, Error> {
    if fail {
        return Err(Error::RollbackTransaction);
    }
    gate.entered.notify_one();
    gate.proceed.notified().await;
    Ok(diesel_inbox::Claim::current().attempt())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_mode_spans_carry_the_mode_the_attempt_and_in_progress() {
    let (db, mut conn) = database("claim_tracing").await;
    let mut other = db.connect().await.unwrap();

    let (recorded, events) = (Recorded::default(), Events::default());
    let subscriber = tracing_subscriber::registry()
        .with(recorded.clone())
        .with(events.clone());
    let dispatch = tracing::Dispatch::new(subscriber);
    let guard = tracing::dispatcher::set_default(&dispatch);
    let gate = Arc::new(Gate::default());
    let failed = traced_receipt(&mut conn, "r-1", &gate, true).await;
    assert!(failed.is_err());
    // The released claim is taken over at once, as attempt 2, and a delivery meanwhile
    // finds it held.
    let holder = {
        let gate = Arc::clone(&gate);
        let delivery = async move { traced_receipt(&mut conn, "r-1", &gate, false).await };
        tokio::spawn(tracing::instrument::WithSubscriber::with_subscriber(
            delivery,
            dispatch.clone(),
        ))
    };
    gate.entered.notified().await;
    let meanwhile = traced_receipt(&mut other, "r-1", &gate, false).await;
    assert!(meanwhile.unwrap().is_in_progress());
    gate.proceed.notify_one();
    assert_eq!(holder.await.unwrap().unwrap(), Outcome::Processed(2));
    drop(guard);
    db.cleanup().await.unwrap();

    let spans = recorded.0.lock().unwrap();
    let handled: Vec<&Fields> = spans
        .iter()
        .filter(|(name, _)| name == "inbox.process")
        .map(|(_, fields)| fields)
        .collect();
    assert_eq!(handled.len(), 3, "{spans:?}");
    for fields in &handled {
        assert_eq!(fields["inbox.mode"], "claim");
        assert_eq!(fields["messaging.message.id"], "r-1");
    }
    let outcomes: Vec<&str> = handled
        .iter()
        .map(|f| f["inbox.outcome"].as_str())
        .collect();
    assert_eq!(outcomes[0], "handler_error");
    assert!(outcomes[1..].contains(&"processed") && outcomes[1..].contains(&"in_progress"));
    let processed = handled
        .iter()
        .find(|f| f["inbox.outcome"] == "processed")
        .unwrap();
    assert_eq!(processed["inbox.attempt"], "2");
    let events = events.0.lock().unwrap();
    let takeover = events
        .iter()
        .find(|e| e["message"] == "took over a claim nobody held")
        .expect("a takeover event");
    assert_eq!(
        (
            takeover["inbox.attempt"].as_str(),
            takeover["inbox.released"].as_str()
        ),
        ("2", "true")
    );
    assert!(
        events
            .iter()
            .any(|e| e["message"] == "claimed by another delivery: the body did not run"),
        "{events:?}"
    );
}

#[idempotent(consumer = "traced-batch", batch = credits, key = |credit| credit.id.as_str())]
async fn traced_batch(conn: &mut Conn, credits: &[Credit]) -> Result<usize, Error> {
    conn.batch_execute("UPDATE accounts SET balance = balance + 1")
        .await?;
    Ok(credits.len())
}

fn credits(ids: &[&str]) -> Vec<Credit> {
    ids.iter().map(|id| Credit { id: (*id).into() }).collect()
}

#[tokio::test]
async fn a_batch_is_one_span_with_its_size_and_counts() {
    let (db, mut conn) = database("tracing_batch").await;

    let recorded = Recorded::default();
    let subscriber = tracing_subscriber::registry().with(recorded.clone());
    let guard = tracing::subscriber::set_default(subscriber);
    for ids in [&["b-1", "b-2"][..], &["b-2", "b-3", "b-3"], &["b-1"]] {
        let _settled = traced_batch(&mut conn, &credits(ids)).await.unwrap();
    }
    drop(guard);
    db.cleanup().await.unwrap();

    let spans = recorded.0.lock().unwrap();
    let batches: Vec<&Fields> = spans
        .iter()
        .filter(|(name, _)| name == "inbox.process_batch")
        .map(|(_, fields)| fields)
        .collect();
    assert_eq!(batches.len(), 3, "one span per batch: {spans:?}");
    for fields in &batches {
        assert_eq!(fields["messaging.consumer.group.name"], "traced-batch");
        assert_eq!(
            fields["code.function.name"],
            "it::observability::traced_batch"
        );
        let duration: f64 = fields["inbox.duration_ms"].parse().unwrap();
        assert!(duration >= 0.0, "{fields:?}");
    }
    let counts: Vec<(&str, &str, &str, &str)> = batches
        .iter()
        .map(|fields| {
            (
                fields["messaging.batch.message_count"].as_str(),
                fields.get("inbox.processed").map_or("-", String::as_str),
                fields.get("inbox.duplicates").map_or("-", String::as_str),
                fields["inbox.outcome"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        counts,
        [
            ("2", "2", "0", "processed"),
            ("3", "1", "2", "processed"),
            ("1", "-", "-", "duplicate"),
        ]
    );
}

/// The targets of every span and event, as a `RUST_LOG` filter reads them, and each
/// event's fields.
#[derive(Clone, Default)]
struct Targets(Arc<Mutex<Vec<String>>>, Arc<Mutex<Vec<Fields>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Targets {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        let target = attrs.metadata().target().to_owned();
        self.0.lock().unwrap().push(target);
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let target = event.metadata().target().to_owned();
        self.0.lock().unwrap().push(target);
        let mut fields = Fields::new();
        event.record(&mut Collect(&mut fields));
        self.1.lock().unwrap().push(fields);
    }
}

/// Spans and events are under the crate users depend on, `diesel_inbox`, so that
/// `RUST_LOG=diesel_inbox=debug` shows them; they were under the internal runtime
/// crate's module paths.
#[tokio::test]
async fn everything_is_reported_under_the_crates_name() {
    let (db, mut conn) = database("tracing_target").await;
    let targets = Targets::default();
    let subscriber = tracing_subscriber::registry().with(targets.clone());
    let guard = tracing::subscriber::set_default(subscriber);
    let message = Credit { id: "t-1".into() };
    for _ in 0..2 {
        let _outcome = traced_credit(&mut conn, &message).await.unwrap();
    }
    let _settled = traced_batch(&mut conn, &credits(&["t-1", "t-2"]))
        .await
        .unwrap();
    drop(guard);
    db.cleanup().await.unwrap();

    let events = targets.1.lock().unwrap();
    let targets = targets.0.lock().unwrap();
    assert!(targets.len() >= 4, "spans and events: {targets:?}");
    assert!(
        targets.iter().all(|target| target == "diesel_inbox"),
        "{targets:?}"
    );
    // One event at the end of each delivery carries its outcome, for subscribers that
    // show no span closes.
    let outcomes: Vec<&str> = events
        .iter()
        .filter(|fields| fields.get("message").map(String::as_str) == Some("delivery finished"))
        .map(|fields| fields["inbox.outcome"].as_str())
        .collect();
    assert_eq!(outcomes, ["processed", "duplicate", "processed"]);
}

/// With the `metrics` feature, each delivery counts once under its consumer and outcome,
/// and its duration is recorded; the key is never a label.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn each_delivery_is_counted_by_consumer_and_outcome() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let (db, mut conn) = database("metrics").await;

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let guard = metrics::set_default_local_recorder(&recorder);
    diesel_inbox::metrics::describe();
    for id in ["m-1", "m-1", "m-2", ""] {
        let _ = traced_credit(&mut conn, &Credit { id: id.into() }).await;
    }
    // A batch counts each of its messages as a delivery.
    let _settled = traced_batch(&mut conn, &credits(&["b-1", "b-2", "b-1"]))
        .await
        .unwrap();
    traced_batch(&mut conn, &credits(&["b-2", ""]))
        .await
        .expect_err("an empty key");
    drop(guard);
    db.cleanup().await.unwrap();

    let mut counts = HashMap::new();
    let mut durations = 0;
    for (key, unit, description, value) in snapshotter.snapshot().into_vec() {
        assert!(description.is_some(), "{key:?} is described");
        assert_eq!(
            unit,
            Some(match key.key().name() {
                diesel_inbox::metrics::DELIVERIES => metrics::Unit::Count,
                _ => metrics::Unit::Seconds,
            })
        );
        let labels: HashMap<&str, &str> = key
            .key()
            .labels()
            .map(|label| (label.key(), label.value()))
            .collect();
        assert_eq!(labels.len(), 2, "consumer and outcome only: {labels:?}");
        match (key.key().name(), value) {
            (diesel_inbox::metrics::DELIVERIES, DebugValue::Counter(count)) => {
                counts.insert(
                    (labels["consumer"].to_owned(), labels["outcome"].to_owned()),
                    count,
                );
            }
            (diesel_inbox::metrics::DELIVERY_DURATION, DebugValue::Histogram(values)) => {
                durations += values.len();
            }
            other => panic!("unexpected metric {other:?}"),
        }
    }
    let expected: HashMap<(String, String), u64> = [
        ("traced-credit", "processed", 2),
        ("traced-credit", "duplicate", 1),
        ("traced-credit", "database_error", 1),
        ("traced-batch", "processed", 2),
        ("traced-batch", "duplicate", 1),
        ("traced-batch", "database_error", 2),
    ]
    .into_iter()
    .map(|(consumer, outcome, count)| ((consumer.to_owned(), outcome.to_owned()), count))
    .collect();
    assert_eq!(counts, expected);
    assert_eq!(durations, 9);
}
