//! The SQLite suite: a database file per test, WAL, several connections.

#![cfg(feature = "sqlite")]

mod common;

use std::path::PathBuf;

use diesel::sqlite::SqliteConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};

#[derive(Clone)]
struct SqliteDb {
    path: PathBuf,
}

impl SqliteDb {
    async fn create(test: &str) -> Option<Self> {
        let path =
            std::env::temp_dir().join(format!("diesel-inbox-{test}-{}.db", std::process::id()));
        let db = Self { path };
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
        let url = self.path.to_str().expect("temp path is UTF-8");
        let mut conn = Self::Conn::establish(url).await.expect("open SQLite file");
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

    async fn waiting_marker_inserts(&self) -> Option<i64> {
        None
    }

    async fn cleanup(self) {
        self.remove_files();
    }
}

common_scenarios!(SqliteDb::create);
