//! Several consumers race over a stream of duplicated deliveries, first with the usual
//! hand-written "have I seen this message?" check, then with `#[idempotent]`.
//!
//! ```text
//! cargo run --example quickstart                                        # embedded SQLite
//! DATABASE_URL=postgres://user@host/db cargo run --example quickstart   # PostgreSQL
//! DATABASE_URL=mysql://user@host/db cargo run --example quickstart      # MySQL, MariaDB
//! ```
//!
//! SQLite runs in a temporary file. On a server the example works in a schema
//! (PostgreSQL) or database (MySQL) of its own, `quickstart_<pid>`, and drops it at the
//! end: the inbox table is always called `inbox`, so sharing a schema with other users
//! would mix their markers with ours.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use diesel::QueryResult;
use diesel::dsl::sql;
use diesel::expression::SqlLiteral;
use diesel::sql_types::{BigInt, Bool};
use diesel::sqlite::SqliteConnection;
use diesel_async::methods::LoadQuery;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{
    AsyncConnection, AsyncMysqlConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection,
};
use diesel_inbox::{InboxBackend, Outcome, classify, idempotent};
use tokio::sync::Mutex;
use uuid::Uuid;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type SqliteConn = SyncConnectionWrapper<SqliteConnection>;

const ACCOUNTS: u64 = 50;
const MESSAGES: u64 = 200;
const CONSUMERS: usize = 4;
/// Transient failures of one message before it is dead-lettered.
const MAX_ATTEMPTS: u32 = 10;
/// Stands in for the real work a handler does between reading and writing (a lookup, a
/// computation). It is what keeps the naive handler's check-then-act window open.
const HANDLER_WORK: Duration = Duration::from_millis(2);

/// The message every delivery carries: credit one account by `amount`.
#[derive(Debug, Clone, Copy)]
struct CreditRequested {
    id: Uuid,
    account_id: u64,
    amount: i64,
}

// ---------------------------------------------------------------------------------------
// The two handlers. Both make the same business change, `apply_credit`.
// ---------------------------------------------------------------------------------------

/// With diesel-inbox: the marker row and the credit commit in one transaction, and the
/// inbox's unique index lets exactly one of any number of concurrent copies through.
#[idempotent(consumer = "credit", key = msg.id)]
async fn credit<C>(conn: &mut C, msg: &CreditRequested) -> Result<(), diesel::result::Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    apply_credit(conn, msg).await
}

/// The usual hand-written guard: look the message up, and if it is new, record it and
/// apply the credit in one transaction. The look-up runs before the transaction and
/// `naive_inbox` has no unique index, so two consumers holding copies of the same
/// message can both see "new" and both apply it.
async fn credit_naively<C: DemoConnection>(
    conn: &mut C,
    msg: &CreditRequested,
) -> QueryResult<Outcome<()>> {
    let seen = conn
        .query_bool(format!(
            "SELECT EXISTS (SELECT 1 FROM naive_inbox \
             WHERE message_id = '{}' AND consumer = 'credit')",
            msg.id
        ))
        .await?;
    if seen {
        return Ok(Outcome::Duplicate);
    }
    conn.transaction::<_, diesel::result::Error, _>(async |conn| {
        apply_credit(conn, msg).await?;
        conn.batch_execute(&format!(
            "INSERT INTO naive_inbox (message_id, consumer) VALUES ('{}', 'credit')",
            msg.id
        ))
        .await
    })
    .await?;
    Ok(Outcome::Processed(()))
}

