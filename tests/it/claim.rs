//! Claim mode against the real PostgreSQL, MySQL/MariaDB and SQLite, with a real HTTP
//! service downstream that counts every call and deduplicates by idempotency key.
//!
//! Each scenario runs on every backend whose server is configured, in a place of its
//! own made by `diesel_inbox::testing`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use diesel::result::Error;
use diesel_async::{AsyncConnection, SimpleAsyncConnection as _};
use diesel_inbox::testing::{TestConnection, TestDatabase, select_i64};
use diesel_inbox::{
    Claim, ClaimError, Disposition, ErrorClass, InboxBackend, InboxError, Outcome, claims,
    classify, idempotent,
};
use inbox_fixtures::credit::Credit;
use inbox_fixtures::downstream::Downstream;
use tokio::sync::Notify;

use crate::common::retry_delay;

/// What a test's handler failed with.
#[derive(Debug, thiserror::Error)]
enum TestError {
    #[error(transparent)]
    Database(#[from] Error),
    #[error("the downstream call failed: {0}")]
    Downstream(#[from] reqwest::Error),
    #[error("the order was rejected")]
    Rejected,
}

impl diesel_inbox::Classify for TestError {
    fn class(&self) -> ErrorClass {
        match self {
            Self::Database(error) => classify(error),
            _ => ErrorClass::Permanent,
        }
    }
}

impl TestError {
    fn database(&self) -> &Error {
        match self {
            Self::Database(error) => error,
            other => panic!("expected a database error, got {other}"),
        }
    }
}

/// One delivery of an order whose receipt is charged downstream.
#[derive(Debug, Clone)]
struct Order {
    id: String,
    payload: String,
}

impl Order {
    fn new(id: &str) -> Self {
        Self {
            id: id.to_owned(),
            payload: format!("{{\"order\":\"{id}\",\"amount\":100}}"),
        }
    }

    /// What its receipt charges downstream.
    fn charge(&self) -> Credit {
        Credit {
            message_id: self.id.clone(),
            account: 0,
            amount: 100,
        }
    }
}

/// How a delivery's body behaves: where it stops to let the test act, and whether it
/// fails.
#[derive(Default)]
struct Script {
    /// Signalled when the body has its claim, before the call.
    claimed: Notify,
    /// Signalled after the downstream call.
    called: Notify,
    /// Lets a held body go on.
    proceed: Notify,
    hold_before_call: bool,
    hold_after_call: bool,
    fail: bool,
}

impl Script {
    fn run() -> Arc<Self> {
        Arc::new(Self::default())
    }
    fn hold_before_call() -> Arc<Self> {
        Arc::new(Self {
            hold_before_call: true,
            ..Self::default()
        })
    }
    fn hold_after_call() -> Arc<Self> {
        Arc::new(Self {
            hold_after_call: true,
            ..Self::default()
        })
    }
    fn fail() -> Arc<Self> {
        Arc::new(Self {
            fail: true,
            ..Self::default()
        })
    }
}

/// The body every claim handler here runs: charge downstream under the claim's
/// idempotency key, and return the attempt.
async fn charge_under_claim(
    downstream: &Downstream,
    order: &Order,
    script: &Script,
) -> Result<u32, TestError> {
    let claim = Claim::current();
    script.claimed.notify_one();
    if script.hold_before_call {
        script.proceed.notified().await;
    }
    downstream
        .credit(&claim.idempotency_key().to_string(), &order.charge())
        .await?;
    script.called.notify_one();
    if script.hold_after_call {
        script.proceed.notified().await;
    }
    if script.fail {
        return Err(TestError::Rejected);
    }
    Ok(claim.attempt())
}

#[idempotent(consumer = "receipt", key = order.id.as_str(), claim, lease = lease,
             fingerprint = order.payload.as_bytes())]
async fn send_receipt<C>(
    conn: &mut C,
    downstream: &Downstream,
    order: &Order,
    lease: Duration,
    script: &Script,
) -> Result<u32, TestError>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    charge_under_claim(downstream, order, script).await
}

#[idempotent(consumer = "receipt-limited", key = order.id.as_str(), claim, max_attempts = 2)]
async fn send_receipt_at_most_twice<C>(
    conn: &mut C,
    downstream: &Downstream,
    order: &Order,
    script: &Script,
) -> Result<u32, TestError>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    charge_under_claim(downstream, order, script).await
}

#[idempotent(consumer = "withdrawal", key = order.id.as_str(), claim, lease = lease,
             takeover = false)]
async fn withdraw<C>(
    conn: &mut C,
    downstream: &Downstream,
    order: &Order,
    lease: Duration,
    script: &Script,
) -> Result<u32, TestError>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    charge_under_claim(downstream, order, script).await
}

