//! Scenarios shared by the PostgreSQL, MySQL/MariaDB and SQLite suites.
//!
//! Each suite provides a [`TestDb`]: a database of its own (a schema, a database or a
//! file) so that suites running at the same time never see each other's inbox.

use std::fmt::Debug;
use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel::connection::InstrumentationEvent;
use diesel::result::{DatabaseErrorKind, Error};
use diesel_async::{AsyncConnection, SimpleAsyncConnection};
use diesel_inbox::testing::{TestConnection, TestDatabase, select_i64};
use diesel_inbox::{ErrorClass, InboxBackend, Outcome, classify, idempotent};
pub use inbox_fixtures::credit::Credit;
use inbox_fixtures::credit::CreditTables;
use tokio::sync::{Barrier, Notify};

#[macro_use]
pub mod batch;
#[macro_use]
pub mod keys;
#[macro_use]
pub mod outbox;
#[macro_use]
pub mod verdicts;

/// A database a test has to itself, and what its suite knows about the backend.
pub trait TestDb: Clone + Send + Sync + 'static {
    type Conn: TestConnection + CreditTables;

    /// The test's own schema, database or file, with the inbox migrated.
    fn database(&self) -> &TestDatabase<Self::Conn>;

    /// How many connections of this test are waiting for another transaction's lock,
    /// where the database can tell (SQLite waits inside its busy handler, out of sight).
    fn lock_waiters(&self) -> impl Future<Output = Option<i64>> + Send;

    /// Delivers `credit` to the handler of the races and the cancellations, which acts
    /// as `gate` says: by default the generic [`gated_credit`], whose transaction begins
    /// as a connection of any type can.
    fn credit(
        conn: &mut Self::Conn,
        credit: &Credit,
        gate: &Gate,
    ) -> impl Future<Output = Result<Outcome<()>, Error>> + Send {
        gated_credit(conn, credit, gate)
    }

    /// Delivers a batch to the batch race's handler: by default the generic
    /// [`batch::batch_credit`].
    fn batch_credit(
        conn: &mut Self::Conn,
        credits: &[Credit],
    ) -> impl Future<Output = Result<diesel_inbox::BatchOutcome<usize>, Error>> + Send {
        batch::batch_credit(conn, credits)
    }

    fn connect(&self) -> impl Future<Output = Self::Conn> + Send {
        async {
            self.database()
                .connect()
                .await
                .expect("connect to the test database")
        }
    }

    /// Drops what the test created. A test that panicked leaves its database behind; the
    /// next run of the same test drops it before starting.
    fn cleanup(self) -> impl Future<Output = ()> + Send {
        async move {
            self.database()
                .clone()
                .cleanup()
                .await
                .expect("remove the test database")
        }
    }
}

/// Reads the URL of a server suite, or says once why the suite is skipped. Under CI
/// (`CI` set), where every server runs, a missing URL fails the test instead.
pub fn server_url(variable: &str, example: &str) -> Option<String> {
    static SAID: std::sync::Once = std::sync::Once::new();
    match std::env::var(variable) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var_os("CI").is_some() => {
            panic!(
                "{variable} is not set, and CI runs every suite (for example {variable}={example})"
            )
        }
        _ => {
            // Straight to stderr: libtest captures `eprintln!` of passing tests.
            SAID.call_once(|| {
                let _ = writeln!(
                    std::io::stderr(),
                    "\nSKIPPED: every test of this suite, because {variable} is not set \
                     (for example {variable}={example})\n"
                );
            });
            None
        }
    }
}

/// A connection of `db` with `settings` (session statements) applied.
pub async fn connect_with<D: TestDb>(db: &D, settings: &str) -> D::Conn {
    let mut conn = db.connect().await;
    conn.batch_execute(settings)
        .await
        .expect("session settings");
    conn
}

/// The business write: the message's account gains its amount.
pub async fn apply<C: AsyncConnection>(conn: &mut C, credit: &Credit) -> Result<(), Error> {
    conn.batch_execute(&format!(
        "UPDATE accounts SET balance = balance + {} WHERE id = {}",
        credit.amount, credit.account
    ))
    .await
}

/// The handler under test. It reads the inbox first or not, applies the credit, then
/// waits at `gate` and succeeds or fails, all as the gate says; [`credit`] and
/// [`credit_reading_first`] pass an open gate.
#[idempotent(consumer = "credit", key = credit.message_id.as_str(), fast_path = gate.read_first)]
pub async fn gated_credit<C>(conn: &mut C, credit: &Credit, gate: &Gate) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    // Real handlers do work between reading and writing; it widens every race.
    tokio::time::sleep(Duration::from_millis(1)).await;
    apply(conn, credit).await?;
    if gate.hold {
        gate.entered.notify_one();
        gate.release.notified().await;
    }
    if gate.fail {
        return Err(Error::RollbackTransaction);
    }
    Ok(())
}

/// Delivers `credit` straight to the transaction: a duplicate is found by the marker insert.
pub async fn credit<C>(conn: &mut C, credit: &Credit) -> Result<Outcome<()>, Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    gated_credit(conn, credit, &Gate::new(false, false)).await
}

/// Delivers `credit` through the fast path: a committed marker is found by a read first.
pub async fn credit_reading_first<C>(conn: &mut C, credit: &Credit) -> Result<Outcome<()>, Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    gated_credit(conn, credit, &Gate::new(false, false).reading_first()).await
}

#[idempotent(consumer = "audit", key = credit.message_id.as_str())]
pub async fn audit<C>(conn: &mut C, credit: &Credit) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    apply(conn, credit).await
}

/// The check-then-insert handler most people write first, on a table without a unique
/// index. The race test must catch it.
pub async fn naive_credit<D: TestDb>(
    conn: &mut D::Conn,
    credit: &Credit,
) -> Result<Outcome<()>, Error> {
    let seen = select_i64(
        conn,
        &format!(
            "SELECT COUNT(*) FROM naive_inbox WHERE message_id = '{}' AND consumer = 'naive'",
            credit.message_id
        ),
    )
    .await?;
    if seen > 0 {
        return Ok(Outcome::Duplicate);
    }
    conn.transaction(async |conn| {
        conn.batch_execute(&format!(
            "INSERT INTO naive_inbox (message_id, consumer) VALUES ('{}', 'naive')",
            credit.message_id
        ))
        .await?;
        tokio::time::sleep(Duration::from_millis(1)).await;
        apply(conn, credit).await
    })
    .await?;
    Ok(Outcome::Processed(()))
}

