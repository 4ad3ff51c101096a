//! Several consumers race over a stream of duplicated deliveries, first with the usual
//! hand-written "have I seen this message?" check, then with `#[idempotent]`.
//!
//! ```text
//! cargo run --example quickstart --features sqlite,testing   # embedded SQLite
//! DATABASE_URL=postgres://user@host/db cargo run --example quickstart --features sqlite,testing,postgres
//! DATABASE_URL=mysql://user@host/db cargo run --example quickstart --features sqlite,testing,mysql
//! ```
//!
//! The consumers are written as a service would be: a connection pool, `migrate` and
//! `check_consumers` at start-up, handlers in diesel's DSL, and an error type of the
//! service's own. Only the place differs: each run works in a scratch schema (PostgreSQL),
//! database (MySQL) or file (SQLite) of its own, made by `diesel_inbox::testing` and
//! dropped at the end, because the inbox table is always called `inbox` and the demo must
//! not mix its markers with yours. A service builds its pool from `DATABASE_URL` itself.
//!
//! The demo's schema and message come from the workspace's test fixtures
//! (`tests/support`), which its tests and benchmark share: the tables
//! `accounts (id, balance)` and `naive_inbox (message_id, consumer)`, the latter with a
//! plain index and no unique one, and `Credit { message_id, account, amount }`. The
//! handlers, and every statement they send, are here.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use deadpool::managed::Manager;
use diesel::dsl::{exists, insert_into, select, update};
use diesel::prelude::*;
use diesel::sqlite::SqliteConnection;
use diesel_async::methods::{ExecuteDsl, LoadQuery};
use diesel_async::pooled_connection::PoolError as ConnectionPoolError;
use diesel_async::pooled_connection::deadpool::{Pool, PoolError};
use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
use diesel_inbox::testing::{TestConnection, TestDatabase};
use diesel_inbox::{ErrorClass, InboxBackend, Outcome, classify, idempotent};
use inbox_fixtures::credit::{CreditTables, accounts, naive_inbox};
use tokio::sync::Mutex;
use uuid::Uuid;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type SqliteConn = SyncConnectionWrapper<SqliteConnection>;

const ACCOUNTS: i64 = 50;
const MESSAGES: u64 = 200;
const CONSUMERS: usize = 4;
/// Transient failures of one message before it is dead-lettered.
const MAX_ATTEMPTS: u32 = 10;
/// Stands in for the real work a handler does between reading and writing (a lookup, a
/// computation). It is what keeps the naive handler's check-then-act window open.
const HANDLER_WORK: Duration = Duration::from_millis(2);

/// The message every delivery carries: credit one account by `amount`, once per
/// `message_id`.
type CreditRequested = inbox_fixtures::credit::Credit<Uuid>;

/// The service's error type: what a handler or the consumer loop can fail with.
#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Db(#[from] diesel::result::Error),
    #[error("no connection from the pool: {0}")]
    Pool(#[from] PoolError),
}

impl AppError {
    /// What the broker should do with a delivery that failed this way.
    fn class(&self) -> ErrorClass {
        match self {
            Self::Db(error) => classify(error),
            // The pool could not connect: worth a retry, like a lost connection.
            Self::Pool(_) => ErrorClass::ConnectionUnusable,
        }
    }
}

// ---------------------------------------------------------------------------------------
// The statements, and the two handlers. Both make the same business change.
//
// The example runs on three backends, so its code is generic over the connection, and
// each generic function states that diesel can run its statements there (the
// `ExecuteDsl` and `LoadQuery` bounds) and that the pool can manage it (`Manager`). A
// service written for one backend takes its connection type, `&mut AsyncPgConnection`
// say, and needs none of them.
// ---------------------------------------------------------------------------------------

/// The naive handler's name for itself in `naive_inbox`.
const NAIVE_CONSUMER: &str = "credit";