/// What the pattern is without claim mode: look for a marker, call, then record one.
/// Two deliveries that look at the same time both call.
async fn naive_send_receipt<C: TestConnection>(
    conn: &mut C,
    downstream: &Downstream,
    order: &Order,
) -> Result<(), TestError> {
    let seen = format!(
        "SELECT COUNT(*) FROM inbox WHERE consumer = 'naive' AND message_id = '{}'",
        order.id
    );
    if select_i64(conn, &seen).await? > 0 {
        return Ok(());
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    downstream
        .credit(&format!("naive-{}", order.id), &order.charge())
        .await?;
    // No unique index stops a second marker here: the check above was the guard.
    let _second_marker_refused = conn
        .batch_execute(&format!(
            "INSERT INTO inbox (message_id, consumer) VALUES ('{}', 'naive')",
            order.id
        ))
        .await;
    Ok(())
}

const LONG_LEASE: Duration = Duration::from_secs(60);
/// Short enough to wait out in a test; SQLite's clock has millisecond precision.
const SHORT_LEASE: Duration = Duration::from_millis(700);

async fn deliver<C: TestConnection>(
    conn: &mut C,
    downstream: &Downstream,
    order: &Order,
    lease: Duration,
    script: &Script,
) -> Result<Outcome<u32>, TestError> {
    send_receipt(conn, downstream, order, lease, script).await
}

/// Starts a delivery that stops inside its body, once it holds the claim (and, with
/// `hold_after_call`, once it has called), then drops it there: a consumer that died
/// mid-message.
async fn die_inside_the_body<C: TestConnection>(
    db: &TestDatabase<C>,
    downstream: &Downstream,
    order: &Order,
    lease: Duration,
    script: Arc<Script>,
) {
    let mut conn = db.connect().await.expect("connect");
    let (downstream, order, held) = (downstream.clone(), order.clone(), Arc::clone(&script));
    let delivery = tokio::spawn(async move {
        let _ = deliver(&mut conn, &downstream, &order, lease, &held).await;
    });
    if script.hold_after_call {
        script.called.notified().await;
    } else {
        script.claimed.notified().await;
    }
    delivery.abort();
    let _ = delivery.await;
}

/// Redelivers `order` until its claim's lease has ended and a delivery takes it over,
/// and returns that delivery's outcome. Every earlier one must be `InProgress`.
async fn redeliver_until_taken_over<C: TestConnection>(
    conn: &mut C,
    downstream: &Downstream,
    order: &Order,
    lease: Duration,
) -> Outcome<u32> {
    for _ in 0..100 {
        match deliver(conn, downstream, order, lease, &Script::run()).await {
            Ok(Outcome::InProgress { lease_remaining }) => {
                let wait = lease_remaining.unwrap_or(Duration::from_millis(50));
                tokio::time::sleep(wait.min(Duration::from_millis(200))).await;
            }
            other => return other.expect("a takeover"),
        }
    }
    panic!("the claim was never taken over");
}

/// Consumers racing over the same messages, each on a connection of its own: every
/// consumer receives every message, in the same order, so that copies overlap.
const CONSUMERS: usize = 6;

async fn race<C: TestConnection>(db: TestDatabase<C>) {
    let downstream = Downstream::start().await.expect("start downstream");
    let orders: Vec<Order> = (0..20).map(|n| Order::new(&format!("race-{n}"))).collect();
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let (db, downstream, orders) = (db.clone(), downstream.clone(), orders.clone());
            tokio::spawn(async move {
                let mut conn = db.connect().await.expect("connect");
                let mut processed = 0;
                for order in &orders {
                    // Redelivered while in progress, as a broker does, until settled.
                    for redelivery in 0.. {
                        assert!(redelivery < 500, "never settled");
                        let script = Script::run();
                        let outcome = deliver(&mut conn, &downstream, order, LONG_LEASE, &script);
                        match outcome.await.expect("no error") {
                            Outcome::InProgress { .. } => {
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            Outcome::Processed(attempt) => {
                                assert_eq!(attempt, 1);
                                processed += 1;
                                break;
                            }
                            Outcome::Duplicate => break,
                        }
                    }
                }
                processed
            })
        })
        .collect();
    let mut processed = 0;
    for consumer in consumers {
        processed += consumer.await.expect("consumer");
    }
    assert_eq!(processed, orders.len());
    assert_eq!(
        downstream.calls(),
        orders.len(),
        "one external call per message"
    );
    assert_eq!(downstream.effects(), orders.len());
}

async fn race_catches_the_naive_handler<C: TestConnection>(db: TestDatabase<C>) {
    let downstream = Downstream::start().await.expect("start downstream");
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let (db, downstream) = (db.clone(), downstream.clone());
            tokio::spawn(async move {
                let mut conn = db.connect().await.expect("connect");
                for n in 0..20 {
                    let order = Order::new(&format!("naive-{n}"));
                    // SQLite may answer a racing insert with SQLITE_BUSY: the call was
                    // made by then.
                    let _ = naive_send_receipt(&mut conn, &downstream, &order).await;
                }
            })
        })
        .collect();
    for consumer in consumers {
        consumer.await.expect("consumer");
    }
    assert!(
        downstream.most_calls_per_key() > 1,
        "the naive handler called at most once per message; the race proves nothing"
    );
}

async fn crash_after_the_claim<C: TestConnection>(db: TestDatabase<C>) {
    let downstream = Downstream::start().await.expect("start downstream");
    let order = Order::new("crash-before-call");
    die_inside_the_body(
        &db,
        &downstream,
        &order,
        SHORT_LEASE,
        Script::hold_before_call(),
    )
    .await;
    let mut conn = db.connect().await.expect("connect");
    let early = deliver(&mut conn, &downstream, &order, SHORT_LEASE, &Script::run()).await;
    let Ok(Outcome::InProgress {
        lease_remaining: Some(remaining),
    }) = early
    else {
        panic!("a redelivery before the lease ends must be InProgress: {early:?}");
    };
    assert!(remaining <= SHORT_LEASE, "{remaining:?}");
    assert_eq!(
        Disposition::of(&early),
        Disposition::Retry {
            after: Some(remaining),
            reason: String::from("another delivery holds the message's claim"),
        }
    );
    let taken = redeliver_until_taken_over(&mut conn, &downstream, &order, SHORT_LEASE).await;
    assert_eq!(taken, Outcome::Processed(2));
    assert_eq!(
        downstream.calls(),
        1,
        "the first attempt died before calling"
    );
    let again = deliver(&mut conn, &downstream, &order, SHORT_LEASE, &Script::run()).await;
    assert_eq!(again.expect("duplicate"), Outcome::Duplicate);
    assert_eq!(downstream.calls(), 1);
}

/// The process that `crash_after_the_claim_in_a_killed_process` kills: it claims the
/// message and stops before the call. Does nothing unless started by that test.
#[test]
#[ignore = "run as a child process by crash_after_the_claim_in_a_killed_process"]
fn child_claims_then_hangs() {
    let (Ok(backend), Ok(url)) = (
        std::env::var("CLAIM_CHILD_BACKEND"),
        std::env::var("CLAIM_CHILD_URL"),
    ) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async move {
        let downstream = Downstream::start().await.expect("start downstream");
        let order = Order::new("killed");
        let script = Script::hold_before_call();
        let claimed = Arc::clone(&script);
        tokio::spawn(async move {
            claimed.claimed.notified().await;
            println!("claimed");
        });
        match backend.as_str() {
            "postgres" => {
                let mut conn = diesel_async::AsyncPgConnection::establish(&url)
                    .await
                    .expect("connect");
                let _ = deliver(&mut conn, &downstream, &order, SHORT_LEASE, &script).await;
            }
            "mysql" => {
                let mut conn = diesel_async::AsyncMysqlConnection::establish(&url)
                    .await
                    .expect("connect");
                let _ = deliver(&mut conn, &downstream, &order, SHORT_LEASE, &script).await;
            }
            _ => {
                use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
                let mut conn =
                    SyncConnectionWrapper::<diesel::sqlite::SqliteConnection>::establish(&url)
                        .await
                        .expect("connect");
                conn.batch_execute("PRAGMA busy_timeout = 10000; PRAGMA journal_mode = WAL;")
                    .await
                    .expect("configure");
                let _ = deliver(&mut conn, &downstream, &order, SHORT_LEASE, &script).await;
            }
        }
    });
}

/// The backend a `TestDatabase` is on, as the child process is told.
fn backend_name<C: TestConnection>() -> &'static str {
    let backend = std::any::type_name::<C::Backend>();
    if backend.ends_with("Pg") {
        "postgres"
    } else if backend.ends_with("Mysql") {
        "mysql"
    } else {
        "sqlite"
    }
}