/// The credit workload's tables with accounts `0..accounts`, and a ledger, beside the
/// inbox the test database was created with.
pub async fn create_tables<D: TestDb>(db: &D, accounts: i64) {
    let mut conn = db.connect().await;
    conn.create_credit_tables(accounts)
        .await
        .expect("create the credit tables");
    conn.batch_execute("CREATE TABLE ledger (entry VARCHAR(100) NOT NULL UNIQUE)")
        .await
        .expect("create the ledger");
}

/// Balances of accounts `0..n`, in order.
pub async fn balances<D: TestDb>(db: &D, n: i64) -> Vec<i64> {
    let mut balances = db.connect().await.balances().await.expect("balances");
    balances.truncate(n as usize);
    balances
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    Idempotent,
    Naive,
}

#[derive(Debug, Default)]
pub struct RaceReport {
    pub processed: usize,
    pub duplicates: usize,
    pub transient_retries: usize,
    /// Messages whose effect was applied more or less than once.
    pub wrong: Vec<(i64, i64)>,
}

impl RaceReport {
    /// Adds up the workers' reports, then finds the messages among the first `messages`
    /// whose effect was applied other than once.
    pub async fn of_workers<D: TestDb>(
        db: &D,
        messages: i64,
        workers: Vec<tokio::task::JoinHandle<RaceReport>>,
    ) -> RaceReport {
        let mut total = RaceReport::default();
        for worker in workers {
            let report = worker.await.expect("worker panicked");
            total.processed += report.processed;
            total.duplicates += report.duplicates;
            total.transient_retries += report.transient_retries;
        }
        total.wrong = balances(db, messages)
            .await
            .into_iter()
            .enumerate()
            .filter(|(_, balance)| *balance != 1)
            .map(|(id, balance)| (id as i64, balance))
            .collect();
        total
    }
}

/// How often one delivery may meet a transient error before the test gives up: a bug that
/// makes every delivery fail must end in a red test, not a test that never ends.
pub const MAX_REDELIVERIES: usize = 50;

/// What a pump does with a delivery's result: `Some` once it settled; `None` when the
/// handler failed with a retryable error, to deliver it again to the same worker, as a
/// broker would, a bounded number of times (counted in `retries`).
pub fn settled<T>(result: Result<T, Error>, what: &impl Debug, retries: &mut usize) -> Option<T> {
    match result {
        Ok(settled) => Some(settled),
        Err(error) if classify(&error).is_retryable() => {
            *retries += 1;
            assert!(
                *retries < MAX_REDELIVERIES,
                "{what:?} failed {retries} times in a row: {error}"
            );
            None
        }
        Err(error) => panic!("{what:?} failed: {error}"),
    }
}

/// The delay a disposition retries after (`Some(after)`), or `None` where it does not
/// retry: what a verdict test compares, the reason being the error's own text.
pub fn retry_delay(disposition: &diesel_inbox::Disposition) -> Option<Option<Duration>> {
    match disposition {
        diesel_inbox::Disposition::Retry { after, .. } => Some(*after),
        _ => None,
    }
}

/// Every worker, each on its own connection, receives every message, and all workers
/// start each message together: every message is delivered `workers` times at once.
/// Odd workers read the inbox first, even ones go straight to the transaction. Transient
/// errors are redelivered to the same worker, as a broker would, a bounded number of
/// times.
pub async fn race<D: TestDb>(
    db: Arc<D>,
    handler: Handler,
    workers: usize,
    messages: i64,
) -> RaceReport {
    create_tables(&*db, messages).await;
    let barrier = Arc::new(Barrier::new(workers));
    let mut tasks = Vec::new();
    for worker in 0..workers {
        let db = Arc::clone(&db);
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            let mut conn = db.connect().await;
            let mut report = RaceReport::default();
            for n in 0..messages {
                let message = Credit::numbered(n);
                barrier.wait().await;
                let mut retries = 0;
                let outcome = loop {
                    let result = match handler {
                        Handler::Idempotent if worker % 2 == 1 => {
                            let gate = Gate::new(false, false).reading_first();
                            D::credit(&mut conn, &message, &gate).await
                        }
                        Handler::Idempotent => {
                            D::credit(&mut conn, &message, &Gate::new(false, false)).await
                        }
                        Handler::Naive => naive_credit::<D>(&mut conn, &message).await,
                    };
                    if let Some(outcome) = settled(result, &message, &mut retries) {
                        break outcome;
                    }
                };
                report.transient_retries += retries;
                match outcome {
                    Outcome::Processed(()) => report.processed += 1,
                    Outcome::Duplicate => report.duplicates += 1,
                    Outcome::InProgress { .. } => {
                        panic!("a transactional handler returned InProgress")
                    }
                }
            }
            report
        }));
    }
    RaceReport::of_workers(&*db, messages, tasks).await
}

pub async fn races_apply_each_message_exactly_once<D: TestDb>(db: D) {
    let (workers, messages) = (6, 60);
    let report = race(Arc::new(db), Handler::Idempotent, workers, messages).await;
    assert_eq!(
        report.wrong,
        vec![],
        "messages applied other than once: {report:?}"
    );
    assert_eq!(report.processed, messages as usize, "{report:?}");
    assert_eq!(
        report.processed + report.duplicates,
        workers * messages as usize,
        "every delivery is either processed or a duplicate: {report:?}"
    );
}

pub async fn race_catches_the_naive_handler<D: TestDb>(db: D) {
    let report = race(Arc::new(db), Handler::Naive, 6, 30).await;
    assert!(
        report.wrong.iter().any(|(_, balance)| *balance > 1),
        "the race must make the naive handler apply some message twice: {report:?}"
    );
}

