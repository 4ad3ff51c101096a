//! Verdicts on errors as handlers' code carries them, on every backend: a retryable
//! database error is retried however it is wrapped, a connection or a pool that fails
//! is retried, and an error of the handler's own says what it is.

use std::error::Error as StdError;
use std::fmt::Display;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use diesel::result::Error;
use diesel_async::SimpleAsyncConnection as _;
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, PoolError, PoolableConnection,
};
use diesel_inbox::testing::select_i64;
use diesel_inbox::{
    BatchOutcome, Classified, Classify, Disposition, ErrorClass, InboxBackend, Outcome,
    RetryPolicy, class_of, classify, idempotent, retry,
};

use super::batch::batch_credit;
use super::{
    Credit, TestDb, balances, connect_with, create_tables, credit, hold_marker, retry_delay,
};

type BoxError = Box<dyn StdError + Send + Sync>;

/// A repository error as thiserror writes it, with its own message.
#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    #[error("repository: {0}")]
    Db(#[from] Error),
}

/// The same with `#[error(transparent)]`, whose `source()` skips the diesel error.
#[derive(Debug, thiserror::Error)]
pub enum TransparentRepoError {
    #[error(transparent)]
    Db(#[from] Error),
}

impl Classify for RepoError {
    fn class(&self) -> ErrorClass {
        class_of(self)
    }
}

impl Classify for TransparentRepoError {
    fn class(&self) -> ErrorClass {
        class_of(self)
    }
}

/// An error as diesel-async reported it, again: `Error` is not `Clone`, and a verdict
/// reads only the kind and the message.
fn again(error: &Error) -> Error {
    match error {
        Error::DatabaseError(kind, info) => {
            Error::DatabaseError(*kind, Box::new(info.message().to_owned()))
        }
        Error::BrokenTransactionManager => Error::BrokenTransactionManager,
        Error::AlreadyInTransaction => Error::AlreadyInTransaction,
        other => panic!("expected a database error, got {other:?}"),
    }
}

/// `error` in `shape` is retried: `Disposition::of` and `of_batch` say `Retry`, and
/// `retry` runs again, as many times as the policy allows.
async fn assert_retried<E>(shape: &str, wrap: impl Fn() -> E)
where
    E: Classify + Display,
{
    // Retried with the handler's error's own text, for a dead letter past the limit.
    let retry_disposition = Disposition::Retry {
        after: None,
        reason: wrap().to_string(),
    };
    let single: Result<Outcome<()>, E> = Err(wrap());
    assert_eq!(Disposition::of(&single), retry_disposition, "{shape}");
    let batch: Result<BatchOutcome<()>, E> = Err(wrap());
    assert_eq!(Disposition::of_batch(&batch), retry_disposition, "{shape}");
    let runs = AtomicUsize::new(0);
    let policy = RetryPolicy::new()
        .with_max_retries(2)
        .with_min_delay(Duration::from_millis(1));
    let result: Result<(), E> = retry(&policy, || async {
        runs.fetch_add(1, Ordering::Relaxed);
        Err(wrap())
    })
    .await;
    assert!(result.is_err(), "{shape}");
    assert_eq!(runs.into_inner(), 3, "{shape}: one run and two retries");
}

/// `error` is retried in every way a handler's code carries a database error.
pub async fn assert_retried_in_every_shape(database: &Error) {
    let error = || again(database);
    assert_retried("diesel::result::Error", error).await;
    assert_retried("thiserror #[from]", || RepoError::from(error())).await;
    assert_retried("thiserror transparent", || {
        TransparentRepoError::from(error())
    })
    .await;
    assert_retried("boxed thiserror #[from]", || {
        BoxError::from(RepoError::from(error()))
    })
    .await;
    assert_retried("boxed thiserror transparent", || {
        BoxError::from(TransparentRepoError::from(error()))
    })
    .await;
    assert_retried("Box<dyn Error>", || {
        Box::<dyn StdError>::from(TransparentRepoError::from(error()))
    })
    .await;
    assert_retried("anyhow", || anyhow::Error::from(error())).await;
    assert_retried("anyhow with context", || {
        Err::<(), _>(error())
            .context("crediting the account")
            .unwrap_err()
    })
    .await;
    assert_retried("anyhow of thiserror transparent", || {
        anyhow::Error::from(TransparentRepoError::from(error()))
    })
    .await;
    // anyhow's box holds its error where `downcast_ref` cannot see it: text alone.
    assert_retried("anyhow boxed", || {
        BoxError::from(anyhow::Error::from(error()))
    })
    .await;
    // Folded into the wrapper's own text: only the text is left, after the wrapper's.
    assert_retried("anyhow! folding the text", || {
        anyhow::anyhow!("crediting m-1: {}", error())
    })
    .await;
    assert_retried("boxed String folding the text", || {
        BoxError::from(format!("repository: credit m-1 failed: {}", error()))
    })
    .await;
    assert_retried("io::Error::other", || std::io::Error::other(error())).await;
    assert_retried("boxed io::Error::other of transparent", || {
        BoxError::from(std::io::Error::other(TransparentRepoError::from(error())))
    })
    .await;
}

/// Every way a handler's code carries a retryable database error, from this backend's
/// own error for a wait cut short (`settings` sets the wait's limit).
pub async fn wrapped_database_errors_are_retried<D: TestDb>(db: D, settings: &str) {
    create_tables(&db, 1).await;
    let (holder, gate) = hold_marker(&db, 0, false).await;
    let mut conn = connect_with(&db, settings).await;
    let cut_short = credit(&mut conn, &Credit::numbered(0))
        .await
        .expect_err("the wait for the holder's marker is cut short");
    assert_eq!(classify(&cut_short), ErrorClass::Transient, "{cut_short}");

    assert_retried_in_every_shape(&cut_short).await;

    // End to end: the guide's retry loop, with the error shape, waits out the
    // holder and then processes the message once.
    let runs = AtomicUsize::new(0);
    let policy = RetryPolicy::new()
        .with_max_retries(50)
        .with_min_delay(Duration::from_millis(20))
        .with_max_delay(Duration::from_millis(50));
    let retried = retry(&policy, || async {
        if runs.fetch_add(1, Ordering::Relaxed) == 1 {
            gate.release.notify_one();
        }
        let mut conn = connect_with(&db, settings).await;
        let outcome = credit(&mut conn, &Credit::numbered(0))
            .await
            .map_err(TransparentRepoError::from)?;
        Ok::<_, BoxError>(outcome)
    })
    .await;
    assert_eq!(retried.unwrap(), Outcome::Processed(()));
    assert!(runs.into_inner() >= 2, "the first run was cut short");
    assert!(holder.await.unwrap().is_err(), "the holder rolled back");
    assert_eq!(balances(&db, 1).await, vec![1]);
}

/// A connection the server ended under a handler (`own_id` reads the session's id, and
/// `kill` ends the session of `{id}`): the handler's error, and the next one's on that
/// connection, are retried in every way a handler's code carries them. They reach the
/// handler in the driver's and diesel's words, not the server's ("connection closed",
/// "The transaction manager is broken"), which a wrapper that hides the diesel error
/// left to be judged by: dead-lettered, every message in flight during an outage.
pub async fn a_lost_connection_is_retried_in_every_shape<D: TestDb>(
    db: D,
    own_id: &str,
    kill: &str,
) {
    create_tables(&db, 1).await;
    let mut conn = db.connect().await;
    let id = select_i64(&mut conn, own_id)
        .await
        .expect("the session's id");
    let mut admin = db.connect().await;
    admin
        .batch_execute(&kill.replace("{id}", &id.to_string()))
        .await
        .expect("end the session");
    let mut errors = Vec::new();
    for n in 0..2 {
        let lost = credit(&mut conn, &Credit::numbered(n))
            .await
            .expect_err("the session is gone");
        assert_eq!(classify(&lost), ErrorClass::ConnectionUnusable, "{lost}");
        assert_retried_in_every_shape(&lost).await;
        errors.push(lost.to_string());
    }
    assert_eq!(balances(&db, 1).await, vec![0], "{errors:?}");
}

/// A server that is read-only for now (`settings` makes the session so) refuses the
/// marker: each message is retried, on another connection, never dead-lettered.
pub async fn read_only_session_is_retried<D: TestDb>(db: D, settings: &str) {
    create_tables(&db, 2).await;
    let mut conn = connect_with(&db, settings).await;
    let single = credit(&mut conn, &Credit::numbered(0)).await;
    let error = single.as_ref().expect_err("a read-only transaction");
    assert_eq!(classify(error), ErrorClass::ConnectionUnusable, "{error}");
    assert_retried_in_every_shape(error).await;
    assert_eq!(retry_delay(&Disposition::of(&single)), Some(None));
    let batch = batch_credit(&mut conn, &[Credit::numbered(0), Credit::numbered(1)]).await;
    assert_eq!(
        retry_delay(&Disposition::of_batch(&batch)),
        Some(None),
        "{:?}",
        batch.err()
    );
    assert_eq!(balances(&db, 2).await, vec![0, 0]);
    // Retried on a writable connection, each message applies once.
    let mut conn = db.connect().await;
    assert_eq!(
        credit(&mut conn, &Credit::numbered(0)).await.unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(balances(&db, 2).await, vec![1, 0]);
}

/// The credit handler, returning `anyhow::Result` as a handler may.
#[idempotent(consumer = "anyhow_credit", key = credit.message_id.as_str())]
pub async fn anyhow_credit<C>(conn: &mut C, credit: &Credit) -> anyhow::Result<()>
where
    C: diesel_async::AsyncConnection,
    C::Backend: InboxBackend,
{
    super::apply(conn, credit).await?;
    Ok(())
}

/// An anyhow handler settles end to end: its result goes to `Disposition::of` as it is,
/// and a wait cut short inside it is retried.
pub async fn anyhow_handlers_are_settled<D: TestDb>(db: D, settings: &str) {
    create_tables(&db, 1).await;
    let (holder, gate) = hold_marker(&db, 0, false).await;
    let mut conn = connect_with(&db, settings).await;
    // The holder holds the account's row: the anyhow handler's own write waits for it.
    let cut_short = anyhow_credit(&mut conn, &Credit::numbered(0)).await;
    assert_eq!(
        retry_delay(&Disposition::of(&cut_short)),
        Some(None),
        "{:?}",
        cut_short.err()
    );
    gate.release.notify_one();
    assert!(holder.await.unwrap().is_err(), "the holder rolled back");
    let mut conn = db.connect().await;
    let processed = anyhow_credit(&mut conn, &Credit::numbered(0)).await;
    assert_eq!(Disposition::of(&processed), Disposition::Ack);
    assert_eq!(balances(&db, 1).await, vec![1]);
}

/// A session that finds no inbox (the migration has not run where its connections
/// look) fails every call in the crate's own statement. That is no message's fault: the
/// error says what to do, and each message is retried until someone does it.
pub async fn a_missing_inbox_is_retried_with_what_to_do<D: TestDb>(db: D) {
    create_tables(&db, 2).await;
    let mut conn = db.connect().await;
    conn.batch_execute("DROP TABLE inbox")
        .await
        .expect("drop the inbox");
    let single = credit(&mut conn, &Credit::numbered(0)).await;
    let error = single.as_ref().expect_err("no inbox");
    assert!(
        error.to_string().contains("diesel_inbox::migrate"),
        "{error}"
    );
    assert_eq!(classify(error), ErrorClass::ConnectionUnusable, "{error}");
    assert_eq!(retry_delay(&Disposition::of(&single)), Some(None));
    let batch = batch_credit(&mut conn, &[Credit::numbered(0), Credit::numbered(1)]).await;
    assert_eq!(
        retry_delay(&Disposition::of_batch(&batch)),
        Some(None),
        "{:?}",
        batch.err()
    );
    assert_claim_retried(&mut conn, &Credit::numbered(0), "diesel_inbox::migrate").await;
    // Once the inbox is there, the retried messages apply once each.
    diesel_inbox::migrate(&mut conn).await.expect("migrate");
    assert_eq!(
        credit(&mut conn, &Credit::numbered(0)).await.unwrap(),
        Outcome::Processed(())
    );
    let batch = batch_credit(&mut conn, &[Credit::numbered(0), Credit::numbered(1)])
        .await
        .expect("the batch");
    assert_eq!(batch.processed(), 2, "a consumer of its own");
    assert_eq!(balances(&db, 2).await, vec![2, 1]);
}

/// A handler whose body also marks the message done for another consumer, `audit`, as
/// a body may: its unique violation when `audit` has the message already is the body's.
#[idempotent(consumer = "verdict_marks_audit", key = credit.message_id.as_str())]
async fn credit_and_mark_audit<C>(conn: &mut C, credit: &Credit) -> Result<(), Error>
where
    C: diesel_async::AsyncConnection,
    C::Backend: InboxBackend,
{
    super::apply(conn, credit).await?;
    conn.batch_execute(&format!(
        "INSERT INTO inbox (message_id, consumer) VALUES ('{}', 'audit')",
        credit.message_id
    ))
    .await
}

/// A unique violation of the inbox's index that the body's own statement raised rolls
/// the body back: the message is not processed, so it must not be acknowledged. It was:
/// every error of that class was `Ack`, and the message was lost.
pub async fn a_body_meeting_the_inbox_index_is_not_acknowledged<D: TestDb>(db: D) {
    create_tables(&db, 1).await;
    let mut conn = db.connect().await;
    conn.batch_execute("INSERT INTO inbox (message_id, consumer) VALUES ('msg-0', 'audit')")
        .await
        .expect("audit's marker");
    let result = credit_and_mark_audit(&mut conn, &Credit::numbered(0)).await;
    let error = result.as_ref().expect_err("audit has the message");
    assert!(
        matches!(Disposition::of(&result), Disposition::DeadLetter { .. }),
        "{error}: {:?}",
        Disposition::of(&result)
    );
    assert_eq!(balances(&db, 1).await, vec![0], "rolled back");
}

/// A claim-mode handler of the same credit, for the session checks.
#[idempotent(consumer = "verdict_claim", key = credit.message_id.as_str(), claim)]
async fn claim_credit<C>(conn: &mut C, credit: &Credit) -> Result<(), Error>
where
    C: diesel_async::AsyncConnection,
    C::Backend: InboxBackend,
{
    super::apply(conn, credit).await
}

/// The claim-mode handler's error on a session the crate cannot work in: retried, with
/// `says` in it, never dead-lettered.
async fn assert_claim_retried<C>(conn: &mut C, credit: &Credit, says: &str)
where
    C: diesel_async::AsyncConnection,
    C::Backend: InboxBackend,
{
    let claimed = claim_credit(conn, credit).await;
    let error = claimed.as_ref().expect_err("no inbox of the crate's");
    assert!(error.to_string().contains(says), "{error}");
    assert_eq!(
        retry_delay(&Disposition::of(&claimed)),
        Some(None),
        "{error}"
    );
}

/// A session whose `inbox` is another table of that name (an application's own, or on
/// PostgreSQL one found first on `search_path`) fails every call in the crate's own
/// statement. Like a missing inbox, that is no message's fault: each is retried, with
/// what to change, never dead-lettered. A table that looks like the crate's, with the
/// key's columns but not the crate's unique index, took every delivery of a message as
/// new on PostgreSQL and MySQL/MariaDB: processed each time.
pub async fn a_foreign_inbox_is_retried_with_what_to_do<D: TestDb>(db: D) {
    create_tables(&db, 1).await;
    let mut conn = db.connect().await;
    conn.batch_execute("DROP TABLE inbox")
        .await
        .expect("drop the inbox");
    let sqlite = std::any::TypeId::of::<super::BackendOf<D>>()
        == std::any::TypeId::of::<diesel::sqlite::Sqlite>();
    for (table, unique) in [
        (
            "CREATE TABLE inbox (id BIGINT PRIMARY KEY, subject VARCHAR(100))",
            true,
        ),
        (
            "CREATE TABLE inbox (message_id VARCHAR(255) NOT NULL, consumer VARCHAR(255) NOT NULL)",
            false,
        ),
        (
            "CREATE TABLE inbox (message_id VARCHAR(255) NOT NULL, consumer VARCHAR(255) NOT NULL, \
             CONSTRAINT inbox_own_key UNIQUE (message_id, consumer))",
            true,
        ),
    ] {
        conn.batch_execute(table).await.expect(table);
        for _delivery in 0..2 {
            let single = credit(&mut conn, &Credit::numbered(0)).await;
            // SQLite's insert names the key's columns as its conflict target: a unique
            // index on them keeps the messages apart, in the application's table.
            if let (true, Ok(outcome)) = (unique && sqlite, &single) {
                assert!(matches!(
                    outcome,
                    Outcome::Processed(()) | Outcome::Duplicate
                ));
                continue;
            }
            let error = single.as_ref().expect_err(table);
            assert!(
                error.to_string().contains("is not the crate's"),
                "{table}: {error}"
            );
            assert_eq!(classify(error), ErrorClass::ConnectionUnusable, "{error}");
        }
        let batch = batch_credit(&mut conn, &[Credit::numbered(0)]).await;
        assert!(
            matches!(
                Disposition::of_batch(&batch),
                Disposition::Retry { after: None, .. } | Disposition::Ack
            ),
            "{table}: {:?}",
            batch.err()
        );
        assert_claim_retried(&mut conn, &Credit::numbered(0), "is not the crate's").await;
        assert!(balances(&db, 1).await[0] <= 1, "{table}: applied twice");
        conn.batch_execute("DROP TABLE inbox")
            .await
            .expect("drop the table");
    }
}

/// A connection that cannot be opened, and pools that cannot hand one out in time, are
/// retried however they reach the pump: the guide's retry loop takes its connection
/// inside the closure, so a pool's error is the run's error.
pub async fn unreachable_databases_are_retried<C>(url: &str, unreachable_url: &str)
where
    C: PoolableConnection + 'static,
    C::Backend: InboxBackend,
    AsyncDieselConnectionManager<C>: deadpool::managed::Manager<Type = C, Error = PoolError>
        + bb8::ManageConnection<Connection = C, Error = PoolError>,
{
    let refused = C::establish(unreachable_url)
        .await
        .err()
        .expect("nothing listens there");
    assert_eq!(refused.class(), ErrorClass::ConnectionUnusable, "{refused}");
    assert_retried("boxed ConnectionError", || {
        BoxError::from(diesel::ConnectionError::BadConnection(refused.to_string()))
    })
    .await;

    let deadpool = |url: &str| {
        diesel_async::pooled_connection::deadpool::Pool::builder(
            AsyncDieselConnectionManager::<C>::new(url),
        )
        .max_size(1)
        .wait_timeout(Some(Duration::from_millis(50)))
        .runtime(deadpool::Runtime::Tokio1)
        .build()
        .expect("a pool")
    };
    let down = deadpool(unreachable_url).get().await.err().expect("down");
    assert_eq!(down.class(), ErrorClass::ConnectionUnusable, "{down}");
    let busy = deadpool(url);
    let _held = busy.get().await.expect("a connection");
    let timed_out = busy.get().await.err().expect("the only connection is held");
    assert!(
        matches!(timed_out, deadpool::managed::PoolError::Timeout(_)),
        "{timed_out:?}"
    );
    assert_eq!(timed_out.class(), ErrorClass::ConnectionUnusable);
    assert_retried("boxed deadpool time-out", || {
        BoxError::from(deadpool::managed::PoolError::<PoolError>::Timeout(
            deadpool::managed::TimeoutType::Wait,
        ))
    })
    .await;

    // Long enough for the first connection on a loaded machine, where 200 ms was not.
    let bb8 = diesel_async::pooled_connection::bb8::Pool::builder()
        .max_size(1)
        .connection_timeout(Duration::from_secs(2))
        .build(AsyncDieselConnectionManager::<C>::new(url))
        .await
        .expect("a pool");
    let _held = bb8.get().await.expect("a connection");
    let timed_out = bb8.get().await.err().expect("the only connection is held");
    assert_eq!(
        timed_out.class(),
        ErrorClass::ConnectionUnusable,
        "{timed_out}"
    );
    assert_retried("anyhow bb8 time-out", || {
        anyhow::Error::from(bb8::RunError::<PoolError>::TimedOut)
    })
    .await;

    // The guide's retry loop, with the database down: each run is retried, none dead-lettered.
    let pool = deadpool(unreachable_url);
    let runs = AtomicUsize::new(0);
    let policy = RetryPolicy::new()
        .with_max_retries(2)
        .with_min_delay(Duration::from_millis(1));
    let result = retry(&policy, || async {
        runs.fetch_add(1, Ordering::Relaxed);
        let mut conn = pool.get().await?;
        Ok::<_, BoxError>(credit(&mut *conn, &Credit::numbered(0)).await?)
    })
    .await;
    assert_eq!(runs.into_inner(), 3);
    assert_eq!(retry_delay(&Disposition::of(&result)), Some(None));
}

/// An error of the handler's own says whether it is retried, and after how long, in the
/// one place every settling function reads: `Classified` inside a boxed or anyhow
/// error, or a `Classify` impl.
pub async fn own_errors_say_their_verdict() {
    let after = Duration::from_millis(300);
    let unavailable = || Classified::retry_after("the mail provider answered 503", after);
    let boxed: Result<Outcome<()>, BoxError> = Err(unavailable().into());
    assert_eq!(retry_delay(&Disposition::of(&boxed)), Some(Some(after)));
    let anyhow: Result<BatchOutcome<()>, anyhow::Error> =
        Err(anyhow::Error::from(unavailable()).context("sending the receipt"));
    assert_eq!(
        retry_delay(&Disposition::of_batch(&anyhow)),
        Some(Some(after))
    );
    let permanent: Result<Outcome<()>, BoxError> = Err(Classified::permanent(
        std::io::Error::from(std::io::ErrorKind::ConnectionReset),
    )
    .into());
    assert!(matches!(
        Disposition::of(&permanent),
        Disposition::DeadLetter { .. }
    ));

    // `retry` waits what the error asks, when the policy allows that long.
    let runs = AtomicUsize::new(0);
    let started = tokio::time::Instant::now();
    let policy = RetryPolicy::new()
        .with_max_retries(1)
        .with_min_delay(Duration::from_millis(1));
    let result: Result<(), BoxError> = retry(&policy, || async {
        runs.fetch_add(1, Ordering::Relaxed);
        Err(unavailable().into())
    })
    .await;
    assert!(result.is_err());
    assert_eq!(runs.swap(0, Ordering::Relaxed), 2);
    assert!(started.elapsed() >= after, "{:?}", started.elapsed());
    // A longer wait than the policy's longest is the broker's to make: no retry here.
    let patient: Result<(), BoxError> = retry(
        &policy.with_max_delay(Duration::from_millis(100)),
        || async {
            runs.fetch_add(1, Ordering::Relaxed);
            Err(unavailable().into())
        },
    )
    .await;
    assert_eq!(
        retry_delay(&Disposition::of_error(&patient.unwrap_err())),
        Some(Some(after))
    );
    assert_eq!(runs.into_inner(), 1);
}

/// The verdict scenarios that hold on every backend: `lock_wait` limits a session's wait
/// for a lock, `read_only` makes a session read-only; on a server, `unreachable` is a
/// connection type and a URL where nothing listens.
macro_rules! verdict_scenarios {
    ($db:expr, lock_wait = $lock_wait:expr, read_only = $read_only:expr $(,)?) => {
        verdict_scenarios!(@test $db; wrapped_database_errors_are_retried($lock_wait));
        verdict_scenarios!(@test $db; anyhow_handlers_are_settled($lock_wait));
        verdict_scenarios!(@test $db; a_missing_inbox_is_retried_with_what_to_do());
        verdict_scenarios!(@test $db; a_foreign_inbox_is_retried_with_what_to_do());
        verdict_scenarios!(@test $db; a_body_meeting_the_inbox_index_is_not_acknowledged());
        verdict_scenarios!(@test $db; read_only_session_is_retried($read_only));
    };
    (
        $db:expr,
        lock_wait = $lock_wait:expr,
        read_only = $read_only:expr,
        unreachable = $conn:ty => $url:expr $(,)?
    ) => {
        verdict_scenarios!($db, lock_wait = $lock_wait, read_only = $read_only);

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn unreachable_databases_are_retried() {
            if let Some(db) = $db("unreachable").await {
                let url = common::TestDb::database(&db).url().to_owned();
                common::bounded(
                    common::verdicts::unreachable_databases_are_retried::<$conn>(&url, $url),
                )
                .await;
                common::TestDb::cleanup(db).await;
            }
        }
    };
    (@test $db:expr; $scenario:ident($($arg:expr),*)) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $scenario() {
            if let Some(db) = $db(stringify!($scenario)).await {
                common::bounded(common::verdicts::$scenario(db.clone() $(, $arg)*)).await;
                common::TestDb::cleanup(db).await;
            }
        }
    };
}

/// [`a_lost_connection_is_retried_in_every_shape`] on the backend that `$db` creates
/// places on: `own_id` reads the session's id, `kill` ends the session of `{id}`.
macro_rules! lost_connection_scenario {
    ($db:expr, own_id = $own_id:expr, kill = $kill:expr $(,)?) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_lost_connection_is_retried_in_every_shape() {
            if let Some(db) = $db("lost_connection_shapes").await {
                common::bounded(
                    common::verdicts::a_lost_connection_is_retried_in_every_shape(
                        db.clone(),
                        $own_id,
                        $kill,
                    ),
                )
                .await;
                common::TestDb::cleanup(db).await;
            }
        }
    };
}