async fn crash_after_the_claim_in_a_killed_process<C: TestConnection>(db: TestDatabase<C>) {
    use tokio::io::AsyncBufReadExt as _;

    let mut child = tokio::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--ignored",
            "--exact",
            "claim::child_claims_then_hangs",
            "--nocapture",
        ])
        .env("CLAIM_CHILD_BACKEND", backend_name::<C>())
        .env("CLAIM_CHILD_URL", db.url())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the child");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    while let Some(line) = lines.next_line().await.expect("child output") {
        if line == "claimed" {
            break;
        }
    }
    // SIGKILL: no destructor, no rollback, no release; the claim stays until its lease ends.
    child.kill().await.expect("kill the child");
    let downstream = Downstream::start().await.expect("start downstream");
    let order = Order::new("killed");
    let mut conn = db.connect().await.expect("connect");
    let early = deliver(&mut conn, &downstream, &order, SHORT_LEASE, &Script::run()).await;
    assert!(early.expect("in progress").is_in_progress());
    let taken = redeliver_until_taken_over(&mut conn, &downstream, &order, SHORT_LEASE).await;
    assert_eq!(taken, Outcome::Processed(2));
    assert_eq!(downstream.calls(), 1);
}

async fn crash_after_the_call<C: TestConnection>(db: TestDatabase<C>) {
    let downstream = Downstream::start().await.expect("start downstream");
    let order = Order::new("crash-after-call");
    die_inside_the_body(
        &db,
        &downstream,
        &order,
        SHORT_LEASE,
        Script::hold_after_call(),
    )
    .await;
    let mut conn = db.connect().await.expect("connect");
    let taken = redeliver_until_taken_over(&mut conn, &downstream, &order, SHORT_LEASE).await;
    assert_eq!(taken, Outcome::Processed(2));
    assert_eq!(downstream.calls(), 2, "the takeover calls again");
    assert_eq!(downstream.effects(), 1, "with the same idempotency key");
    assert_eq!(downstream.absorbed(), 1);
}

async fn outliving_the_lease_loses_the_claim<C: TestConnection>(db: TestDatabase<C>) {
    let downstream = Downstream::start().await.expect("start downstream");
    let order = Order::new("slow");
    let script = Script::hold_after_call();
    let slow = {
        let mut conn = db.connect().await.expect("connect");
        let (downstream, order, script) = (downstream.clone(), order.clone(), Arc::clone(&script));
        tokio::spawn(
            async move { deliver(&mut conn, &downstream, &order, SHORT_LEASE, &script).await },
        )
    };
    script.called.notified().await;
    let mut conn = db.connect().await.expect("connect");
    let taken = redeliver_until_taken_over(&mut conn, &downstream, &order, LONG_LEASE).await;
    assert_eq!(taken, Outcome::Processed(2));
    script.proceed.notify_one();
    let lost = slow
        .await
        .expect("the slow delivery")
        .expect_err("its claim was lost");
    assert_eq!(
        InboxError::find(lost.database()),
        Some(&InboxError::Claim(ClaimError::Lost { attempt: 1 }))
    );
    assert_eq!(classify(lost.database()), ErrorClass::Transient);
    assert_eq!((downstream.calls(), downstream.effects()), (2, 1));
}

/// How a body leaves its connection inside a transaction.
#[derive(Clone, Copy, Debug)]
enum LeftOpen {
    /// A `conn.transaction(…)` cut short by a timeout.
    Transaction,
    /// A transactional handler cut short by a timeout.
    Handler,
}

/// A transactional handler slower than the timeout its caller gives it.
#[idempotent(consumer = "slow-record", key = order.id.as_str())]
async fn slow_record<C>(conn: &mut C, order: &Order) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    tokio::time::sleep(Duration::from_secs(5)).await;
    conn.batch_execute("UPDATE inbox SET attempts = attempts WHERE 1 = 0")
        .await
}

/// Makes its call, then leaves its connection inside a transaction, and returns `Ok`.
#[idempotent(consumer = "left-open", key = order.id.as_str(), claim, lease = SHORT_LEASE)]
async fn leave_a_transaction_open<C>(
    conn: &mut C,
    downstream: &Downstream,
    order: &Order,
    how: Option<LeftOpen>,
) -> Result<u32, TestError>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let claim = Claim::current();
    downstream
        .credit(&claim.idempotency_key().to_string(), &order.charge())
        .await?;
    let cut_short = Duration::from_millis(100);
    match how {
        Some(LeftOpen::Transaction) => {
            let slow = conn.transaction(async |_conn| {
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok::<_, Error>(())
            });
            let _ignored = tokio::time::timeout(cut_short, slow).await;
        }
        Some(LeftOpen::Handler) => {
            let _ignored = tokio::time::timeout(cut_short, slow_record(conn, order)).await;
        }
        None => {}
    }
    Ok(claim.attempt())
}

/// A body that returns `Ok` with its connection still inside a transaction would
/// complete its claim inside that transaction, which never commits: the delivery was
/// acked as `Processed` while the claim stayed open for a takeover to call again. The
/// handler refuses instead, with `ConnectionUnusable`, and the claim, held until its
/// lease ends, is taken over by the redelivery.
async fn body_left_in_a_transaction<C: TestConnection>(db: TestDatabase<C>) {
    for how in [LeftOpen::Transaction, LeftOpen::Handler] {
        let downstream = Downstream::start().await.expect("start downstream");
        let order = Order::new(&format!("left-open-{how:?}"));
        let mut conn = db.connect().await.expect("connect");
        let left = leave_a_transaction_open(&mut conn, &downstream, &order, Some(how)).await;
        let error = left.expect_err("never Processed");
        assert_eq!(
            InboxError::find(error.database()),
            Some(&InboxError::Claim(ClaimError::TransactionLeftOpen {
                attempt: 1
            })),
            "{how:?}"
        );
        assert_eq!(classify(error.database()), ErrorClass::ConnectionUnusable);
        assert_eq!(
            retry_delay(&Disposition::of(&Err::<Outcome<()>, _>(error))),
            Some(None)
        );
        drop(conn);

        // Seen from another connection, the claim is held, not completed, and the handler
        // cut short committed nothing (on MySQL, restoring autocommit after the claim
        // would have committed its marker); once the lease ends the redelivery takes the
        // claim over and completes it.
        let mut other = db.connect().await.expect("connect");
        let half_done = "SELECT COUNT(*) FROM inbox WHERE consumer = 'slow-record'";
        assert_eq!(select_i64(&mut other, half_done).await.unwrap(), 0);
        let meanwhile = leave_a_transaction_open(&mut other, &downstream, &order, None).await;
        assert!(
            matches!(meanwhile, Ok(Outcome::InProgress { .. })),
            "{how:?}: {meanwhile:?}"
        );
        tokio::time::sleep(SHORT_LEASE).await;
        let taken = leave_a_transaction_open(&mut other, &downstream, &order, None).await;
        assert_eq!(taken.unwrap(), Outcome::Processed(2), "{how:?}");
        assert_eq!((downstream.calls(), downstream.effects()), (2, 1));
        let again = leave_a_transaction_open(&mut other, &downstream, &order, None).await;
        assert_eq!(again.unwrap(), Outcome::Duplicate);
    }
}