#[diesel::dsl::auto_type]
fn credit_account(account_id: i64, amount: i64) -> _ {
    update(accounts::table.find(account_id)).set(accounts::balance.eq(accounts::balance + amount))
}

#[diesel::dsl::auto_type]
fn naive_seen(message_id: String, consumer: &'static str) -> _ {
    select(exists(
        naive_inbox::table.filter(
            naive_inbox::message_id
                .eq(message_id)
                .and(naive_inbox::consumer.eq(consumer)),
        ),
    ))
}

#[diesel::dsl::auto_type]
fn naive_record(message_id: String, consumer: &'static str) -> _ {
    insert_into(naive_inbox::table).values((
        naive_inbox::message_id.eq(message_id),
        naive_inbox::consumer.eq(consumer),
    ))
}

async fn apply_credit<C>(conn: &mut C, msg: &CreditRequested) -> Result<(), AppError>
where
    C: AsyncConnection,
    credit_account: ExecuteDsl<C>,
{
    tokio::time::sleep(HANDLER_WORK).await;
    credit_account(msg.account, msg.amount)
        .execute(conn)
        .await?;
    Ok(())
}

/// With diesel-inbox: the marker row and the credit commit in one transaction, and the
/// inbox's unique index lets exactly one of any number of concurrent copies through.
#[idempotent(consumer = "credit", key = msg.message_id)]
async fn credit<C>(conn: &mut C, msg: &CreditRequested) -> Result<(), AppError>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    credit_account: ExecuteDsl<C>,
{
    apply_credit(conn, msg).await
}

/// The usual hand-written guard: look the message up, and if it is new, record it and
/// apply the credit in one transaction. The look-up runs before the transaction and
/// `naive_inbox` has no unique index, so two consumers holding copies of the same
/// message can both see "new" and both apply it.
async fn credit_naively<C>(conn: &mut C, msg: &CreditRequested) -> Result<Outcome<()>, AppError>
where
    C: AsyncConnection,
    credit_account: ExecuteDsl<C>,
    naive_seen: LoadQuery<'static, C, bool>,
    naive_record: ExecuteDsl<C>,
{
    if naive_seen(msg.message_id.to_string(), NAIVE_CONSUMER)
        .get_result(conn)
        .await?
    {
        return Ok(Outcome::Duplicate);
    }
    conn.transaction::<_, AppError, _>(async |conn| {
        apply_credit(conn, msg).await?;
        naive_record(msg.message_id.to_string(), NAIVE_CONSUMER)
            .execute(conn)
            .await?;
        Ok(())
    })
    .await?;
    Ok(Outcome::Processed(()))
}

#[derive(Debug, Clone, Copy)]
enum Handler {
    Naive,
    Idempotent,
}

impl Handler {
    fn label(self) -> &'static str {
        match self {
            Self::Naive => "naive check-then-act",
            Self::Idempotent => "#[idempotent]",
        }
    }

    async fn handle<C>(self, conn: &mut C, msg: &CreditRequested) -> Result<Outcome<()>, AppError>
    where
        C: AsyncConnection,
        C::Backend: InboxBackend,
        credit_account: ExecuteDsl<C>,
        naive_seen: LoadQuery<'static, C, bool>,
        naive_record: ExecuteDsl<C>,
    {
        match self {
            Self::Naive => credit_naively(conn, msg).await,
            Self::Idempotent => credit(conn, msg).await,
        }
    }
}

// ---------------------------------------------------------------------------------------
// The delivery stream and the consumers racing over it.
// ---------------------------------------------------------------------------------------

/// xorshift64: a deterministic shuffle without a `rand` dependency.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

