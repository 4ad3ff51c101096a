//! A database of each test's own, with the inbox migrated. Documented where users meet
//! it, as `diesel_inbox::testing`.

use std::fmt;
use std::future::Future;

use diesel::QueryResult;
use diesel_async::AsyncConnection;

use crate::backend::InboxBackend;

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod pg;
#[cfg(feature = "sqlite")]
mod sqlite;

/// What every place name starts with. [`TestDatabase`] only ever drops what carries it,
/// so a test named after a real schema (`public`) cannot drop that schema.
const PREFIX: &str = "inbox_test_";

/// The longest name a test may give: PostgreSQL truncates identifiers at 63 bytes and
/// MySQL refuses database names over 64, and a truncated name could be another test's.
const MAX_NAME: usize = 63 - PREFIX.len();

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

/// `inbox_test_<name>`, once `name` is shown to be a valid, untruncated identifier.
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code)
)]
fn place_name(name: &str) -> Result<String, TestDatabaseError> {
    let valid = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    if name.is_empty() || name.len() > MAX_NAME || !name.chars().all(valid) {
        return Err(TestDatabaseError::InvalidName(name.to_owned()));
    }
    Ok(format!("{PREFIX}{name}"))
}

/// Runs `sql`, a query that returns one integer, such as `SELECT COUNT(*) FROM inbox`
/// or `SELECT balance FROM accounts WHERE id = 1`, and returns it.
pub fn select_i64<'c, C: TestConnection>(
    conn: &'c mut C,
    sql: &str,
) -> impl Future<Output = QueryResult<i64>> + Send + use<'c, C> {
    C::select_i64(conn, format!("({sql})"))
}

/// A connection type [`TestDatabase`] hands out: `AsyncPgConnection`,
/// `AsyncMysqlConnection` and `SyncConnectionWrapper<SqliteConnection>`, each with its
/// backend's feature.
pub trait TestConnection:
    AsyncConnection<Backend: InboxBackend> + Send + 'static + sealed::Sealed
{
    /// Where this backend's test lives, and how to reach it.
    #[doc(hidden)]
    type Place: fmt::Debug + Clone + Send + Sync + 'static;

    #[doc(hidden)]
    fn create(place: &Self::Place) -> impl Future<Output = Result<(), TestDatabaseError>> + Send;

    #[doc(hidden)]
    fn connect(place: &Self::Place)
    -> impl Future<Output = Result<Self, TestDatabaseError>> + Send;

    #[doc(hidden)]
    fn url(place: &Self::Place) -> &str;

    #[doc(hidden)]
    fn remove(place: Self::Place) -> impl Future<Output = Result<(), TestDatabaseError>> + Send;

    #[doc(hidden)]
    fn select_i64(
        conn: &mut Self,
        sql: String,
    ) -> impl Future<Output = QueryResult<i64>> + Send + use<'_, Self>;
}

mod sealed {
    pub trait Sealed {}
}

/// Why a [`TestDatabase`] could not be created, reached or removed.
#[derive(Debug)]
#[non_exhaustive]
pub enum TestDatabaseError {
    /// A test name must be 1 to 52 lowercase ASCII letters, digits and underscores.
    InvalidName(String),
    /// The server URL is not one this backend's connections take.
    InvalidUrl(String),
    /// Connecting failed.
    Connection(diesel::ConnectionError),
    /// A statement failed.
    Query(diesel::result::Error),
    /// Creating or removing the SQLite file failed.
    Io(std::io::Error),
}

impl fmt::Display for TestDatabaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidName(name) => write!(
                f,
                "`{name}` cannot name a test database: use 1 to {MAX_NAME} lowercase ASCII \
                 letters, digits and underscores, such as the test function's name"
            ),
            Self::InvalidUrl(url) => write!(f, "not a server URL for this backend: {url}"),
            Self::Connection(error) => write!(f, "connecting to the test database: {error}"),
            Self::Query(error) => write!(f, "setting up the test database: {error}"),
            Self::Io(error) => write!(f, "creating or removing the SQLite file: {error}"),
        }
    }
}

impl std::error::Error for TestDatabaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::InvalidName(_) | Self::InvalidUrl(_) => None,
            Self::Connection(error) => Some(error),
            Self::Query(error) => Some(error),
            Self::Io(error) => Some(error),
        }
    }
}

impl From<diesel::ConnectionError> for TestDatabaseError {
    fn from(error: diesel::ConnectionError) -> Self {
        Self::Connection(error)
    }
}

impl From<diesel::result::Error> for TestDatabaseError {
    fn from(error: diesel::result::Error) -> Self {
        Self::Query(error)
    }
}

impl From<std::io::Error> for TestDatabaseError {
    fn from(error: std::io::Error) -> Self {
        Self::Io(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_prefixed_and_never_truncated() {
        assert_eq!(place_name("race_1").unwrap(), "inbox_test_race_1");
        assert_eq!(place_name(&"x".repeat(MAX_NAME)).unwrap().len(), 63);
        for invalid in ["", "Race", "a-b", "a;drop", &"x".repeat(MAX_NAME + 1)] {
            assert!(
                matches!(place_name(invalid), Err(TestDatabaseError::InvalidName(_))),
                "{invalid:?}"
            );
        }
    }
}