/// The consumer of the claim a transactional handler's body sees.
#[idempotent(consumer = "sees-claim", key = order.id.as_str())]
async fn transactional_sees_claim<C>(
    conn: &mut C,
    order: &Order,
) -> Result<Option<&'static str>, Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    conn.batch_execute("SELECT 1").await?;
    Ok(Claim::try_current().map(|claim| claim.consumer()))
}

/// The same for a batch handler's body.
#[idempotent(consumer = "sees-claim-batch", batch = orders, key = |order| order.id.as_str())]
async fn batch_sees_claim<C>(conn: &mut C, orders: &[Order]) -> Result<Option<&'static str>, Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    assert_eq!(orders.len(), 1);
    conn.batch_execute("SELECT 1").await?;
    Ok(Claim::try_current().map(|claim| claim.consumer()))
}

/// A claim whose body calls a transactional and a batch handler on its connection, and
/// reports what each body saw of `Claim::try_current()`, then what its own sees.
#[idempotent(consumer = "outer-claim", key = order.id.as_str(), claim)]
async fn claim_calling_handlers<C>(
    conn: &mut C,
    order: &Order,
) -> Result<[Option<&'static str>; 3], TestError>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let transactional = transactional_sees_claim(conn, order).await?;
    let batch = batch_sees_claim(conn, std::slice::from_ref(order)).await?;
    let own = Claim::try_current().map(|claim| claim.consumer());
    let transactional = match transactional {
        Outcome::Processed(seen) => seen,
        other => panic!("the transactional handler ran: {other:?}"),
    };
    let batch = batch.value().copied().flatten();
    Ok([transactional, batch, own])
}

/// `Claim::try_current()` is the claim of the claim-mode body being run: a
/// transactional or batch handler called from a claim's body sees none, where it saw
/// the enclosing claim, with its consumer, key and attempt.
async fn handlers_inside_a_claim_see_no_claim<C: TestConnection>(db: TestDatabase<C>) {
    let mut conn = db.connect().await.expect("connect");
    let order = Order::new("nested");
    let seen = claim_calling_handlers(&mut conn, &order).await.unwrap();
    assert_eq!(seen, Outcome::Processed([None, None, Some("outer-claim")]));
    assert_eq!(Claim::try_current(), None);
}

/// Charges, waits as the script says, then, when `renew`, renews its claim and charges
/// a second step under another key: the step a renew that does not fail would repeat.
#[idempotent(consumer = "stale-holder", key = order.id.as_str(), claim, lease = SHORT_LEASE)]
async fn stale_holder<C>(
    conn: &mut C,
    downstream: &Downstream,
    order: &Order,
    script: &Script,
    renew: bool,
) -> Result<u32, TestError>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let claim = Claim::current();
    let key = claim.idempotency_key().to_string();
    downstream.credit(&key, &order.charge()).await?;
    script.called.notify_one();
    if script.hold_after_call {
        script.proceed.notified().await;
    }
    if renew {
        claim.renew(conn).await?;
        downstream
            .credit(&format!("{key}-step-2"), &order.charge())
            .await?;
    }
    Ok(claim.attempt())
}

/// A holder whose lease ended while its body ran comes back while the delivery that took
/// the claim over still holds it, live: it must neither complete that claim (reported
/// `Processed` under the taker's claim) nor renew it and go on to its next step. Both
/// end in `ClaimError::Lost` for the stale holder, and the taker completes.
async fn a_stale_holder_never_settles_the_takers_claim<C: TestConnection>(db: TestDatabase<C>) {
    for renew in [false, true] {
        let downstream = Downstream::start().await.expect("start downstream");
        let order = Order::new(&format!("stale-holder-{renew}"));
        let hold = |script: &Arc<Script>| {
            let (db, downstream, order, script) = (
                db.clone(),
                downstream.clone(),
                order.clone(),
                Arc::clone(script),
            );
            tokio::spawn(async move {
                let mut conn = db.connect().await.expect("connect");
                stale_holder(&mut conn, &downstream, &order, &script, renew).await
            })
        };
        let stale_script = Script::hold_after_call();
        let stale = hold(&stale_script);
        stale_script.called.notified().await;
        tokio::time::sleep(SHORT_LEASE + Duration::from_millis(100)).await;
        let taker_script = Script::hold_after_call();
        let taker = hold(&taker_script);
        taker_script.called.notified().await;

        // The taker holds a live claim as attempt 2; the stale holder comes back now.
        stale_script.proceed.notify_one();
        let lost = stale.await.expect("the stale holder").expect_err("lost");
        assert_eq!(
            InboxError::find(lost.database()),
            Some(&InboxError::Claim(ClaimError::Lost { attempt: 1 })),
            "renew: {renew}"
        );
        let mut conn = db.connect().await.expect("connect");
        let meanwhile = stale_holder(&mut conn, &downstream, &order, &Script::run(), false).await;
        assert!(
            matches!(meanwhile, Ok(Outcome::InProgress { .. })),
            "renew: {renew}: the taker's claim is still its own: {meanwhile:?}"
        );
        assert_eq!(downstream.calls(), 2, "renew: {renew}: no second step");

        taker_script.proceed.notify_one();
        let taken = taker.await.expect("the taker").expect("completes");
        assert_eq!(taken, Outcome::Processed(2), "renew: {renew}");
        let after = stale_holder(&mut conn, &downstream, &order, &Script::run(), false).await;
        assert!(matches!(after, Ok(Outcome::Duplicate)), "{after:?}");
    }
}