/// Every message 2 to 4 times, the way an at-least-once broker delivers after lost acks
/// and expired locks. Most copies land within a few slots of each other, so competing
/// consumers get them at the same moment; about a quarter of the redeliveries come much
/// later, after the first copy has long been committed.
fn delivery_stream() -> Vec<CreditRequested> {
    let mut rng = XorShift(0x5eed_1b0c_0ffe_e000);
    let mut slotted = Vec::new();
    for n in 0..MESSAGES {
        let message = CreditRequested {
            message_id: Uuid::from_u64_pair(0x0123_4567_89ab_cdef, n),
            account: (n % ACCOUNTS as u64) as i64,
            amount: 1,
        };
        let copies = 2 + rng.below(3);
        for copy in 0..copies {
            let late = copy > 0 && rng.below(4) == 0;
            let delay = if late {
                64 + rng.below(256)
            } else {
                rng.below(6)
            };
            slotted.push((n * 4 + delay, message));
        }
    }
    // A stable sort keeps the order deterministic among equal slots.
    slotted.sort_by_key(|(slot, _)| *slot);
    slotted.into_iter().map(|(_, message)| message).collect()
}

/// One delivery in the broker's queue.
struct Delivery {
    message: CreditRequested,
    attempt: u32,
}

/// What one consumer saw, merged over all consumers at the end.
#[derive(Default)]
struct Tally {
    /// Deliveries per message whose handler committed (`Outcome::Processed`).
    committed: HashMap<Uuid, u32>,
    retries: usize,
    dead_letters: Vec<String>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        for (id, count) in other.committed {
            *self.committed.entry(id).or_default() += count;
        }
        self.retries += other.retries;
        self.dead_letters.extend(other.dead_letters);
    }
}

/// A consumer instance: takes deliveries off the shared queue until it is empty, each on
/// a connection from the pool, acks processed and duplicate outcomes, redelivers on
/// transient errors and dead-letters the rest, as a broker client would. The pool
/// discards a connection that an error left inside a transaction.
async fn consume<C>(pool: Pool<C>, queue: Arc<Mutex<VecDeque<Delivery>>>, handler: Handler) -> Tally
where
    C: TestConnection,
    AsyncDieselConnectionManager<C>: Manager<Type = C, Error = ConnectionPoolError>,
    credit_account: ExecuteDsl<C>,
    naive_seen: LoadQuery<'static, C, bool>,
    naive_record: ExecuteDsl<C>,
{
    let mut tally = Tally::default();
    loop {
        let Some(delivery) = queue.lock().await.pop_front() else {
            return tally;
        };
        let message = delivery.message;
        let outcome = match pool.get().await {
            Ok(mut conn) => handler.handle(&mut *conn, &message).await,
            Err(error) => Err(error.into()),
        };
        match outcome {
            Ok(Outcome::Processed(())) => {
                *tally.committed.entry(message.message_id).or_default() += 1
            }
            Ok(Outcome::Duplicate) => {}
            // Only claim-mode handlers answer this: another delivery holds the message.
            Ok(Outcome::InProgress { .. }) => queue.lock().await.push_back(Delivery {
                message,
                attempt: delivery.attempt,
            }),
            Err(error) => match error.class() {
                class if class.is_retryable() && delivery.attempt < MAX_ATTEMPTS => {
                    tally.retries += 1;
                    queue.lock().await.push_back(Delivery {
                        message,
                        attempt: delivery.attempt + 1,
                    });
                }
                class => tally.dead_letters.push(format!(
                    "a delivery of {} ({class:?} error, attempt {}): {error}",
                    message.message_id, delivery.attempt
                )),
            },
        }
    }
}

/// The result of one handler's run over the whole stream.
struct Run {
    handler: Handler,
    deliveries: usize,
    /// Sum of all balances: one per committed credit.
    applied: i64,
    /// One per distinct message.
    expected: usize,
    tally: Tally,
}

