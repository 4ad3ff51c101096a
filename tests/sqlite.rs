//! The SQLite suite: a database file per test, WAL, several connections.

#![cfg(feature = "sqlite")]

mod common;

use std::path::PathBuf;

use diesel::result::Error;
use diesel::sqlite::SqliteConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
use diesel_inbox::{ErrorClass, Outcome, classify, idempotent};

use common::{Credit, TestDb, bounded};

#[derive(Clone)]
struct SqliteDb {
    path: PathBuf,
    /// Whether connections share one page cache, where `PRAGMA read_uncommitted` lets a
    /// connection read what the others have not committed.
    shared_cache: bool,
}

impl SqliteDb {
    async fn create(test: &str) -> Option<Self> {
        let path =
            std::env::temp_dir().join(format!("diesel-inbox-{test}-{}.db", std::process::id()));
        let db = Self {
            path,
            shared_cache: false,
        };
        db.remove_files();
        Some(db)
    }

    fn remove_files(&self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut file = self.path.clone().into_os_string();
            file.push(suffix);
            let _ = std::fs::remove_file(file);
        }
    }
}

impl common::TestDb for SqliteDb {
    type Conn = SyncConnectionWrapper<SqliteConnection>;

    async fn connect(&self) -> Self::Conn {
        let path = self.path.to_str().expect("temp path is UTF-8");
        let url = if self.shared_cache {
            format!("file:{path}?cache=shared")
        } else {
            path.to_owned()
        };
        let mut conn = Self::Conn::establish(&url).await.expect("open SQLite file");
        conn.batch_execute("PRAGMA busy_timeout = 10000; PRAGMA journal_mode = WAL;")
            .await
            .expect("configure SQLite");
        conn
    }

    async fn count(conn: &mut Self::Conn, sql: &str) -> Result<i64, diesel::result::Error> {
        diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(&format!(
            "({sql})"
        )))
        .get_result(conn)
        .await
    }

    async fn lock_waiters(&self) -> Option<i64> {
        None
    }

    async fn cleanup(self) {
        self.remove_files();
    }
}

common_scenarios!(SqliteDb::create);

type Conn = SyncConnectionWrapper<SqliteConnection>;

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
    let Some(db) = SqliteDb::create("swallowed_rollback").await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 1).await;
        let mut conn = db.connect().await;
        conn.batch_execute("INSERT INTO ledger (entry) VALUES ('taken')")
            .await
            .unwrap();
        let error = rollback_swallowing_credit(&mut conn, &Credit::new(0))
            .await
            .expect_err("not committed");
        assert_eq!(classify(&error), ErrorClass::Transient, "{error}");
        assert!(error.to_string().contains("rolled back"), "{error}");
        assert_eq!(
            SqliteDb::count(&mut conn, "SELECT COUNT(*) FROM inbox")
                .await
                .unwrap(),
            0
        );
        assert_eq!(common::balances(&db, 1).await, vec![0]);
        // The transaction is over and the connection serves the next delivery.
        assert_eq!(
            common::credit(&mut conn, &Credit::new(0)).await.unwrap(),
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
    let Some(db) = SqliteDb::create("read_uncommitted").await else {
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
            common::credit_reading_first(&mut conn_b, &Credit::new(0))
                .await
                .unwrap(),
            Outcome::Processed(())
        );
        assert_eq!(common::balances(&db, 1).await, vec![1]);
    })
    .await;
    db.cleanup().await;
}