async fn a_renewed_claim_outlives_its_first_lease<C: TestConnection>(db: TestDatabase<C>) {
    let downstream = Downstream::start().await.expect("start downstream");
    let order = Order::new("renewed");
    let script = Script::hold_after_call();
    let slow = {
        let mut conn = db.connect().await.expect("connect");
        let (downstream, order, script) = (downstream.clone(), order.clone(), Arc::clone(&script));
        tokio::spawn(async move { renewing_receipt(&mut conn, &downstream, &order, &script).await })
    };
    script.called.notified().await;
    let mut conn = db.connect().await.expect("connect");
    // Well past the first lease, the renewing holder still holds the claim.
    for _ in 0..4 {
        tokio::time::sleep(SHORT_LEASE / 2).await;
        let outcome = renewing_receipt(&mut conn, &downstream, &order, &Script::run()).await;
        assert!(outcome.expect("in progress").is_in_progress());
    }
    script.proceed.notify_one();
    let done = slow.await.expect("the slow delivery").expect("completed");
    assert_eq!(done, Outcome::Processed(1));
    assert_eq!(downstream.calls(), 1);
}

/// Renews its claim while it waits, as a long body between its steps would.
#[idempotent(consumer = "renewing", key = order.id.as_str(), claim, lease = SHORT_LEASE)]
async fn renewing_receipt<C>(
    conn: &mut C,
    downstream: &Downstream,
    order: &Order,
    script: &Script,
) -> Result<u32, TestError>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let claim = Claim::current();
    downstream
        .credit(&claim.idempotency_key().to_string(), &order.charge())
        .await?;
    script.called.notify_one();
    if script.hold_after_call {
        let proceed = script.proceed.notified();
        tokio::pin!(proceed);
        loop {
            tokio::select! {
                () = &mut proceed => break,
                () = tokio::time::sleep(SHORT_LEASE / 4) => claim.renew(conn).await?,
            }
        }
    }
    Ok(claim.attempt())
}