impl Run {
    fn verdict(&self) -> String {
        let repeated = self.tally.committed.values().filter(|&&n| n > 1).count();
        let never = self.expected - self.tally.committed.len();
        let mut problems = Vec::new();
        if repeated > 0 {
            problems.push(format!("{} applied more than once", messages(repeated)));
        }
        if never > 0 {
            problems.push(format!("{} never applied", messages(never)));
        }
        let acked: u32 = self.tally.committed.values().sum();
        if i64::from(acked) != self.applied {
            problems.push(format!(
                "{acked} commits reported but {} credits in the balances",
                self.applied
            ));
        }
        if problems.is_empty() {
            "OK: exactly once".to_owned()
        } else {
            format!("WRONG: {}", problems.join(", "))
        }
    }
}

fn messages(count: usize) -> String {
    match count {
        1 => "1 message".to_owned(),
        _ => format!("{count} messages"),
    }
}

/// Start-up, as a service does it, then `CONSUMERS` consumers over `stream` with
/// `handler`, on a pool of as many connections.
async fn race<C>(
    pool: Pool<C>,
    handler: Handler,
    stream: &[CreditRequested],
) -> Result<Run, BoxError>
where
    C: TestConnection,
    AsyncDieselConnectionManager<C>: Manager<Type = C, Error = ConnectionPoolError>,
    credit_account: ExecuteDsl<C>,
    naive_seen: LoadQuery<'static, C, bool>,
    naive_record: ExecuteDsl<C>,
    C: CreditTables,
{
    {
        let mut conn = pool.get().await?;
        diesel_inbox::migrate(&mut *conn).await?;
        conn.create_credit_tables(ACCOUNTS).await?;
    }
    let queue = stream
        .iter()
        .map(|&message| Delivery {
            message,
            attempt: 1,
        })
        .collect::<VecDeque<_>>();
    let queue = Arc::new(Mutex::new(queue));
    let consumers = (0..CONSUMERS)
        .map(|_| tokio::spawn(consume(pool.clone(), Arc::clone(&queue), handler)))
        .collect::<Vec<_>>();
    let mut tally = Tally::default();
    for consumer in consumers {
        tally.merge(consumer.await?);
    }
    let balances = pool.get().await?.balances().await?;
    Ok(Run {
        handler,
        deliveries: stream.len(),
        applied: balances.iter().sum(),
        expected: stream
            .iter()
            .map(|m| m.message_id)
            .collect::<HashSet<_>>()
            .len(),
        tally,
    })
}

/// Runs `handler`'s race in a scratch place of its own, and drops the place afterwards,
/// even when the race failed.
async fn race_in<C>(
    db: TestDatabase<C>,
    config: ManagerConfig<C>,
    handler: Handler,
    stream: &[CreditRequested],
) -> Result<Run, BoxError>
where
    C: TestConnection,
    AsyncDieselConnectionManager<C>: Manager<Type = C, Error = ConnectionPoolError>,
    credit_account: ExecuteDsl<C>,
    naive_seen: LoadQuery<'static, C, bool>,
    naive_record: ExecuteDsl<C>,
    C: CreditTables,
{
    let manager = AsyncDieselConnectionManager::new_with_config(db.url(), config);
    let pool = Pool::builder(manager).max_size(CONSUMERS).build()?;
    let run = race(pool, handler, stream).await;
    let removed = db.cleanup().await;
    // The race's error explains more than a failed cleanup after it.
    let run = run?;
    removed?;
    Ok(run)
}

/// Each pooled SQLite connection waits for the write lock instead of failing at once
/// with `SQLITE_BUSY` (set first, so that it covers the switch to WAL), and WAL lets
/// readers run beside the writer.
fn sqlite_setup() -> ManagerConfig<SqliteConn> {
    let mut config = ManagerConfig::default();
    config.custom_setup = Box::new(|url| {
        let url = url.to_owned();
        Box::pin(async move {
            let mut conn = SqliteConn::establish(&url).await?;
            conn.batch_execute("PRAGMA busy_timeout = 10000; PRAGMA journal_mode = WAL;")
                .await
                .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
            Ok(conn)
        })
    });
    config
}

