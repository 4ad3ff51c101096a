//! The SQLite suite: a database file per test, WAL, several connections.

use crate::common;

use diesel::result::Error;
use diesel::sqlite::SqliteConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, SimpleAsyncConnection};
use diesel_inbox::testing::{TestDatabase, select_i64};
use diesel_inbox::{ErrorClass, Outcome, classify, idempotent};

use common::{Credit, TestDb, bounded};

type Conn = SyncConnectionWrapper<SqliteConnection>;

#[derive(Clone)]
struct SqliteDb {
    database: TestDatabase<Conn>,
    /// Whether connections share one page cache, where `PRAGMA read_uncommitted` lets a
    /// connection read what the others have not committed.
    shared_cache: bool,
    /// Whether connections open a file of the same directory whose text is UTF-16
    /// (`PRAGMA encoding = 'UTF-16le'`), as some .NET and Windows tools create them.
    utf16: bool,
}

/// The test's database file.
async fn create(test: &str) -> Option<SqliteDb> {
    let database = TestDatabase::sqlite(test).await;
    Some(SqliteDb {
        database: database.expect("create the test database"),
        shared_cache: false,
        utf16: false,
    })
}

/// A database file of the test's whose text is UTF-16, with the inbox migrated into it.
async fn create_utf16(test: &str) -> Option<SqliteDb> {
    let db = SqliteDb {
        utf16: true,
        ..create(test).await?
    };
    let mut conn = db.connect().await;
    diesel_inbox::migrate(&mut conn).await.expect("migrate");
    assert_eq!(
        select_i64(
            &mut conn,
            "SELECT COUNT(*) FROM pragma_encoding WHERE encoding = 'UTF-16le'"
        )
        .await
        .unwrap(),
        1
    );
    Some(db)
}

/// `key`'s UTF-16LE bytes as hex digits: how a UTF-16 file stores its text.
fn utf16_hex(key: &str) -> String {
    key.encode_utf16()
        .flat_map(u16::to_le_bytes)
        .map(|byte| format!("{byte:02X}"))
        .collect()
}

impl TestDb for SqliteDb {
    type Conn = Conn;

    fn database(&self) -> &TestDatabase<Conn> {
        &self.database
    }

    async fn connect(&self) -> Conn {
        if self.utf16 {
            let path = self
                .database
                .url()
                .replace("inbox.sqlite3", "utf16.sqlite3");
            let mut conn = Conn::establish(&path).await.expect("open SQLite file");
            // Takes effect only on a file still empty: the first connection's.
            conn.batch_execute("PRAGMA encoding = 'UTF-16le'; PRAGMA busy_timeout = 10000;")
                .await
                .expect("configure SQLite");
            return conn;
        }
        if !self.shared_cache {
            return self.database.connect().await.expect("open SQLite file");
        }
        let url = format!("file:{}?cache=shared", self.database.url());
        let mut conn = Conn::establish(&url).await.expect("open SQLite file");
        conn.batch_execute("PRAGMA busy_timeout = 10000; PRAGMA journal_mode = WAL;")
            .await
            .expect("configure SQLite");
        conn
    }

    async fn lock_waiters(&self) -> Option<i64> {
        None
    }
}

common_scenarios!(create);
outbox_scenarios!(
    create,
    sessions = [
        "PRAGMA read_uncommitted = ON",
        "PRAGMA synchronous = OFF",
        "PRAGMA recursive_triggers = ON; PRAGMA foreign_keys = ON",
        "PRAGMA case_sensitive_like = ON",
    ],
);
batch_scenarios!(create, swallowed = "ROLLBACK");
verdict_scenarios!(
    create,
    lock_wait = "PRAGMA busy_timeout = 0",
    read_only = "PRAGMA query_only = 1"
);
key_scenarios!(
    create,
    common::keys::Storage {
        refuses_nul: false,
        stored_hex: "hex(CAST(message_id AS BLOB))",
        expected_hex: common::keys::utf8_hex,
    };
    keys_are_stored_as_encoded => "",
);
key_scenarios!(
    create_utf16,
    common::keys::Storage {
        refuses_nul: false,
        stored_hex: "hex(CAST(message_id AS BLOB))",
        expected_hex: utf16_hex,
    };
    keys_are_stored_as_encoded_in_utf16 => "",
);