async fn many_takers<C: TestConnection>(db: TestDatabase<C>) {
    let downstream = Downstream::start().await.expect("start downstream");
    let order = Order::new("many-takers");
    die_inside_the_body(
        &db,
        &downstream,
        &order,
        SHORT_LEASE,
        Script::hold_before_call(),
    )
    .await;
    tokio::time::sleep(SHORT_LEASE + Duration::from_millis(300)).await;
    let takers: Vec<_> = (0..8)
        .map(|_| {
            let (db, downstream, order) = (db.clone(), downstream.clone(), order.clone());
            tokio::spawn(async move {
                let mut conn = db.connect().await.expect("connect");
                deliver(&mut conn, &downstream, &order, LONG_LEASE, &Script::run())
                    .await
                    .expect("a taker")
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for taker in takers {
        outcomes.push(taker.await.expect("taker"));
    }
    let processed: Vec<_> = outcomes.iter().filter(|o| o.is_processed()).collect();
    assert_eq!(processed, [&Outcome::Processed(2)], "{outcomes:?}");
    assert!(
        outcomes
            .iter()
            .all(|o| o.is_processed() || o.is_duplicate() || o.is_in_progress())
    );
    assert_eq!(downstream.calls(), 1);
}

async fn failing_body_releases_the_claim<C: TestConnection>(db: TestDatabase<C>) {
    let downstream = Downstream::start().await.expect("start downstream");
    let order = Order::new("fails-once");
    let mut conn = db.connect().await.expect("connect");
    let failed = deliver(&mut conn, &downstream, &order, LONG_LEASE, &Script::fail()).await;
    assert!(matches!(failed, Err(TestError::Rejected)), "{failed:?}");
    // At once, though the lease is a minute long.
    let retried = deliver(&mut conn, &downstream, &order, LONG_LEASE, &Script::run()).await;
    assert_eq!(retried.expect("the retry"), Outcome::Processed(2));
}

async fn attempts_are_limited<C: TestConnection>(db: TestDatabase<C>) {
    let downstream = Downstream::start().await.expect("start downstream");
    let order = Order::new("poison");
    let mut conn = db.connect().await.expect("connect");
    for _ in 0..2 {
        let failed =
            send_receipt_at_most_twice(&mut conn, &downstream, &order, &Script::fail()).await;
        assert!(matches!(failed, Err(TestError::Rejected)), "{failed:?}");
    }
    let calls = downstream.calls();
    let exhausted = send_receipt_at_most_twice(&mut conn, &downstream, &order, &Script::run())
        .await
        .expect_err("out of attempts");
    assert_eq!(
        InboxError::find(exhausted.database()),
        Some(&InboxError::Claim(ClaimError::AttemptsExhausted {
            attempts: 2
        }))
    );
    assert_eq!(classify(exhausted.database()), ErrorClass::Permanent);
    assert_eq!(downstream.calls(), calls, "the body did not run again");
    let stale = claims::list_stale(&mut conn).await.expect("list");
    assert_eq!(stale.len(), 1, "{stale:?}");
    assert_eq!(
        (stale[0].message_id.as_str(), stale[0].consumer.as_str()),
        ("poison", "receipt-limited")
    );
    assert_eq!((stale[0].attempts, stale[0].released), (2, true));
    assert!(
        claims::release_by_hand(&mut conn, "receipt-limited", "poison")
            .await
            .expect("release")
    );
    let rerun = send_receipt_at_most_twice(&mut conn, &downstream, &order, &Script::run()).await;
    assert_eq!(
        rerun.expect("after a person released it"),
        Outcome::Processed(1)
    );
    assert!(
        claims::list_stale(&mut conn)
            .await
            .expect("list")
            .is_empty()
    );
}

async fn expired_claims_are_quarantined<C: TestConnection>(db: TestDatabase<C>) {
    let downstream = Downstream::start().await.expect("start downstream");
    let order = Order::new("withdrawal-1");
    {
        let mut conn = db.connect().await.expect("connect");
        let script = Script::hold_after_call();
        let held = Arc::clone(&script);
        let (downstream, order) = (downstream.clone(), order.clone());
        let delivery = tokio::spawn(async move {
            let _ = withdraw(&mut conn, &downstream, &order, SHORT_LEASE, &held).await;
        });
        script.called.notified().await;
        delivery.abort();
        let _ = delivery.await;
    }
    tokio::time::sleep(SHORT_LEASE + Duration::from_millis(300)).await;
    let mut conn = db.connect().await.expect("connect");
    let refused = withdraw(&mut conn, &downstream, &order, SHORT_LEASE, &Script::run())
        .await
        .expect_err("quarantined");
    assert_eq!(
        InboxError::find(refused.database()),
        Some(&InboxError::Claim(ClaimError::Quarantined { attempts: 1 }))
    );
    assert_eq!(downstream.calls(), 1, "never called twice without a person");
    let refused = Err::<Outcome<u32>, _>(refused);
    assert!(matches!(
        Disposition::of(&refused),
        Disposition::DeadLetter { .. }
    ));
    let stale = claims::list_stale(&mut conn).await.expect("list");
    assert_eq!(stale.len(), 1, "{stale:?}");
    assert!(!stale[0].released);
    assert!(
        stale[0].idle > Duration::ZERO && stale[0].age >= stale[0].idle,
        "{stale:?}"
    );
    // A person finds the withdrawal went through downstream.
    assert!(
        claims::complete_by_hand(&mut conn, "withdrawal", "withdrawal-1")
            .await
            .expect("complete")
    );
    let after = withdraw(&mut conn, &downstream, &order, SHORT_LEASE, &Script::run()).await;
    assert_eq!(after.expect("duplicate"), Outcome::Duplicate);
    assert_eq!(downstream.calls(), 1);
}

async fn fingerprints_tell_reuse_from_redelivery<C: TestConnection>(db: TestDatabase<C>) {
    let downstream = Downstream::start().await.expect("start downstream");
    let order = Order::new("fingerprinted");
    let mut conn = db.connect().await.expect("connect");
    let first = deliver(&mut conn, &downstream, &order, LONG_LEASE, &Script::run()).await;
    assert_eq!(first.expect("first"), Outcome::Processed(1));
    let same = deliver(&mut conn, &downstream, &order, LONG_LEASE, &Script::run()).await;
    assert_eq!(same.expect("same payload"), Outcome::Duplicate);
    let reused = Order {
        payload: String::from("{\"order\":\"fingerprinted\",\"amount\":999}"),
        ..order
    };
    let mismatch = deliver(&mut conn, &downstream, &reused, LONG_LEASE, &Script::run())
        .await
        .expect_err("another payload");
    let Some(InboxError::FingerprintMismatch(found)) = InboxError::find(mismatch.database()) else {
        panic!("a fingerprint mismatch: {mismatch}");
    };
    assert_eq!(found.message_id, "fingerprinted");
    assert_eq!(classify(mismatch.database()), ErrorClass::Permanent);
    assert_eq!(
        downstream.calls(),
        1,
        "the body never ran for the other payload"
    );
}

async fn a_lease_out_of_range_writes_nothing<C: TestConnection>(db: TestDatabase<C>) {
    let downstream = Downstream::start().await.expect("start downstream");
    let mut conn = db.connect().await.expect("connect");
    let order = Order::new("no-lease");
    for lease in [Duration::ZERO, Duration::from_secs(8 * 24 * 3600)] {
        let refused = deliver(&mut conn, &downstream, &order, lease, &Script::run())
            .await
            .expect_err("no such lease");
        assert_eq!(
            InboxError::find(refused.database()),
            Some(&InboxError::Claim(ClaimError::InvalidLease { lease }))
        );
        assert_eq!(classify(refused.database()), ErrorClass::Permanent);
    }
    let markers = select_i64(&mut conn, "SELECT COUNT(*) FROM inbox")
        .await
        .expect("count");
    assert_eq!((markers, downstream.calls()), (0, 0));
}

async fn live_claims_are_never_pruned<C: TestConnection>(db: TestDatabase<C>) {
    let downstream = Downstream::start().await.expect("start downstream");
    let mut conn = db.connect().await.expect("connect");
    let done = Order::new("completed");
    let outcome = deliver(&mut conn, &downstream, &done, LONG_LEASE, &Script::run()).await;
    assert_eq!(outcome.expect("completed"), Outcome::Processed(1));
    let open = Order::new("open");
    die_inside_the_body(
        &db,
        &downstream,
        &open,
        LONG_LEASE,
        Script::hold_before_call(),
    )
    .await;
    // SQLite keeps `processed_at` in whole seconds.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let pruned = diesel_inbox::prune(&mut conn, Duration::ZERO)
        .await
        .expect("prune");
    assert_eq!(pruned, 1, "only the completed marker goes");
    let left = select_i64(
        &mut conn,
        "SELECT COUNT(*) FROM inbox WHERE message_id = 'open'",
    )
    .await
    .expect("count");
    assert_eq!(left, 1);
    let redelivered = deliver(&mut conn, &downstream, &open, LONG_LEASE, &Script::run()).await;
    assert!(redelivered.expect("in progress").is_in_progress());
}

/// The transactional mode with a fingerprint: a reused key with another payload is
/// refused before the body's writes commit, with the fast path and without.
#[idempotent(consumer = "fingerprinted-ledger", key = entry.0, fingerprint = entry.1, fast_path = read_first)]
async fn record<C>(conn: &mut C, entry: (&str, &str), read_first: bool) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    conn.batch_execute(&format!(
        "INSERT INTO ledger (entry) VALUES ('{}')",
        entry.0
    ))
    .await
}

async fn fingerprints_in_transactional_mode<C: TestConnection>(db: TestDatabase<C>) {
    let mut conn = db.connect().await.expect("connect");
    conn.batch_execute("CREATE TABLE ledger (entry VARCHAR(100) NOT NULL)")
        .await
        .expect("ledger");
    for read_first in [false, true] {
        let key = if read_first {
            "entry-read-first"
        } else {
            "entry"
        };
        assert_eq!(
            record(&mut conn, (key, "payload"), read_first)
                .await
                .expect("first"),
            Outcome::Processed(())
        );
        assert_eq!(
            record(&mut conn, (key, "payload"), read_first)
                .await
                .expect("same"),
            Outcome::Duplicate
        );
        let mismatch = record(&mut conn, (key, "other payload"), read_first)
            .await
            .expect_err("another payload");
        assert!(
            matches!(
                InboxError::find(&mismatch),
                Some(InboxError::FingerprintMismatch(_))
            ),
            "{mismatch}"
        );
        assert_eq!(classify(&mismatch), ErrorClass::Permanent);
    }
    let entries = select_i64(&mut conn, "SELECT COUNT(*) FROM ledger")
        .await
        .expect("count");
    assert_eq!(entries, 2);
}

/// A transactional handler as 0.1 had it: no fingerprint. Against a table of 0.1 its
/// statements fail, retryably, until `migrate` has added the claim columns, which its
/// insert names to tell the crate's inbox from another table of that name.
#[idempotent(consumer = "ledger-v01", key = entry, fast_path = read_first)]
async fn record_as_in_v01<C>(conn: &mut C, entry: &str, read_first: bool) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    conn.batch_execute(&format!("INSERT INTO ledger (entry) VALUES ('{entry}')"))
        .await
}

/// The table 0.1's `migrate` created, for each backend.
fn v01_inbox<C: TestConnection>() -> &'static str {
    match backend_name::<C>() {
        "postgres" => include_str!(
            "../../inbox-runtime/migrations/postgres/2026-11-30-000000_create_inbox/up.sql"
        ),
        "mysql" => {
            include_str!(
                "../../inbox-runtime/migrations/mysql/2026-11-30-000000_create_inbox/up.sql"
            )
        }
        _ => include_str!(
            "../../inbox-runtime/migrations/sqlite/2026-11-30-000000_create_inbox/up.sql"
        ),
    }
}

async fn upgrade_in_place_while_handlers_run<C: TestConnection>(db: TestDatabase<C>) {
    let mut conn = db.connect().await.expect("connect");
    conn.batch_execute("DROP TABLE inbox").await.expect("drop");
    conn.batch_execute(v01_inbox::<C>())
        .await
        .expect("0.1's inbox");
    conn.batch_execute("CREATE TABLE ledger (entry VARCHAR(100) NOT NULL)")
        .await
        .expect("ledger");
    // What 0.1's handlers wrote: a marker and its effect, in one transaction each.
    for n in 0..50 {
        conn.batch_execute(&format!(
            "INSERT INTO inbox (message_id, consumer) VALUES ('old-{n}', 'ledger-v01'); \
             INSERT INTO ledger (entry) VALUES ('old-{n}')"
        ))
        .await
        .expect("0.1 marker");
    }
    // Handlers keep delivering old messages again and new ones while instances start up
    // and upgrade the table at the same time.
    let handlers: Vec<_> = (0..3)
        .map(|worker| {
            let db = db.clone();
            tokio::spawn(async move {
                let mut conn = db.connect().await.expect("connect");
                let mut processed = Vec::new();
                for n in 0..60 {
                    let entry = if n % 2 == 0 {
                        format!("old-{}", n % 50)
                    } else {
                        format!("new-{n}")
                    };
                    // Until an upgrade has added the digest, the fast path's lookup
                    // fails, retryably; so can a wait that the upgrade's lock ends, in a
                    // deadlock or a busy database. The delivery is retried after a
                    // pause, as a broker would, for as long as the upgrades may take.
                    let mut last_error = None;
                    for retry in 0.. {
                        assert!(retry < 200, "{entry} never settled: {last_error:?}");
                        match record_as_in_v01(&mut conn, &entry, worker == 0).await {
                            Ok(outcome) => {
                                if outcome.is_processed() {
                                    processed.push(entry.clone());
                                }
                                break;
                            }
                            Err(error) if classify(&error).is_retryable() => {
                                last_error = Some(error.to_string());
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                            Err(error) => panic!("{entry}: {error}"),
                        }
                    }
                }
                processed
            })
        })
        .collect();
    let upgrades: Vec<_> = (0..3)
        .map(|_| {
            let db = db.clone();
            tokio::spawn(async move {
                let mut conn = db.connect().await.expect("connect");
                diesel_inbox::migrate(&mut conn).await
            })
        })
        .collect();
    for upgrade in upgrades {
        upgrade.await.expect("upgrade").expect("migrate");
    }
    let mut processed = Vec::new();
    for handler in handlers {
        processed.extend(handler.await.expect("handler"));
    }
    processed.sort();
    assert!(
        processed.iter().all(|entry| entry.starts_with("new-")),
        "0.1's markers must stay duplicates: {processed:?}"
    );
    let distinct = processed.len();
    processed.dedup();
    assert_eq!(processed.len(), distinct, "a new message processed twice");
    let entries = select_i64(&mut conn, "SELECT COUNT(*) FROM ledger")
        .await
        .expect("count");
    assert_eq!(entries, 50 + 30, "each message applied once");
    // The upgraded table takes claims and fingerprints.
    let downstream = Downstream::start().await.expect("start downstream");
    let order = Order::new("after-upgrade");
    let claimed = deliver(&mut conn, &downstream, &order, LONG_LEASE, &Script::run()).await;
    assert_eq!(claimed.expect("claim mode"), Outcome::Processed(1));
    diesel_inbox::migrate(&mut conn)
        .await
        .expect("again, nothing to do");
}

/// Runs a scenario to its end, or fails it: a bug must end in a red test, never a hang.
async fn bounded<T>(scenario: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(120), scenario)
        .await
        .expect("the scenario did not finish within two minutes")
}

/// The URL in `variable`; the backend is skipped without it, except under CI (`CI`
/// set), where it fails.
fn server_url(variable: &str) -> Option<String> {
    match std::env::var(variable) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var_os("CI").is_some() => {
            panic!("{variable} is not set, and CI runs every suite")
        }
        _ => {
            eprintln!("SKIPPED on this backend: {variable} is not set");
            None
        }
    }
}

