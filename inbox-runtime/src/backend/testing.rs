//! What every backend provides for a test database of its own: the trait its connection
//! type implements, the errors, and the naming rule. Each backend's module implements it
//! for its connection; `crate::testing` builds `TestDatabase` on top.

use std::fmt;
use std::future::Future;

use diesel::QueryResult;
use diesel_async::AsyncConnection;

use super::InboxBackend;

/// What every place name starts with. [`TestDatabase`] only ever drops what carries it,
/// so a test named after a real schema (`public`) cannot drop that schema.
pub(crate) const PREFIX: &str = "inbox_test_";

/// The longest name a test may give: PostgreSQL truncates identifiers at 63 bytes and
/// MySQL refuses database names over 64, and a truncated name could be another test's.
pub(crate) const MAX_NAME: usize = 63 - PREFIX.len();

/// `inbox_test_<name>`, once `name` is shown to be a valid, untruncated identifier.
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code)
)]
pub(crate) fn place_name(name: &str) -> Result<String, TestDatabaseError> {
    let valid = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    if name.is_empty() || name.len() > MAX_NAME || !name.chars().all(valid) {
        return Err(TestDatabaseError::InvalidName(name.to_owned()));
    }
    Ok(format!("{PREFIX}{name}"))
}

/// A connection type [`TestDatabase`](crate::testing::TestDatabase) hands out: `AsyncPgConnection`,
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

pub(crate) mod sealed {
    pub trait Sealed {}
}

/// Why a [`TestDatabase`](crate::testing::TestDatabase) could not be created, reached or removed.
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
