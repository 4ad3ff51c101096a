//! SQLite's test database: a file per test, in a temporary directory of its own.

use std::future::Future;
use std::sync::Arc;

use diesel::QueryResult;
use diesel::sql_types::BigInt;
use diesel::sqlite::SqliteConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
use tempfile::TempDir;

use crate::backend::testing::{TestConnection, TestDatabaseError, sealed};

/// The database file, and the directory that holds it with its WAL.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct File {
    path: String,
    /// Removed with everything in it when the last clone drops, so that a test that
    /// panics leaves no file behind either.
    dir: Arc<TempDir>,
}

impl File {
    /// A new file for the test `name`, in a new temporary directory.
    pub(crate) fn in_new_directory(name: &str) -> Result<Self, TestDatabaseError> {
        // A directory of its own: concurrent runs of the same test never meet.
        let dir = tempfile::Builder::new()
            .prefix(&format!("diesel-{name}-"))
            .tempdir()?;
        let path = dir.path().join("inbox.sqlite3");
        let path = path.to_str().ok_or_else(|| {
            TestDatabaseError::InvalidUrl(format!("{} is not UTF-8", path.display()))
        })?;
        Ok(Self {
            path: path.to_owned(),
            dir: Arc::new(dir),
        })
    }
}

/// A second writer waits for the lock up to this long instead of failing at once with
/// `SQLITE_BUSY`.
const BUSY_TIMEOUT_MS: u32 = 10_000;

impl sealed::Sealed for SyncConnectionWrapper<SqliteConnection> {}

impl TestConnection for SyncConnectionWrapper<SqliteConnection> {
    type Place = File;

    /// The directory is new, so there is nothing to drop.
    async fn create(_place: &File) -> Result<(), TestDatabaseError> {
        Ok(())
    }

    async fn connect(place: &File) -> Result<Self, TestDatabaseError> {
        let mut conn = Self::establish(&place.path).await?;
        // The busy timeout first, so that it covers the switch to WAL; WAL lets readers
        // run beside the writer.
        conn.batch_execute(&format!(
            "PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}; PRAGMA journal_mode = WAL;"
        ))
        .await?;
        Ok(conn)
    }

    fn url(place: &File) -> &str {
        &place.path
    }

    async fn remove(place: File) -> Result<(), TestDatabaseError> {
        // Other clones may still hold the directory; it goes now all the same.
        std::fs::remove_dir_all(place.dir.path())?;
        Ok(())
    }

    fn select_i64(
        conn: &mut Self,
        sql: String,
    ) -> impl Future<Output = QueryResult<i64>> + Send + use<'_> {
        diesel::select(diesel::dsl::sql::<BigInt>(&sql)).get_result(conn)
    }
}