/// A transactional handler under the consumer name of an earlier release's claim-mode
/// handler (`inbox_test_refunds::switched_claim`).
#[idempotent(consumer = "switched", key = id)]
async fn switched<C>(conn: &mut C, id: u64, runs: &AtomicUsize) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let _ = (conn, id);
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// [`switched`] as a batch handler.
#[idempotent(consumer = "switched-batch", batch = ids, key = |id| *id)]
async fn switched_batch<C>(conn: &mut C, ids: &[u64], runs: &AtomicUsize) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let _ = conn;
    runs.fetch_add(ids.len(), Ordering::SeqCst);
    Ok(())
}

/// [`switched`], reading the inbox before its transaction.
#[idempotent(consumer = "switched-read", key = id, fast_path = true)]
async fn switched_read<C>(conn: &mut C, id: u64, runs: &AtomicUsize) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let _ = (conn, id);
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// A consumer moved out of claim mode meets the claims its earlier release left
/// unfinished (here, released after a failed body): whether that body made its call is
/// not known, so it is neither processed again nor acknowledged as a duplicate (which
/// lost the message), but `ClaimError::Unfinished`, retried.
async fn unfinished_claims_of_an_earlier_mode<C: TestConnection>(db: TestDatabase<C>) {
    let mut conn = db.connect().await.expect("connect");
    assert!(
        inbox_test_refunds::switched_claim(&mut conn, 7)
            .await
            .is_err()
    );
    assert!(
        inbox_test_refunds::switched_batch_claim(&mut conn, 7)
            .await
            .is_err()
    );
    assert!(
        inbox_test_refunds::switched_read_claim(&mut conn, 7)
            .await
            .is_err()
    );
    let runs = AtomicUsize::new(0);
    let unfinished = |error: &Error| {
        InboxError::find(error) == Some(&InboxError::Claim(ClaimError::Unfinished))
            && classify(error) == ErrorClass::Transient
    };
    let single = switched(&mut conn, 7, &runs).await;
    assert!(
        matches!(&single, Err(error) if unfinished(error)),
        "{single:?}"
    );
    let batch = switched_batch(&mut conn, &[7, 8], &runs).await;
    assert!(
        matches!(&batch, Err(error) if unfinished(error)),
        "{batch:?}"
    );
    let read = switched_read(&mut conn, 7, &runs).await;
    assert!(matches!(&read, Err(error) if unfinished(error)), "{read:?}");
    assert_eq!(runs.into_inner(), 0);
}