/// Where the demo runs: the embedded SQLite, or the server `DATABASE_URL` names, whose
/// backend's feature the build must have.
enum Place {
    Sqlite,
    #[cfg(feature = "postgres")]
    Postgres(String),
    #[cfg(feature = "mysql")]
    Mysql(String),
}

impl Place {
    fn from_env() -> Result<Self, BoxError> {
        let url = std::env::var("DATABASE_URL").unwrap_or_default();
        match url.split("://").next() {
            _ if url.is_empty() => Ok(Self::Sqlite),
            #[cfg(feature = "postgres")]
            Some("postgres" | "postgresql") => Ok(Self::Postgres(url)),
            #[cfg(not(feature = "postgres"))]
            Some("postgres" | "postgresql") => Err(feature_off("PostgreSQL", "postgres")),
            #[cfg(feature = "mysql")]
            Some("mysql") => Ok(Self::Mysql(url)),
            #[cfg(not(feature = "mysql"))]
            Some("mysql") => Err(feature_off("MySQL", "mysql")),
            _ => Err(
                "DATABASE_URL must start with postgres:// or mysql:// (unset it for SQLite)".into(),
            ),
        }
    }

    fn describe(&self) -> &'static str {
        match self {
            Self::Sqlite => "SQLite, a temporary file",
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => "PostgreSQL, a scratch schema",
            #[cfg(feature = "mysql")]
            Self::Mysql(_) => "MySQL, a scratch database",
        }
    }

    /// Runs `handler`'s race in a scratch place named `name`.
    async fn race(
        &self,
        name: &str,
        handler: Handler,
        stream: &[CreditRequested],
    ) -> Result<Run, BoxError> {
        match self {
            Self::Sqlite => {
                let db = TestDatabase::sqlite(name).await?;
                race_in(db, sqlite_setup(), handler, stream).await
            }
            #[cfg(feature = "postgres")]
            Self::Postgres(url) => {
                let db = TestDatabase::postgres(url, name).await?;
                race_in(db, ManagerConfig::default(), handler, stream).await
            }
            #[cfg(feature = "mysql")]
            Self::Mysql(url) => {
                let db = TestDatabase::mysql(url, name).await?;
                race_in(db, ManagerConfig::default(), handler, stream).await
            }
        }
    }
}

/// Why `DATABASE_URL` names a server this build cannot reach.
#[cfg(any(not(feature = "postgres"), not(feature = "mysql")))]
fn feature_off(server: &str, feature: &str) -> BoxError {
    format!(
        "DATABASE_URL names a {server} server, but the example was built without the \
         `{feature}` feature: run it with `--features sqlite,testing,{feature}`"
    )
    .into()
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // Before consuming anything: two handlers sharing a consumer name would suppress
    // each other's messages.
    diesel_inbox::check_consumers()?;
    let place = Place::from_env()?;
    let stream = delivery_stream();
    println!("diesel-inbox quickstart on {}", place.describe());
    println!(
        "{MESSAGES} credit messages, {} deliveries (2-4 copies each), {CONSUMERS} consumers \
         on a pool of {CONSUMERS} connections\n",
        stream.len()
    );

    let mut runs = Vec::new();
    for handler in [Handler::Naive, Handler::Idempotent] {
        // The pid keeps two runs at the same time apart.
        let name = format!("quickstart_{}_{handler:?}", std::process::id()).to_lowercase();
        runs.push(place.race(&name, handler, &stream).await?);
    }

    println!(
        "{:<20} {:>10} {:>8} {:>9} {:>8}  verdict",
        "handler", "deliveries", "applied", "expected", "retries"
    );
    for run in &runs {
        println!(
            "{:<20} {:>10} {:>8} {:>9} {:>8}  {}",
            run.handler.label(),
            run.deliveries,
            run.applied,
            run.expected,
            run.tally.retries,
            run.verdict()
        );
    }
    for run in &runs {
        for dead_letter in &run.tally.dead_letters {
            println!("{}: dead-lettered {dead_letter}", run.handler.label());
        }
    }
    Ok(())
}