/// In a UTF-16 file the one-message path stored its hex literals as UTF-16 text, so
/// m-1, m-2 and m-3 became one marker (the last two bodies never ran), "7" was stored
/// empty, and the consumers "ledger1" and "ledger2" as one name.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_utf16_file_keeps_keys_and_consumers_apart() {
    let Some(db) = create_utf16("utf16_apart").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 1).await;
        let mut conn = db.connect().await;
        for key in ["m-1", "m-2", "m-3", "7", "8"] {
            let message = Credit {
                message_id: key.to_owned(),
                account: 0,
                amount: 1,
            };
            for delivery in [Outcome::Processed(()), Outcome::Duplicate] {
                assert_eq!(
                    ledger1(&mut conn, &message).await.unwrap(),
                    delivery,
                    "{key}"
                );
                assert_eq!(
                    ledger2(&mut conn, &message).await.unwrap(),
                    delivery,
                    "{key}"
                );
            }
        }
        let stored = "SELECT COUNT(*) FROM inbox WHERE consumer IN ('ledger1', 'ledger2') \
                      AND message_id IN ('m-1', 'm-2', 'm-3', '7', '8')";
        assert_eq!(select_i64(&mut conn, stored).await.unwrap(), 10);
        assert_eq!(common::balances(&db, 1).await, vec![10]);
    })
    .await;
    db.cleanup().await;
}

#[idempotent(consumer = "ledger1", key = credit.message_id.as_str())]
async fn ledger1(conn: &mut Conn, credit: &Credit) -> Result<(), Error> {
    common::apply(conn, credit).await
}

#[idempotent(consumer = "ledger2", key = credit.message_id.as_str())]
async fn ledger2(conn: &mut Conn, credit: &Credit) -> Result<(), Error> {
    common::apply(conn, credit).await
}

#[tokio::test]
async fn own_errors_say_their_verdict() {
    common::verdicts::own_errors_say_their_verdict().await;
}

/// Credits the account, then records a ledger entry that already exists with
/// `OR ROLLBACK`: SQLite answers the constraint violation by rolling back the whole
/// transaction, and the handler carries on as if nothing happened.
#[idempotent(consumer = "rollback-swallowing", key = credit.message_id.as_str(), fast_path = false)]
async fn rollback_swallowing_credit(conn: &mut Conn, credit: &Credit) -> Result<(), Error> {
    conn.batch_execute(&format!(
        "UPDATE accounts SET balance = balance + 1 WHERE id = {}",
        credit.account
    ))
    .await?;
    let _ignored = conn
        .batch_execute("INSERT OR ROLLBACK INTO ledger (entry) VALUES ('taken')")
        .await;
    Ok(())
}

/// `Processed` must mean committed even when the database rolled the transaction back
/// under a body that swallowed the error.
#[tokio::test]
async fn swallowed_rollback_is_not_reported_processed() {
    let Some(db) = create("swallowed_rollback").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 1).await;
        let mut conn = db.connect().await;
        conn.batch_execute("INSERT INTO ledger (entry) VALUES ('taken')")
            .await
            .unwrap();
        let error = rollback_swallowing_credit(&mut conn, &Credit::numbered(0))
            .await
            .expect_err("not committed");
        assert_eq!(classify(&error), ErrorClass::Transient, "{error}");
        assert!(error.to_string().contains("rolled back"), "{error}");
        assert_eq!(
            select_i64(&mut conn, "SELECT COUNT(*) FROM inbox")
                .await
                .unwrap(),
            0
        );
        assert_eq!(common::balances(&db, 1).await, vec![0]);
        // The transaction is over and the connection serves the next delivery.
        assert_eq!(
            common::credit(&mut conn, &Credit::numbered(0))
                .await
                .unwrap(),
            Outcome::Processed(())
        );
        assert_eq!(common::balances(&db, 1).await, vec![1]);
    })
    .await;
    db.cleanup().await;
}