macro_rules! on_every_backend {
    ($($scenario:ident,)*) => {
        mod postgres {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() {
                let Some(url) = super::server_url("POSTGRES_URL") else { return };
                let name = concat!("claim_", stringify!($scenario));
                let db = super::TestDatabase::postgres(&url, name).await.expect("schema");
                super::bounded(super::$scenario(db.clone())).await;
                db.cleanup().await.expect("cleanup");
            }
        )*}
        mod mysql {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() {
                let Some(url) = super::server_url("MYSQL_URL") else { return };
                let name = concat!("claim_", stringify!($scenario));
                let db = super::TestDatabase::mysql(&url, name).await.expect("database");
                super::bounded(super::$scenario(db.clone())).await;
                db.cleanup().await.expect("cleanup");
            }
        )*}
        mod sqlite {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() {
                let name = concat!("claim_", stringify!($scenario));
                let db = super::TestDatabase::sqlite(name).await.expect("file");
                super::bounded(super::$scenario(db.clone())).await;
                db.cleanup().await.expect("cleanup");
            }
        )*}
    };
}

on_every_backend!(
    race,
    race_catches_the_naive_handler,
    crash_after_the_claim,
    crash_after_the_claim_in_a_killed_process,
    crash_after_the_call,
    outliving_the_lease_loses_the_claim,
    a_renewed_claim_outlives_its_first_lease,
    many_takers,
    failing_body_releases_the_claim,
    attempts_are_limited,
    expired_claims_are_quarantined,
    fingerprints_tell_reuse_from_redelivery,
    live_claims_are_never_pruned,
    a_lease_out_of_range_writes_nothing,
    fingerprints_in_transactional_mode,
    upgrade_in_place_while_handlers_run,
    body_left_in_a_transaction,
    handlers_inside_a_claim_see_no_claim,
    a_stale_holder_never_settles_the_takers_claim,
    unfinished_claims_of_an_earlier_mode,
);

/// A MySQL session with autocommit off, as a server's `autocommit = 0` or an
/// `init_connect` leaves every session: the claim and its completion still commit on
/// their own, and the session gets its setting back.
async fn a_session_without_autocommit(db: TestDatabase<diesel_async::AsyncMysqlConnection>) {
    let downstream = Downstream::start().await.expect("start downstream");
    let order = Order::new("without-autocommit");
    let mut holder = db.connect().await.expect("connect");
    holder
        .batch_execute("SET autocommit = 0")
        .await
        .expect("autocommit off");
    let script = Script::hold_before_call();
    let (called, held_order, held) = (downstream.clone(), order.clone(), Arc::clone(&script));
    let delivery = tokio::spawn(async move {
        let outcome = deliver(&mut holder, &called, &held_order, LONG_LEASE, &held).await;
        (outcome, holder)
    });
    script.claimed.notified().await;

    // Another consumer sees the claim at once, instead of waiting on the lock of an
    // insert that nobody commits.
    let mut other = db.connect().await.expect("connect");
    other
        .batch_execute("SET innodb_lock_wait_timeout = 1")
        .await
        .expect("short lock waits");
    let meanwhile = deliver(&mut other, &downstream, &order, LONG_LEASE, &Script::run()).await;
    assert!(
        matches!(meanwhile, Ok(Outcome::InProgress { .. })),
        "the claim is not visible to other sessions: {meanwhile:?}"
    );
    script.proceed.notify_one();
    let (outcome, mut holder) = delivery.await.expect("holder");
    assert!(matches!(outcome, Ok(Outcome::Processed(1))), "{outcome:?}");

    // Completed for every session, not in a transaction the holder left open.
    let after = deliver(&mut other, &downstream, &order, LONG_LEASE, &Script::run()).await;
    assert!(matches!(after, Ok(Outcome::Duplicate)), "{after:?}");
    assert_eq!(downstream.calls(), 1);
    let autocommit = select_i64(&mut holder, "SELECT @@autocommit").await;
    assert_eq!(
        autocommit.expect("read autocommit"),
        0,
        "the session's setting is back"
    );
}

/// Records the order, in a transaction with its marker.
#[idempotent(consumer = "order-record", key = order.id.as_str())]
async fn record_order(
    conn: &mut diesel_async::AsyncMysqlConnection,
    order: &Order,
) -> Result<(), Error> {
    conn.batch_execute("DO 0").await
}

/// A claim whose body records the order through a transactional handler, on the
/// claim's own connection.
#[idempotent(consumer = "claimed-record", key = order.id.as_str(), claim)]
async fn claim_then_record(
    conn: &mut diesel_async::AsyncMysqlConnection,
    order: &Order,
) -> Result<(), TestError> {
    let recorded = record_order(conn, order).await?;
    assert_eq!(recorded, Outcome::Processed(()));
    Ok(())
}

/// A claim's body may run a transactional handler on the claim's connection: each puts
/// back the autocommit setting it found, so a session with autocommit off still has it
/// off afterwards, rather than the claim restoring what the handler left.
async fn a_handler_inside_a_claim_keeps_the_session(
    db: TestDatabase<diesel_async::AsyncMysqlConnection>,
) {
    let mut conn = db.connect().await.expect("connect");
    conn.batch_execute("SET autocommit = 0")
        .await
        .expect("autocommit off");
    let outcome = claim_then_record(&mut conn, &Order::new("claimed-record")).await;
    assert!(matches!(outcome, Ok(Outcome::Processed(()))), "{outcome:?}");
    let autocommit = select_i64(&mut conn, "SELECT @@autocommit").await;
    assert_eq!(
        autocommit.expect("read autocommit"),
        0,
        "the session's setting is back"
    );
}

mod mysql_only {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_handler_inside_a_claim_keeps_the_session() {
        let Some(url) = super::server_url("MYSQL_URL") else {
            return;
        };
        let name = "claim_a_handler_inside_a_claim";
        let db = super::TestDatabase::mysql(&url, name)
            .await
            .expect("database");
        super::bounded(super::a_handler_inside_a_claim_keeps_the_session(
            db.clone(),
        ))
        .await;
        db.cleanup().await.expect("cleanup");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_session_without_autocommit() {
        let Some(url) = super::server_url("MYSQL_URL") else {
            return;
        };
        let name = "claim_a_session_without_autocommit";
        let db = super::TestDatabase::mysql(&url, name)
            .await
            .expect("database");
        super::bounded(super::a_session_without_autocommit(db.clone())).await;
        db.cleanup().await.expect("cleanup");
    }
}
