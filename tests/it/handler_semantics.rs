//! An `#[idempotent]` handler owns its parameters as the plain `async fn` would: the
//! body's writes to them are the parameters' own, and they drop once the transaction is
//! over, after COMMIT or ROLLBACK. Checked on SQLite, from a second connection.

use std::sync::{Arc, Mutex};

use diesel::connection::SimpleConnection as _;
use diesel::result::Error;
use diesel::sqlite::SqliteConnection;
use diesel::{Connection as _, RunQueryDsl as _};
use diesel_async::SimpleAsyncConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_inbox::testing::TestDatabase;
use diesel_inbox::{Outcome, idempotent};

type Conn = SyncConnectionWrapper<SqliteConnection>;

type Db = TestDatabase<Conn>;

/// A database file of the test's own, with a connection to it.
async fn create(test: &str) -> (Db, Conn) {
    let db = TestDatabase::sqlite(test)
        .await
        .expect("create the test database");
    let conn = db.connect().await.expect("open SQLite file");
    (db, conn)
}

/// What a parameter saw as it dropped.
#[derive(Debug, PartialEq, Eq)]
struct Dropped {
    name: &'static str,
    acked: bool,
    /// Whether a second connection sees the marker committed.
    marker_committed: bool,
    /// Whether the handler's transaction still held SQLite's write lock.
    transaction_open: bool,
}

/// An ack handle: whoever drops it looks at the database from a second connection, as
/// a broker client acking on drop would act on the outcome.
struct Delivery {
    name: &'static str,
    acked: bool,
    /// The test database's file.
    db: String,
    drops: Arc<Mutex<Vec<Dropped>>>,
}

impl Delivery {
    fn new(name: &'static str, db: &Db, drops: &Arc<Mutex<Vec<Dropped>>>) -> Self {
        Self {
            name,
            acked: false,
            db: db.url().to_owned(),
            drops: Arc::clone(drops),
        }
    }

    fn name(&self) -> &'static str {
        self.name
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        let mut other = SqliteConnection::establish(&self.db).expect("second connection");
        let markers: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
            "(SELECT COUNT(*) FROM inbox)",
        ))
        .get_result(&mut other)
        .expect("count markers");
        // Without waiting, BEGIN IMMEDIATE fails while another connection holds the
        // write lock, which the handler's transaction takes with its marker insert.
        let transaction_open = other
            .batch_execute("PRAGMA busy_timeout = 0; BEGIN IMMEDIATE; ROLLBACK;")
            .is_err();
        self.drops.lock().expect("not poisoned").push(Dropped {
            name: self.name,
            acked: self.acked,
            marker_committed: markers > 0,
            transaction_open,
        });
    }
}

/// Acks the delivery it is handed, reads a second parameter, and leaves a third alone.
#[idempotent(consumer = "semantics-ack", key = key)]
async fn ack(
    conn: &mut Conn,
    key: &str,
    mut delivery: Delivery,
    read: Delivery,
    _unused: Delivery,
    fail: bool,
) -> Result<usize, Error> {
    conn.batch_execute("SELECT 1").await?;
    delivery.acked = true;
    if fail {
        return Err(Error::RollbackTransaction);
    }
    Ok(read.name().len())
}

fn after_transaction(name: &'static str, acked: bool, committed: bool) -> Dropped {
    Dropped {
        name,
        acked,
        marker_committed: committed,
        transaction_open: false,
    }
}

/// Every parameter, in the order a plain `async fn` drops them: the last first.
fn deliveries(db: &Db, drops: &Arc<Mutex<Vec<Dropped>>>) -> (Delivery, Delivery, Delivery) {
    (
        Delivery::new("delivery", db, drops),
        Delivery::new("read", db, drops),
        Delivery::new("unused", db, drops),
    )
}

#[tokio::test]
async fn parameters_keep_the_bodys_writes_and_drop_after_commit() {
    let (db, mut conn) = create("commit").await;
    let drops = Arc::default();
    let (delivery, read, unused) = deliveries(&db, &drops);
    let outcome = ack(&mut conn, "m1", delivery, read, unused, false).await;
    assert!(matches!(outcome, Ok(Outcome::Processed(4))), "{outcome:?}");
    assert_eq!(
        *drops.lock().expect("not poisoned"),
        [
            after_transaction("unused", false, true),
            after_transaction("read", false, true),
            after_transaction("delivery", true, true),
        ]
    );
}

#[tokio::test]
async fn parameters_drop_after_rollback() {
    let (db, mut conn) = create("rollback").await;
    let drops = Arc::default();
    let (delivery, read, unused) = deliveries(&db, &drops);
    let outcome = ack(&mut conn, "m1", delivery, read, unused, true).await;
    assert!(
        matches!(outcome, Err(Error::RollbackTransaction)),
        "{outcome:?}"
    );
    assert_eq!(
        *drops.lock().expect("not poisoned"),
        [
            after_transaction("unused", false, false),
            after_transaction("read", false, false),
            after_transaction("delivery", true, false),
        ]
    );
}

#[tokio::test]
async fn a_duplicate_drops_its_parameters_untouched_after_its_transaction() {
    let (db, mut conn) = create("duplicate").await;
    let first = Arc::default();
    let (delivery, read, unused) = deliveries(&db, &first);
    let outcome = ack(&mut conn, "m1", delivery, read, unused, false).await;
    assert!(matches!(outcome, Ok(Outcome::Processed(_))), "{outcome:?}");

    let drops = Arc::default();
    let (delivery, read, unused) = deliveries(&db, &drops);
    let outcome = ack(&mut conn, "m1", delivery, read, unused, false).await;
    assert!(matches!(outcome, Ok(Outcome::Duplicate)), "{outcome:?}");
    assert_eq!(
        *drops.lock().expect("not poisoned"),
        [
            after_transaction("unused", false, true),
            after_transaction("read", false, true),
            after_transaction("delivery", false, true),
        ]
    );
}