/// With a shared cache and `PRAGMA read_uncommitted = 1`, a read sees another
/// connection's uncommitted marker. The fast path must not answer `Duplicate` for it:
/// that delivery may still roll back, and the message would be lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fast_path_never_trusts_an_uncommitted_marker() {
    let Some(db) = create("read_uncommitted").await else {
        return;
    };
    let db = SqliteDb {
        shared_cache: true,
        ..db
    };
    bounded(async {
        common::create_tables(&db, 1).await;
        let conn_b = common::connect_with(&db, "PRAGMA read_uncommitted = 1").await;
        let second = common::wait_cut_short(&db, conn_b, 0, true).await;
        let error = second.expect_err("the marker's table is locked, not a duplicate");
        assert_eq!(classify(&error), ErrorClass::Transient, "{error}");
        let mut conn_b = common::connect_with(&db, "PRAGMA read_uncommitted = 1").await;
        assert_eq!(
            common::credit_reading_first(&mut conn_b, &Credit::numbered(0))
                .await
                .unwrap(),
            Outcome::Processed(())
        );
        assert_eq!(common::balances(&db, 1).await, vec![1]);
    })
    .await;
    db.cleanup().await;
}

/// SQLite ends the transaction itself on some errors, a full database among them: the
/// handler reports that error, which is retried, not diesel's "Cannot perform this
/// operation outside of a transaction" from the rollback after it, which replaced it
/// and was dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_that_sqlite_ended_reports_why() {
    let Some(db) = create("sqlite_ended_the_transaction").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 1).await;
        let mut conn = db.connect().await;
        let pages = select_i64(&mut conn, "SELECT page_count FROM pragma_page_count()")
            .await
            .expect("page count");
        conn.batch_execute(&format!("PRAGMA max_page_count = {pages}"))
            .await
            .expect("a database that cannot grow");
        let key = "k".repeat(400);
        let mut full = None;
        for n in 0..200 {
            match common::credit(&mut conn, &Credit::of(&format!("{key}-{n}"), 0)).await {
                Ok(outcome) => assert_eq!(outcome, Outcome::Processed(())),
                Err(error) => {
                    full = Some(error);
                    break;
                }
            }
        }
        let error = full.expect("the database filled up");
        assert!(
            error.to_string().contains("database or disk is full"),
            "{error}"
        );
        assert!(classify(&error).is_retryable(), "{error}");
        // Once there is room again, the message is processed.
        conn.batch_execute("PRAGMA max_page_count = 1000000")
            .await
            .expect("room");
        let retried = common::credit(&mut conn, &Credit::of(&format!("{key}-again"), 0)).await;
        assert_eq!(retried.expect("room again"), Outcome::Processed(()));
    })
    .await;
    db.cleanup().await;
}

/// `migrate` refuses a connection inside a transaction, as on MySQL: on a database
/// without the inbox it began a transaction of its own, which SQLite cannot nest, and
/// its ROLLBACK ended the caller's.
#[tokio::test]
async fn migrate_refuses_a_connection_in_a_transaction() {
    let Some(db) = create("migrate_in_a_transaction").await else {
        return;
    };
    bounded(async {
        let mut conn = db.connect().await;
        conn.batch_execute("DROP TABLE inbox")
            .await
            .expect("a database without the inbox");
        let inside = conn
            .transaction(async |conn| diesel_inbox::migrate(conn).await)
            .await;
        assert_eq!(inside, Err(Error::AlreadyInTransaction));
        diesel_inbox::migrate(&mut conn)
            .await
            .expect("migrate outside a transaction");
    })
    .await;
    db.cleanup().await;
}