async fn apply_credit<C: AsyncConnection>(conn: &mut C, msg: &CreditRequested) -> QueryResult<()> {
    tokio::time::sleep(HANDLER_WORK).await;
    conn.batch_execute(&format!(
        "UPDATE accounts SET balance = balance + {} WHERE id = {}",
        msg.amount, msg.account_id
    ))
    .await
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

    async fn handle<C: DemoConnection>(
        self,
        conn: &mut C,
        msg: &CreditRequested,
    ) -> QueryResult<Outcome<()>> {
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
            id: Uuid::from_u64_pair(0x0123_4567_89ab_cdef, n),
            account_id: 1 + n % ACCOUNTS,
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

/// A consumer instance: takes deliveries off the shared queue until it is empty, acks
/// processed and duplicate outcomes, redelivers on transient errors and dead-letters the
/// rest, as a broker client would.
async fn consume<C: DemoConnection>(
    target: Arc<Target>,
    mut conn: C,
    queue: Arc<Mutex<VecDeque<Delivery>>>,
    handler: Handler,
) -> Result<Tally, BoxError> {
    let mut tally = Tally::default();
    loop {
        let Some(delivery) = queue.lock().await.pop_front() else {
            return Ok(tally);
        };
        let message = delivery.message;
        match handler.handle(&mut conn, &message).await {
            Ok(Outcome::Processed(())) => *tally.committed.entry(message.id).or_default() += 1,
            Ok(Outcome::Duplicate) => {}
            Err(error) => match classify(&error) {
                class if class.is_retryable() && delivery.attempt < MAX_ATTEMPTS => {
                    tally.retries += 1;
                    queue.lock().await.push_back(Delivery {
                        message,
                        attempt: delivery.attempt + 1,
                    });
                    // A fresh connection serves both kinds of retry, including
                    // `ConnectionUnusable`.
                    conn = connect(&target).await?;
                }
                class => tally.dead_letters.push(format!(
                    "a delivery of {} ({class:?} error, attempt {}): {error}",
                    message.id, delivery.attempt
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

/// Runs both handlers on fresh state over the same deliveries.
async fn compare<C: DemoConnection>(
    target: &Arc<Target>,
    stream: &[CreditRequested],
) -> Result<Vec<Run>, BoxError> {
    let mut admin = connect::<C>(target).await?;
    diesel_inbox::migrate(&mut admin).await?;
    admin
        .batch_execute(
            "CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL);
             -- Deliberately without a unique index: that is the naive handler's mistake.
             CREATE TABLE naive_inbox (
                 message_id VARCHAR(255) NOT NULL,
                 consumer VARCHAR(255) NOT NULL
             );",
        )
        .await?;
    let distinct = stream.iter().map(|m| m.id).collect::<HashSet<_>>().len();

    let mut runs = Vec::new();
    for handler in [Handler::Naive, Handler::Idempotent] {
        reset(&mut admin).await?;
        // Connect everyone before starting so that the consumers really run side by side.
        let mut consumers = Vec::with_capacity(CONSUMERS);
        for _ in 0..CONSUMERS {
            consumers.push(connect::<C>(target).await?);
        }
        let queue = stream
            .iter()
            .map(|&message| Delivery {
                message,
                attempt: 1,
            })
            .collect::<VecDeque<_>>();
        let queue = Arc::new(Mutex::new(queue));
        let tasks = consumers
            .into_iter()
            .map(|conn| tokio::spawn(consume(target.clone(), conn, queue.clone(), handler)))
            .collect::<Vec<_>>();
        // Wait for every consumer before looking at any result, so that none is still
        // running when the tables are reset or dropped.
        let mut results = Vec::with_capacity(tasks.len());
        for task in tasks {
            results.push(task.await?);
        }
        let mut tally = Tally::default();
        for result in results {
            tally.merge(result?);
        }
        let balances = admin
            .query_i64s("SELECT balance FROM accounts".to_owned())
            .await?;
        runs.push(Run {
            handler,
            deliveries: stream.len(),
            applied: balances.iter().sum(),
            expected: distinct,
            tally,
        });
    }
    Ok(runs)
}

/// Empties every table and opens the accounts at zero.
async fn reset<C: AsyncConnection>(conn: &mut C) -> QueryResult<()> {
    let accounts = (1..=ACCOUNTS)
        .map(|id| format!("({id}, 0)"))
        .collect::<Vec<_>>()
        .join(", ");
    conn.batch_execute(&format!(
        "DELETE FROM inbox; DELETE FROM naive_inbox; DELETE FROM accounts;
         INSERT INTO accounts (id, balance) VALUES {accounts};"
    ))
    .await
}

// ---------------------------------------------------------------------------------------
// Where the example runs: picking the backend, isolating from other users, cleaning up.
// ---------------------------------------------------------------------------------------

/// The database the example runs on, and its private corner of it.
enum Target {
    Sqlite {
        path: PathBuf,
    },
    Postgres {
        url: String,
        schema: String,
    },
    Mysql {
        server_url: String,
        url: String,
        database: String,
    },
}

impl Target {
    fn from_env() -> Result<Self, BoxError> {
        let name = format!("quickstart_{}", std::process::id());
        let url = std::env::var("DATABASE_URL").unwrap_or_default();
        if url.is_empty() {
            // The pid alone could match a file left behind by a crashed earlier run.
            let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
            let path = std::env::temp_dir().join(format!("diesel-inbox-{name}-{nanos}.sqlite3"));
            Ok(Self::Sqlite { path })
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Self::Postgres { url, schema: name })
        } else if url.starts_with("mysql://") {
            Ok(Self::Mysql {
                url: with_database(&url, &name),
                server_url: url,
                database: name,
            })
        } else {
            Err("DATABASE_URL must start with postgres:// or mysql:// (unset it for SQLite)".into())
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Sqlite { path } => format!("SQLite, temporary file {}", path.display()),
            Self::Postgres { schema, .. } => format!("PostgreSQL, schema {schema}"),
            Self::Mysql { database, .. } => format!("MySQL, database {database}"),
        }
    }

    async fn run(self: &Arc<Self>, stream: &[CreditRequested]) -> Result<Vec<Run>, BoxError> {
        match **self {
            Self::Sqlite { .. } => compare::<SqliteConn>(self, stream).await,
            Self::Postgres { .. } => compare::<AsyncPgConnection>(self, stream).await,
            Self::Mysql { .. } => compare::<AsyncMysqlConnection>(self, stream).await,
        }
    }

    /// Creates the schema or database the example works in (a leftover from a crashed
    /// run with the same pid is dropped first).
    async fn create(&self) -> Result<(), BoxError> {
        match self {
            Self::Sqlite { .. } => {}
            Self::Postgres { url, schema } => {
                let mut conn = AsyncPgConnection::establish(url).await?;
                conn.batch_execute(&format!(
                    "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
                ))
                .await?;
            }
            Self::Mysql {
                server_url,
                database,
                ..
            } => {
                let mut conn = AsyncMysqlConnection::establish(server_url).await?;
                conn.batch_execute(&format!(
                    "DROP DATABASE IF EXISTS {database}; CREATE DATABASE {database}"
                ))
                .await?;
            }
        }
        Ok(())
    }

    /// Drops everything [`Target::create`] and the example made.
    async fn remove(&self) -> Result<(), BoxError> {
        match self {
            Self::Sqlite { path } => {
                for suffix in ["", "-wal", "-shm"] {
                    let mut file = path.clone().into_os_string();
                    file.push(suffix);
                    match std::fs::remove_file(&file) {
                        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                            return Err(error.into());
                        }
                        _ => {}
                    }
                }
            }
            Self::Postgres { url, schema } => {
                let mut conn = AsyncPgConnection::establish(url).await?;
                conn.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                    .await?;
            }
            Self::Mysql {
                server_url,
                database,
                ..
            } => {
                let mut conn = AsyncMysqlConnection::establish(server_url).await?;
                conn.batch_execute(&format!("DROP DATABASE IF EXISTS {database}"))
                    .await?;
            }
        }
        Ok(())
    }
}

/// Opens a connection to the example's own schema or database.
async fn connect<C: AsyncConnection>(target: &Target) -> Result<C, BoxError> {
    let (url, session) = match target {
        // The busy timeout makes a second writer wait for the lock instead of failing at
        // once with SQLITE_BUSY (it is set first so that it covers the switch to WAL);
        // WAL lets readers run beside the writer.
        Target::Sqlite { path } => (
            path.to_str().ok_or("temporary path is not UTF-8")?,
            Some("PRAGMA busy_timeout = 10000; PRAGMA journal_mode = WAL;".to_owned()),
        ),
        Target::Postgres { url, schema } => {
            (url.as_str(), Some(format!("SET search_path TO {schema}")))
        }
        Target::Mysql { url, .. } => (url.as_str(), None),
    };
    let mut conn = C::establish(url).await?;
    if let Some(session) = session {
        conn.batch_execute(&session).await?;
    }
    Ok(conn)
}

/// `mysql://user@host:3306/db?options` with its database replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let (base, options) = match url.split_once('?') {
        Some((base, options)) => (base, Some(options)),
        None => (url, None),
    };
    let authority = base.find("://").map_or(0, |scheme| scheme + 3);
    let path = base[authority..]
        .find('/')
        .map_or(base.len(), |slash| authority + slash);
    let mut replaced = format!("{}/{database}", &base[..path]);
    if let Some(options) = options {
        replaced.push('?');
        replaced.push_str(options);
    }
    replaced
}

/// What the demo's own bookkeeping reads back through raw SQL. diesel states the bounds
/// for that per backend; the blanket impl below states them once, so the generic
/// functions above only need `C: DemoConnection`.
trait DemoConnection: AsyncConnection<Backend: InboxBackend> + 'static {
    fn query_bool(&mut self, query: String) -> impl Future<Output = QueryResult<bool>> + Send;
    fn query_i64s(&mut self, query: String) -> impl Future<Output = QueryResult<Vec<i64>>> + Send;
}

impl<C> DemoConnection for C
where
    C: AsyncConnection<Backend: InboxBackend> + 'static,
    for<'q> SqlLiteral<Bool>: LoadQuery<'q, C, bool>,
    for<'q> SqlLiteral<BigInt>: LoadQuery<'q, C, i64>,
{
    fn query_bool(&mut self, query: String) -> impl Future<Output = QueryResult<bool>> + Send {
        sql::<Bool>(&query).get_result(self)
    }

    fn query_i64s(&mut self, query: String) -> impl Future<Output = QueryResult<Vec<i64>>> + Send {
        sql::<BigInt>(&query).load(self)
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let target = Arc::new(Target::from_env()?);
    let stream = delivery_stream();
    println!("diesel-inbox quickstart on {}", target.describe());
    println!(
        "{MESSAGES} credit messages, {} deliveries (2-4 copies each), {CONSUMERS} consumers \
         with a connection each\n",
        stream.len()
    );

    target.create().await?;
    let runs = target.run(&stream).await;
    // Clean up even when the run failed, but report the run's error first.
    let removed = target.remove().await;
    let runs = runs?;
    removed?;

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
