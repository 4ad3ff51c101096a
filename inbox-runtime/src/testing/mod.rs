//! A database of each test's own, with the inbox migrated. Documented where users meet
//! it, as `diesel_inbox::testing`.

use std::fmt;
use std::future::Future;

use diesel::QueryResult;

// Only the backends' constructors name a place.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use crate::backend::testing::place_name;
pub use crate::backend::testing::{TestConnection, TestDatabaseError};

/// A schema (PostgreSQL), database (MySQL/MariaDB) or file (SQLite) of one test's own,
/// with the inbox migrated. `C` is the connection type it hands out.
///
/// Clones refer to the same place.
pub struct TestDatabase<C: TestConnection> {
    place: C::Place,
    name: String,
}

// Derived impls would require `C: Clone` and `C: Debug`, which connections are not.
impl<C: TestConnection> Clone for TestDatabase<C> {
    fn clone(&self) -> Self {
        Self {
            place: self.place.clone(),
            name: self.name.clone(),
        }
    }
}

impl<C: TestConnection> fmt::Debug for TestDatabase<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestDatabase")
            .field("place", &self.place)
            .finish()
    }
}

/// A [`Pruner`](crate::Pruner) or a [`Relay`](crate::outbox::Relay) under test takes its
/// connections from the test's database: `Relay::spawn(db.clone(), …)`.
#[cfg(any(feature = "pruner", feature = "relay"))]
impl<C: TestConnection> crate::ConnectionSource for TestDatabase<C> {
    type Connection = C;
    type Error = TestDatabaseError;

    fn connect(&self) -> impl Future<Output = Result<C, TestDatabaseError>> + Send + '_ {
        TestDatabase::connect(self)
    }
}

impl<C: TestConnection> TestDatabase<C> {
    /// Opens a connection to the test's place, set up as the table in the module
    /// documentation says.
    pub fn connect(&self) -> impl Future<Output = Result<C, TestDatabaseError>> + Send {
        C::connect(&self.place)
    }

    /// `inbox_test_<name>`: the schema or database name, and on PostgreSQL the
    /// `application_name` of every connection, by which `pg_stat_activity` can be
    /// filtered to this test.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A URL whose connections land in the test's place, for building a pool.
    /// PostgreSQL's carries the `search_path` as a connection option; SQLite's is the
    /// file's path, and each pooled connection still needs `PRAGMA busy_timeout`.
    pub fn url(&self) -> &str {
        C::url(&self.place)
    }

    /// Drops the schema or database, or removes the SQLite file. Drop connections inside
    /// a transaction (`begin_test_transaction`) first: on a server, the DROP waits for
    /// their locks.
    pub async fn cleanup(self) -> Result<(), TestDatabaseError> {
        C::remove(self.place).await
    }

    /// Creates `place` afresh, dropping a leftover of an earlier run first, and migrates
    /// the inbox there.
    // Without a backend's feature, no connection type exists to create one for.
    #[cfg_attr(
        not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
        allow(dead_code)
    )]
    async fn create(place: C::Place, name: String) -> Result<Self, TestDatabaseError> {
        C::create(&place).await?;
        let db = Self { place, name };
        let mut conn = db.connect().await?;
        crate::migrate(&mut conn).await?;
        Ok(db)
    }
}

/// Runs `sql`, a query that returns one integer, such as `SELECT COUNT(*) FROM inbox`
/// or `SELECT balance FROM accounts WHERE id = 1`, and returns it.
pub fn select_i64<'c, C: TestConnection>(
    conn: &'c mut C,
    sql: &str,
) -> impl Future<Output = QueryResult<i64>> + Send + use<'c, C> {
    C::select_i64(conn, format!("({sql})"))
}

#[cfg(feature = "postgres")]
impl TestDatabase<diesel_async::AsyncPgConnection> {
    /// Creates the schema `inbox_test_<name>` on the server at `url` (a
    /// `postgres://` or `postgresql://` URL), dropping a leftover of an earlier run
    /// first, and migrates the inbox there.
    pub async fn postgres(url: &str, name: &str) -> Result<Self, TestDatabaseError> {
        let schema = place_name(name)?;
        let place = crate::backend::postgres::testing::Schema::on_server(url, schema.clone())?;
        Self::create(place, schema).await
    }
}

#[cfg(feature = "mysql")]
impl TestDatabase<diesel_async::AsyncMysqlConnection> {
    /// Creates the database `inbox_test_<name>` on the server at `url` (a `mysql://`
    /// URL, whose own database is only used to administer the test's), dropping a
    /// leftover of an earlier run first, and migrates the inbox there.
    pub async fn mysql(url: &str, name: &str) -> Result<Self, TestDatabaseError> {
        let database = place_name(name)?;
        let place = crate::backend::mysql::testing::Database::on_server(url, database.clone())?;
        Self::create(place, database).await
    }
}

#[cfg(feature = "sqlite")]
impl
    TestDatabase<
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>,
    >
{
    /// Creates a database file for the test `name` in a new temporary directory, and
    /// migrates the inbox there.
    pub async fn sqlite(name: &str) -> Result<Self, TestDatabaseError> {
        let name = place_name(name)?;
        let place = crate::backend::sqlite::testing::File::in_new_directory(&name)?;
        Self::create(place, name).await
    }
}