/// Whether a delivery reads the inbox first, where its handler stops inside its body
/// until released, and whether it then fails.
pub struct Gate {
    pub entered: Notify,
    pub release: Notify,
    pub hold: bool,
    pub fail: bool,
    pub read_first: bool,
}

impl Gate {
    pub fn new(hold: bool, fail: bool) -> Self {
        Self {
            entered: Notify::new(),
            release: Notify::new(),
            hold,
            fail,
            read_first: false,
        }
    }

    /// The same gate for a delivery that takes the fast path.
    pub fn reading_first(self) -> Self {
        Self {
            read_first: true,
            ..self
        }
    }

    pub fn held(fail: bool) -> Arc<Self> {
        Arc::new(Self::new(true, fail))
    }
}

/// Waits until a connection of this test is seen waiting for a lock. SQLite waits in its
/// busy handler, out of sight: there B is given 300 ms to get there, and the test then
/// shows only that B did not finish while A held the key, not that B ever waited.
async fn until_a_lock_waits<D: TestDb>(db: &D) {
    for _ in 0..500 {
        match db.lock_waiters().await {
            Some(waiting) if waiting > 0 => return,
            Some(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            None => return tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
    panic!("no delivery ever waited for the transaction holding the key");
}

/// A is inside its body, marker inserted, when B arrives: B waits for A's outcome, then
/// is a duplicate if A committed and processes the message if A rolled back. B finds
/// the duplicate with the marker insert, or with a read first.
pub async fn forced_overlap<D: TestDb>(db: D, first_commits: bool, b_reads_first: bool) {
    create_tables(&db, 1).await;
    let conn_b = db.connect().await;
    let (first, second) = overlap(&db, conn_b, 0, first_commits, b_reads_first).await;
    let second = second.expect("B");
    if first_commits {
        assert_eq!(first.expect("A"), Outcome::Processed(()));
        assert_eq!(second, Outcome::Duplicate);
    } else {
        assert!(
            matches!(first, Err(Error::RollbackTransaction)),
            "{first:?}"
        );
        assert_eq!(second, Outcome::Processed(()));
    }
    assert_eq!(balances(&db, 1).await, vec![1]);
}

/// Delivers message `n` to A, which holds its marker inside the body, then to B on
/// `conn_b` (configured by the caller), and releases A, to commit or roll back, once B
/// waits for A's lock. Returns both results. The tables must exist.
pub async fn overlap<D: TestDb>(
    db: &D,
    conn_b: D::Conn,
    n: i64,
    first_commits: bool,
    b_reads_first: bool,
) -> (Result<Outcome<()>, Error>, Result<Outcome<()>, Error>) {
    let (first, gate) = hold_marker(db, n, first_commits).await;
    let second = tokio::spawn(deliver(conn_b, n, b_reads_first));
    until_a_lock_waits(db).await;
    assert!(
        !second.is_finished(),
        "B must wait while A holds the marker"
    );
    gate.release.notify_one();
    (first.await.unwrap(), second.await.unwrap())
}

/// Delivers message `n` to B on `conn_b` while A holds its marker, and releases A (to
/// roll back) only once B has returned: B's wait ends however B's session ends it.
pub async fn wait_cut_short<D: TestDb>(
    db: &D,
    conn_b: D::Conn,
    n: i64,
    b_reads_first: bool,
) -> Result<Outcome<()>, Error> {
    let (first, gate) = hold_marker(db, n, false).await;
    let second = deliver(conn_b, n, b_reads_first).await;
    gate.release.notify_one();
    assert!(matches!(
        first.await.unwrap(),
        Err(Error::RollbackTransaction)
    ));
    second
}

type Delivery = tokio::task::JoinHandle<Result<Outcome<()>, Error>>;

/// Delivers message `n` to A, and returns once A holds its marker inside the body, with
/// the gate that releases A to commit or roll back.
pub async fn hold_marker<D: TestDb>(db: &D, n: i64, commits: bool) -> (Delivery, Arc<Gate>) {
    let gate = Gate::held(!commits);
    let mut conn = db.connect().await;
    let first = {
        let gate = Arc::clone(&gate);
        tokio::spawn(async move { gated_credit(&mut conn, &Credit::numbered(n), &gate).await })
    };
    gate.entered.notified().await;
    (first, gate)
}

async fn deliver<C>(mut conn: C, n: i64, read_first: bool) -> Result<Outcome<()>, Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let gate = Gate::new(false, false);
    let gate = if read_first {
        gate.reading_first()
    } else {
        gate
    };
    gated_credit(&mut conn, &Credit::numbered(n), &gate).await
}

pub async fn failure_rolls_back_everything<D: TestDb>(db: D) {
    create_tables(&db, 1).await;
    let mut conn = db.connect().await;
    let message = Credit::numbered(0);
    let failed = gated_credit(&mut conn, &message, &Gate::new(false, true)).await;
    assert!(
        matches!(failed, Err(Error::RollbackTransaction)),
        "{failed:?}"
    );
    assert_eq!(
        balances(&db, 1).await,
        vec![0],
        "business write rolled back"
    );
    assert_eq!(
        select_i64(&mut conn, "SELECT COUNT(*) FROM inbox")
            .await
            .unwrap(),
        0,
        "no marker"
    );

    assert_eq!(
        credit(&mut conn, &message).await.unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(
        credit(&mut conn, &message).await.unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(
        credit_reading_first(&mut conn, &message).await.unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(balances(&db, 1).await, vec![1]);
}

pub async fn consumers_are_independent<D: TestDb>(db: D) {
    create_tables(&db, 1).await;
    let mut conn = db.connect().await;
    let message = Credit::numbered(0);
    assert_eq!(
        credit(&mut conn, &message).await.unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(
        audit(&mut conn, &message).await.unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(
        audit(&mut conn, &message).await.unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(balances(&db, 1).await, vec![2]);
}

#[idempotent(consumer = "ledger", key = credit.message_id.as_str())]
pub async fn record_in_ledger<C>(conn: &mut C, credit: &Credit) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    conn.batch_execute(&format!(
        "INSERT INTO ledger (entry) VALUES ('account-{}')",
        credit.account
    ))
    .await
}

/// A unique violation raised by the business write is an error, never a duplicate.
pub async fn business_unique_violation_is_not_a_duplicate<D: TestDb>(db: D) {
    create_tables(&db, 1).await;
    let mut conn = db.connect().await;
    let first = Credit {
        message_id: "m-1".into(),
        account: 7,
        amount: 1,
    };
    let second = Credit {
        message_id: "m-2".into(),
        account: 7,
        amount: 1,
    };
    assert_eq!(
        record_in_ledger(&mut conn, &first).await.unwrap(),
        Outcome::Processed(())
    );
    let error = record_in_ledger(&mut conn, &second)
        .await
        .expect_err("ledger entry exists");
    assert_eq!(classify(&error), ErrorClass::Permanent, "{error}");
    assert_eq!(
        select_i64(&mut conn, "SELECT COUNT(*) FROM inbox")
            .await
            .unwrap(),
        1
    );
}

/// Applies the credit and records a ledger entry for the account unless one is there:
/// the insert runs in a nested transaction, a savepoint, so that its failure leaves the
/// handler's transaction usable.
#[idempotent(consumer = "ledger-once", key = credit.message_id.as_str())]
pub async fn credit_with_ledger_entry_once<C>(conn: &mut C, credit: &Credit) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    apply(conn, credit).await?;
    let entry = format!(
        "INSERT INTO ledger (entry) VALUES ('account-{}')",
        credit.account
    );
    match conn
        .transaction(async |conn| conn.batch_execute(&entry).await)
        .await
    {
        Ok(()) | Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(()),
        Err(other) => Err(other),
    }
}

/// A body may recover from a failed statement inside a savepoint: the handler's
/// transaction stays usable and commits.
pub async fn savepoint_in_the_body_isolates_a_failed_statement<D: TestDb>(db: D) {
    create_tables(&db, 1).await;
    let mut conn = db.connect().await;
    for n in 0..2 {
        let message = Credit {
            message_id: format!("m-{n}"),
            account: 0,
            amount: 1,
        };
        assert_eq!(
            credit_with_ledger_entry_once(&mut conn, &message)
                .await
                .unwrap(),
            Outcome::Processed(()),
            "message {n}"
        );
    }
    assert_eq!(balances(&db, 1).await, vec![2]);
    for (table, rows) in [("inbox", 2), ("ledger", 1)] {
        let query = format!("SELECT COUNT(*) FROM {table}");
        assert_eq!(
            select_i64(&mut conn, &query).await.unwrap(),
            rows,
            "{table}"
        );
    }
}

/// Inside `begin_test_transaction`, as diesel users isolate tests, a handler runs on a
/// savepoint: processed, duplicate and failed calls leave what they would outside, a
/// failed statement in the body (which aborts a PostgreSQL transaction) leaves the test
/// transaction usable, and nothing is ever committed. Any other open transaction is
/// still refused.
pub async fn handlers_run_inside_a_test_transaction<D: TestDb>(db: D) {
    create_tables(&db, 2).await;
    let mut conn = db.connect().await;
    conn.begin_test_transaction().await.unwrap();
    let (first, second) = (Credit::numbered(0), Credit::numbered(1));
    assert_eq!(
        credit(&mut conn, &first).await.unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(credit(&mut conn, &first).await.unwrap(), Outcome::Duplicate);
    assert_eq!(
        credit_reading_first(&mut conn, &first).await.unwrap(),
        Outcome::Duplicate
    );

    let failed = gated_credit(&mut conn, &second, &Gate::new(false, true)).await;
    assert!(
        matches!(failed, Err(Error::RollbackTransaction)),
        "{failed:?}"
    );
    let markers = "SELECT COUNT(*) FROM inbox";
    assert_eq!(select_i64(&mut conn, markers).await.unwrap(), 1);
    assert_eq!(
        credit(&mut conn, &second).await.unwrap(),
        Outcome::Processed(())
    );

    // Both messages credit account 7's single ledger entry: the second's insert fails.
    let ledger = |n| Credit {
        message_id: format!("ledger-{n}"),
        account: 7,
        amount: 1,
    };
    assert_eq!(
        record_in_ledger(&mut conn, &ledger(0)).await.unwrap(),
        Outcome::Processed(())
    );
    let error = record_in_ledger(&mut conn, &ledger(1))
        .await
        .expect_err("ledger entry exists");
    assert_eq!(classify(&error), ErrorClass::Permanent, "{error}");
    assert_eq!(select_i64(&mut conn, markers).await.unwrap(), 3);
    let credited_once = "SELECT COUNT(*) FROM accounts WHERE balance = 1";
    assert_eq!(select_i64(&mut conn, credited_once).await.unwrap(), 2);

    let nested = conn
        .transaction(async |conn| credit(conn, &Credit::numbered(2)).await)
        .await;
    assert!(
        matches!(nested, Err(Error::AlreadyInTransaction)),
        "a transaction inside the test transaction is refused: {nested:?}"
    );
    let mut other = db.connect().await;
    let refused = other
        .transaction(async |conn| credit(conn, &Credit::numbered(2)).await)
        .await;
    assert!(
        matches!(refused, Err(Error::AlreadyInTransaction)),
        "an ordinary transaction is refused: {refused:?}"
    );

    drop(conn);
    assert_eq!(
        select_i64(&mut other, markers).await.unwrap(),
        0,
        "nothing of the test transaction is committed"
    );
    assert_eq!(balances(&db, 2).await, vec![0, 0]);
}

/// A raw second insert of the same marker is recognised by its index.
pub async fn inbox_unique_violation_is_classified<D: TestDb>(db: D) {
    create_tables(&db, 0).await;
    let mut conn = db.connect().await;
    let insert = "INSERT INTO inbox (message_id, consumer) VALUES ('m-1', 'credit')";
    conn.batch_execute(insert).await.unwrap();
    let error = conn
        .batch_execute(insert)
        .await
        .expect_err("duplicate marker");
    assert_eq!(classify(&error), ErrorClass::InboxDuplicate, "{error}");
}

pub async fn invalid_keys_are_rejected_before_writing<D: TestDb>(db: D) {
    create_tables(&db, 1).await;
    let mut conn = db.connect().await;
    for message_id in [String::new(), "x".repeat(513)] {
        let message = Credit {
            message_id,
            account: 0,
            amount: 1,
        };
        let error = credit(&mut conn, &message).await.expect_err("invalid key");
        assert!(
            matches!(
                diesel_inbox::InboxError::find(&error),
                Some(diesel_inbox::InboxError::InvalidKey(_))
            ),
            "{error:?}"
        );
        assert_eq!(classify(&error), ErrorClass::Permanent);
    }
    let longest = Credit {
        message_id: "x".repeat(512),
        account: 0,
        amount: 1,
    };
    assert_eq!(
        credit(&mut conn, &longest).await.unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(
        select_i64(&mut conn, "SELECT COUNT(*) FROM inbox")
            .await
            .unwrap(),
        1
    );
    assert_eq!(balances(&db, 1).await, vec![1]);
}

/// Keys that would break a statement they were spliced into, or change what it does, are
/// stored byte for byte: each is processed once, its redelivery is a duplicate, and the
/// fast path's read, which binds the key, finds the marker the insert wrote.
pub async fn hostile_keys_are_stored_byte_for_byte<D: TestDb>(db: D) {
    let keys = [
        "it's",
        "'); DELETE FROM inbox; --",
        "\\'; DROP TABLE inbox; #",
        "X'41' \" \\ `",
        "é 日本語 🦀",
    ];
    create_tables(&db, keys.len() as i64).await;
    let mut conn = db.connect().await;
    for (account, key) in keys.iter().enumerate() {
        let message = Credit {
            message_id: (*key).to_owned(),
            account: account as i64,
            amount: 1,
        };
        assert_eq!(
            credit(&mut conn, &message).await.unwrap(),
            Outcome::Processed(()),
            "{key:?}"
        );
        assert_eq!(
            credit(&mut conn, &message).await.unwrap(),
            Outcome::Duplicate,
            "{key:?}"
        );
        assert_eq!(
            credit_reading_first(&mut conn, &message).await.unwrap(),
            Outcome::Duplicate,
            "{key:?}"
        );
    }
    assert_eq!(
        select_i64(&mut conn, "SELECT COUNT(*) FROM inbox")
            .await
            .unwrap(),
        keys.len() as i64
    );
    assert_eq!(balances(&db, keys.len() as i64).await, vec![1; keys.len()]);
}

/// Dropping the handler mid-body leaves its transaction open on that connection. The
/// next call there must not report `Processed` for work that would never commit, and
/// once the connection is gone the message is processed afresh.
pub async fn cancelled_handler_never_half_commits<D: TestDb>(db: D) {
    create_tables(&db, 1).await;
    let message = Credit::numbered(0);
    let mut conn = db.connect().await;
    let gate = Gate::held(false);
    {
        // Dropped once it is inside its body: marker inserted, credit applied.
        let handler = gated_credit(&mut conn, &message, &gate);
        tokio::pin!(handler);
        tokio::select! {
            outcome = &mut handler => panic!("a held handler returned {outcome:?}"),
            () = gate.entered.notified() => {}
        }
    }

    let reused = credit(&mut conn, &Credit::numbered(0)).await;
    let error = reused.expect_err("a connection left inside a transaction is refused");
    assert!(matches!(error, Error::AlreadyInTransaction), "{error:?}");
    assert_eq!(classify(&error), ErrorClass::ConnectionUnusable);
    let mut observer = db.connect().await;
    let committed = select_i64(&mut observer, "SELECT COUNT(*) FROM inbox")
        .await
        .unwrap();
    assert_eq!(committed, 0, "nothing of the dropped handler is committed");
    drop(conn);

    let mut fresh = db.connect().await;
    assert_eq!(
        credit(&mut fresh, &message).await.unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(balances(&db, 1).await, vec![1]);
}

/// A backend's SQL for a point in the past on the database's clock, as `processed_at`
/// stores it.
pub trait PastInstant {
    fn seconds_ago(seconds: i64) -> String;
}

impl PastInstant for diesel::pg::Pg {
    fn seconds_ago(seconds: i64) -> String {
        format!("now() - INTERVAL '{seconds} seconds'")
    }
}

impl PastInstant for diesel::mysql::Mysql {
    fn seconds_ago(seconds: i64) -> String {
        format!("UTC_TIMESTAMP(6) - INTERVAL {seconds} SECOND")
    }
}

impl PastInstant for diesel::sqlite::Sqlite {
    fn seconds_ago(seconds: i64) -> String {
        format!("datetime('now', '-{seconds} seconds')")
    }
}

type BackendOf<D> = <<D as TestDb>::Conn as diesel_async::AsyncConnectionCore>::Backend;

/// Inserts markers `<prefix>-0` … `<prefix>-<count - 1>` processed `seconds` ago.
async fn insert_markers<D>(conn: &mut D::Conn, prefix: &str, count: usize, seconds: i64)
where
    D: TestDb,
    BackendOf<D>: PastInstant,
{
    let at = BackendOf::<D>::seconds_ago(seconds);
    for chunk in (0..count).collect::<Vec<_>>().chunks(2_500) {
        let rows: Vec<String> = chunk
            .iter()
            .map(|n| format!("('{prefix}-{n}', 'pruned', {at})"))
            .collect();
        conn.batch_execute(&format!(
            "INSERT INTO inbox (message_id, consumer, processed_at) VALUES {}",
            rows.join(", ")
        ))
        .await
        .expect("insert markers");
    }
}

/// Markers processed more than the window ago go, in batches; markers inside it stay,
/// judged to the second on the database's clock.
pub async fn prune_keeps_the_window_to_the_second<D>(db: D)
where
    D: TestDb,
    BackendOf<D>: PastInstant,
{
    create_tables(&db, 0).await;
    let mut conn = db.connect().await;
    insert_markers::<D>(&mut conn, "old", 2_500, 3_600).await;
    insert_markers::<D>(&mut conn, "outside", 1, 61).await;
    insert_markers::<D>(&mut conn, "inside", 1, 59).await;
    insert_markers::<D>(&mut conn, "new", 10, 0).await;

    let pruned = diesel_inbox::prune(&mut conn, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(pruned, 2_501);
    let left =
        |prefix: &str| format!("SELECT COUNT(*) FROM inbox WHERE message_id LIKE '{prefix}-%'");
    for (prefix, expected) in [("old", 0), ("outside", 0), ("inside", 1), ("new", 10)] {
        assert_eq!(
            select_i64(&mut conn, &left(prefix)).await.unwrap(),
            expected,
            "{prefix}"
        );
    }
    assert_eq!(
        diesel_inbox::prune(&mut conn, Duration::from_secs(60))
            .await
            .unwrap(),
        0
    );

    conn.begin_test_transaction().await.unwrap();
    let refused = diesel_inbox::prune(&mut conn, Duration::from_secs(60)).await;
    assert!(
        matches!(refused, Err(Error::AlreadyInTransaction)),
        "{refused:?}"
    );
}

/// A window of any length prunes: one longer than any marker's age finds nothing, where
/// the backend's date arithmetic failed (MariaDB from 3,000 years on, PostgreSQL and
/// SQLite at 10,000 years, all three at `Duration::MAX`), a `Permanent` error.
pub async fn prune_windows_of_any_length<D>(db: D)
where
    D: TestDb,
    BackendOf<D>: PastInstant,
{
    const YEAR: u64 = 365 * 24 * 3600;
    create_tables(&db, 0).await;
    let mut conn = db.connect().await;
    insert_markers::<D>(&mut conn, "old", 3, 3_600).await;
    insert_markers::<D>(&mut conn, "new", 2, 0).await;
    let windows = [
        Duration::from_secs(400 * YEAR),
        Duration::from_secs(500 * YEAR),
        Duration::from_secs(500 * YEAR + 1),
        Duration::from_secs(3_000 * YEAR),
        Duration::from_secs(10_000 * YEAR),
        Duration::from_micros(i64::MAX as u64),
        Duration::MAX,
        diesel_inbox::Retention::new(Duration::from_secs(300), u32::MAX).window(),
    ];
    for window in windows {
        let pruned = diesel_inbox::prune(&mut conn, window).await;
        assert_eq!(pruned.expect("nothing is that old"), 0, "{window:?}");
    }
    let pruned = diesel_inbox::prune(&mut conn, Duration::from_secs(60)).await;
    assert_eq!(pruned.unwrap(), 3);
}

/// Four pruners at once: none fails or deadlocks, each marker is deleted and counted
/// once, and the counts add up.
pub async fn concurrent_pruners_delete_each_marker_once<D>(db: D)
where
    D: TestDb,
    BackendOf<D>: PastInstant,
{
    create_tables(&db, 0).await;
    let mut conn = db.connect().await;
    insert_markers::<D>(&mut conn, "old", 20_000, 3_600).await;
    insert_markers::<D>(&mut conn, "new", 100, 0).await;
    let db = Arc::new(db);
    let barrier = Arc::new(Barrier::new(4));
    let pruners: Vec<_> = (0..4)
        .map(|_| {
            let (db, barrier) = (Arc::clone(&db), Arc::clone(&barrier));
            tokio::spawn(async move {
                let mut conn = db.connect().await;
                barrier.wait().await;
                diesel_inbox::prune(&mut conn, Duration::from_secs(60)).await
            })
        })
        .collect();
    let mut total = 0;
    for pruner in pruners {
        total += pruner.await.unwrap().expect("a pruner failed");
    }
    assert_eq!(total, 20_000);
    assert_eq!(
        select_i64(&mut conn, "SELECT COUNT(*) FROM inbox")
            .await
            .unwrap(),
        100
    );
}

/// Which transaction statement a cancellation test drops the handler at.
#[derive(Debug, Clone, Copy)]
enum Statement {
    Begin,
    Commit,
    Rollback,
}

impl Statement {
    /// Whether `sql`, as instrumentation reports it, is this statement (or a batch
    /// that holds it).
    fn is(self, sql: &str) -> bool {
        match self {
            Self::Begin => sql.starts_with("BEGIN") || sql.starts_with("START TRANSACTION"),
            Self::Commit => sql.contains("COMMIT"),
            Self::Rollback => sql.contains("ROLLBACK"),
        }
    }
}

/// Delivers `message` to [`gated_credit`] and drops the call once `statement` has
/// started; the body fails where that is the ROLLBACK. Whether it was dropped in flight
/// rather than finished first.
async fn cancel_at<D: TestDb>(conn: &mut D::Conn, message: &Credit, statement: Statement) -> bool {
    let reached = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = Arc::clone(&reached);
    conn.set_instrumentation(move |event: InstrumentationEvent<'_>| {
        if let InstrumentationEvent::StartQuery { query, .. } = event
            && statement.is(&query.to_string())
        {
            seen.store(true, std::sync::atomic::Ordering::SeqCst);
            // Holds the statement back a little: SQLite runs it on a blocking thread,
            // which could otherwise finish it before the handler's poll returns.
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let gate = Gate::new(false, matches!(statement, Statement::Rollback));
    let handler = D::credit(conn, message, &gate);
    tokio::pin!(handler);
    // Polls the handler until the statement has started, then drops it there.
    std::future::poll_fn(|cx| {
        let cancel = || reached.load(std::sync::atomic::Ordering::SeqCst);
        if cancel() {
            return std::task::Poll::Ready(true);
        }
        match handler.as_mut().poll(cx) {
            std::task::Poll::Ready(_) => std::task::Poll::Ready(false),
            std::task::Poll::Pending if cancel() => std::task::Poll::Ready(true),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    })
    .await
}

/// Dropping the handler while BEGIN, COMMIT or ROLLBACK is in flight leaves the
/// connection in a state its transaction manager cannot vouch for. The next call there
/// must be refused, nothing may be half committed (a marker without its effect or the
/// reverse), and a redelivery on a fresh connection applies the message once.
pub async fn cancelled_transaction_statements_never_half_commit<D: TestDb>(db: D) {
    const ATTEMPTS: i64 = 10;
    create_tables(&db, 3 * ATTEMPTS).await;
    for (n, statement) in [Statement::Begin, Statement::Commit, Statement::Rollback]
        .into_iter()
        .enumerate()
    {
        // A statement can complete within the very poll that sends it (its reply may be
        // in before the handler looks): such an attempt proves nothing, and the next one
        // uses a message and account of its own.
        let mut cancelled = None;
        for attempt in 0..ATTEMPTS {
            let message = Credit::numbered(n as i64 * ATTEMPTS + attempt);
            let mut conn = db.connect().await;
            if cancel_at::<D>(&mut conn, &message, statement).await {
                cancelled = Some((conn, message));
                break;
            }
        }
        let (mut conn, message) =
            cancelled.unwrap_or_else(|| panic!("{statement:?}: never caught in flight"));
        let n = message.account;

        let refused = D::credit(&mut conn, &message, &Gate::new(false, false))
            .await
            .expect_err("a connection cancelled mid-statement is refused");
        assert!(
            matches!(
                refused,
                Error::AlreadyInTransaction | Error::BrokenTransactionManager
            ),
            "{statement:?}: {refused:?}"
        );
        assert_eq!(classify(&refused), ErrorClass::ConnectionUnusable);
        drop(conn);

        let mut fresh = db.connect().await;
        let markers = format!(
            "SELECT COUNT(*) FROM inbox WHERE message_id = '{}'",
            message.message_id
        );
        let balance = format!("SELECT balance FROM accounts WHERE id = {n}");
        // The server may still be finishing the dropped connection's statement; either
        // way, marker and effect are committed together or not at all.
        for _ in 0..20 {
            let committed = select_i64(&mut fresh, &markers).await.unwrap();
            assert_eq!(
                select_i64(&mut fresh, &balance).await.unwrap(),
                committed,
                "{statement:?}: half committed"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let redelivered = D::credit(&mut fresh, &message, &Gate::new(false, false))
            .await
            .unwrap();
        assert!(
            matches!(redelivered, Outcome::Processed(()) | Outcome::Duplicate),
            "{statement:?}: {redelivered:?}"
        );
        assert_eq!(
            select_i64(&mut fresh, &balance).await.unwrap(),
            1,
            "{statement:?}"
        );
    }
}

pub async fn migrate_is_idempotent_and_concurrent<D: TestDb>(db: D) {
    // The test database comes migrated; the race is about creating the table.
    db.connect()
        .await
        .batch_execute("DROP TABLE inbox")
        .await
        .expect("drop the inbox");
    let db = Arc::new(db);
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let db = Arc::clone(&db);
        tasks.push(tokio::spawn(async move {
            let mut conn = db.connect().await;
            diesel_inbox::migrate(&mut conn).await?;
            diesel_inbox::migrate(&mut conn).await
        }));
    }
    for task in tasks {
        task.await.unwrap().expect("concurrent migrate");
    }
    let mut conn = db.connect().await;
    conn.batch_execute("INSERT INTO inbox (message_id, consumer) VALUES ('m', 'c')")
        .await
        .unwrap();
    let error = conn
        .batch_execute("INSERT INTO inbox (message_id, consumer) VALUES ('m', 'c')")
        .await
        .expect_err("the unique index exists");
    assert_eq!(classify(&error), ErrorClass::InboxDuplicate);
}

/// `migrate` on an inbox it has to change waits for the table's lock a second at a time,
/// so that handlers never queue behind its `ALTER TABLE` for longer. It waited for as
/// long as a transaction stayed open on the inbox, and every handler waited behind it.
pub async fn migrate_waits_for_its_lock_a_second_at_a_time<D: TestDb>(db: D) {
    create_tables(&db, 1).await;
    let mut held = db.connect().await;
    held.batch_execute(
        "ALTER TABLE inbox DROP COLUMN lease_ends_at, DROP COLUMN claim_token, \
         DROP COLUMN attempts, DROP COLUMN fingerprint",
    )
    .await
    .expect("an inbox of 0.1, which migrate changes");
    held.batch_execute("BEGIN; INSERT INTO inbox (message_id, consumer) VALUES ('held', 'held')")
        .await
        .expect("a transaction left open on the inbox");
    let holding = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(4)).await;
        held.batch_execute("ROLLBACK").await
    });
    let migrating = tokio::spawn({
        let db = db.clone();
        async move { diesel_inbox::migrate(&mut db.connect().await).await }
    });
    // Time for migrate's schema change to queue up for the table's lock.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut conn = db.connect().await;
    let started = std::time::Instant::now();
    let outcome = credit(&mut conn, &Credit::numbered(0)).await;
    let waited = started.elapsed();
    // Until migrate has added the claim columns, which the marker insert names, the
    // delivery is retried; either way it must not wait behind migrate.
    match &outcome {
        Ok(processed) => assert_eq!(*processed, Outcome::Processed(())),
        Err(error) => assert!(classify(error).is_retryable(), "{error}"),
    }
    assert!(
        waited < Duration::from_millis(2500),
        "a handler waited {waited:?} behind migrate"
    );
    holding.await.unwrap().expect("end the open transaction");
    migrating
        .await
        .unwrap()
        .expect("migrate, once the transaction ended");
    select_i64(&mut conn, "SELECT COUNT(lease_ends_at) FROM inbox")
        .await
        .expect("the claim columns are back");
}

/// `migrate` refuses an `inbox` table that is not the crate's (it has no unique index of
/// that name), and leaves it as it is. It gave the table the crate's index and columns
/// and returned `Ok`: every handler then failed on a `NOT NULL` column of the table's
/// own, and dead-lettered every message.
pub async fn migrate_refuses_an_inbox_table_of_another<D: TestDb>(db: D) {
    let mut conn = db.connect().await;
    conn.batch_execute(
        "DROP TABLE inbox; CREATE TABLE inbox (id BIGINT PRIMARY KEY, \
         message_id VARCHAR(100) NOT NULL, consumer VARCHAR(100) NOT NULL, \
         payload VARCHAR(100) NOT NULL)",
    )
    .await
    .expect("an inbox table of another's");
    let migrated = diesel_inbox::migrate(&mut conn).await;
    assert!(
        matches!(&migrated, Err(Error::QueryBuilderError(error))
            if error.to_string().contains("no unique index `ux_inbox_message_consumer`")),
        "{migrated:?}"
    );
    conn.batch_execute(
        "INSERT INTO inbox (id, message_id, consumer, payload) \
         VALUES (1, 'm', 'c', 'p'), (2, 'm', 'c', 'p')",
    )
    .await
    .expect("the table as it was, without a unique index");
}

#[idempotent(consumer = "adaptive", key = credit.message_id.as_str())]
pub async fn adaptive_credit<C>(conn: &mut C, credit: &Credit) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    apply(conn, credit).await
}

/// Delivers `credit` to [`adaptive_credit`]; also says whether the call read the inbox
/// before opening its transaction, judged by the first statement it sent.
async fn deliver_adaptive<C>(
    conn: &mut C,
    statements: &Mutex<Vec<String>>,
    credit: &Credit,
) -> (Outcome<()>, bool)
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    statements.lock().unwrap().clear();
    let outcome = adaptive_credit(conn, credit).await.unwrap();
    let first = statements
        .lock()
        .unwrap()
        .first()
        .cloned()
        .unwrap_or_default();
    // The read is a SELECT; the transaction's first statement, a BEGIN.
    (outcome, first.trim_start().starts_with("SELECT"))
}

/// By default a handler reads first only while duplicates are common: never for new
/// messages, soon after a replay starts, and no longer once new messages return.
pub async fn fast_path_adapts_to_duplicates<D: TestDb>(db: D) {
    create_tables(&db, 1).await;
    let mut conn = db.connect().await;
    let statements = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&statements);
    conn.set_instrumentation(move |event: InstrumentationEvent<'_>| {
        if let InstrumentationEvent::StartQuery { query, .. } = event {
            log.lock().unwrap().push(query.to_string());
        }
    });
    let messages: Vec<Credit> = (0..100)
        .map(|n| Credit {
            message_id: format!("adaptive-{n}"),
            account: 0,
            amount: 1,
        })
        .collect();

    let mut reads = 0;
    for message in &messages[..50] {
        let (outcome, read_first) = deliver_adaptive(&mut conn, &statements, message).await;
        assert_eq!(outcome, Outcome::Processed(()));
        reads += usize::from(read_first);
    }
    assert_eq!(reads, 0, "new messages read first");

    let mut replay = Vec::new();
    for message in &messages[..50] {
        let (outcome, read_first) = deliver_adaptive(&mut conn, &statements, message).await;
        assert_eq!(outcome, Outcome::Duplicate);
        replay.push(read_first);
    }
    let switched_on = replay.iter().position(|&read| read);
    assert!(
        matches!(switched_on, Some(5..=10)) && replay[10..].iter().all(|&read| read),
        "replay read first: {replay:?}"
    );

    let mut after = Vec::new();
    for message in &messages[50..] {
        let (outcome, read_first) = deliver_adaptive(&mut conn, &statements, message).await;
        assert_eq!(outcome, Outcome::Processed(()));
        after.push(read_first);
    }
    assert!(
        after[..30].iter().all(|&read| read) && !after[40..].iter().any(|&read| read),
        "new messages after the replay read first: {after:?}"
    );
    assert_eq!(balances(&db, 1).await, vec![100]);
}

/// Polls `future` until it has returned `Pending` `pendings` times, each an await that
/// waited, and drops it there; `Some` when it finished first.
pub async fn drop_after<F: Future>(pendings: usize, future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let mut waited = 0;
    std::future::poll_fn(|cx| match future.as_mut().poll(cx) {
        std::task::Poll::Ready(output) => std::task::Poll::Ready(Some(output)),
        std::task::Poll::Pending if waited + 1 == pendings => std::task::Poll::Ready(None),
        std::task::Poll::Pending => {
            waited += 1;
            std::task::Poll::Pending
        }
    })
    .await
}

/// Runs a scenario to its end, or fails it after two minutes: a planted bug must end in a
/// red test, never in a stalled CI.
pub async fn bounded<T>(scenario: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(120), scenario)
        .await
        .expect("the scenario did not finish within two minutes")
}

/// Every scenario that holds on all three backends, as one `#[tokio::test]` each.
macro_rules! common_scenarios {
    ($db:expr) => {
        common_scenarios!(@tests $db;
            races_apply_each_message_exactly_once,
            race_catches_the_naive_handler,
            failure_rolls_back_everything,
            consumers_are_independent,
            business_unique_violation_is_not_a_duplicate,
            savepoint_in_the_body_isolates_a_failed_statement,
            handlers_run_inside_a_test_transaction,
            inbox_unique_violation_is_classified,
            invalid_keys_are_rejected_before_writing,
            hostile_keys_are_stored_byte_for_byte,
            cancelled_handler_never_half_commits,
            cancelled_transaction_statements_never_half_commit,
            migrate_is_idempotent_and_concurrent,
            migrate_refuses_an_inbox_table_of_another,
            prune_keeps_the_window_to_the_second,
            prune_windows_of_any_length,
            concurrent_pruners_delete_each_marker_once,
            fast_path_adapts_to_duplicates,
        );

        common_scenarios!(@overlaps $db;
            forced_overlap_first_commits: true, false;
            forced_overlap_first_rolls_back: false, false;
            forced_overlap_first_commits_second_reads_first: true, true;
            forced_overlap_first_rolls_back_second_reads_first: false, true;
        );
    };
    (@overlaps $db:expr; $($test:ident: $first_commits:expr, $b_reads_first:expr;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $test() {
            if let Some(db) = $db(stringify!($test)).await {
                common::bounded(common::forced_overlap(db.clone(), $first_commits, $b_reads_first)).await;
                common::TestDb::cleanup(db).await;
            }
        }
    )*};
    (@tests $db:expr; $($scenario:ident,)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $scenario() {
            if let Some(db) = $db(stringify!($scenario)).await {
                common::bounded(common::$scenario(db.clone())).await;
                common::TestDb::cleanup(db).await;
            }
        }
    )*};
}
