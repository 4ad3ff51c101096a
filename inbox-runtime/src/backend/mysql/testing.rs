//! MySQL's and MariaDB's test database: a database per test.

use std::future::Future;

use diesel::QueryDsl as _;
use diesel::QueryResult;
use diesel::sql_types::BigInt;
use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::backend::testing::{TestConnection, TestDatabaseError, sealed};

/// The server to administer the database through, and the URL of the test's
/// connections.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct Database {
    server_url: String,
    url: String,
    database: String,
}

impl Database {
    /// The database `database` on the server at `url`.
    pub(crate) fn on_server(url: &str, database: String) -> Result<Self, TestDatabaseError> {
        Ok(Self {
            server_url: url.to_owned(),
            url: with_database(url, &database)?,
            database,
        })
    }
}

/// `mysql://user@host:3306/db?options` with its database replaced by `database`.
fn with_database(url: &str, database: &str) -> Result<String, TestDatabaseError> {
    let Some(authority) = url.strip_prefix("mysql://") else {
        return Err(TestDatabaseError::InvalidUrl(url.to_owned()));
    };
    let (base, options) = match authority.split_once('?') {
        Some((base, options)) => (base, Some(options)),
        None => (authority, None),
    };
    let host = base.split_once('/').map_or(base, |(host, _database)| host);
    let mut replaced = format!("mysql://{host}/{database}");
    if let Some(options) = options {
        replaced.push('?');
        replaced.push_str(options);
    }
    Ok(replaced)
}

impl sealed::Sealed for AsyncMysqlConnection {}

impl TestConnection for AsyncMysqlConnection {
    type Place = Database;

    async fn create(place: &Database) -> Result<(), TestDatabaseError> {
        let mut admin = Self::establish(&place.server_url).await?;
        admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {0}; CREATE DATABASE {0}",
                place.database
            ))
            .await?;
        Ok(())
    }

    async fn connect(place: &Database) -> Result<Self, TestDatabaseError> {
        Ok(Self::establish(&place.url).await?)
    }

    fn url(place: &Database) -> &str {
        &place.url
    }

    async fn remove(place: Database) -> Result<(), TestDatabaseError> {
        let mut admin = Self::establish(&place.server_url).await?;
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {}", place.database))
            .await?;
        Ok(())
    }

    fn select_i64(
        conn: &mut Self,
        sql: String,
    ) -> impl Future<Output = QueryResult<i64>> + Send + use<'_> {
        diesel::select(diesel::dsl::sql::<BigInt>(&sql))
            .limit(1)
            .get_result(conn)
    }
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn database_is_replaced() {
        assert_eq!(
            with_database("mysql://root@127.0.0.1:3306/test", "b").unwrap(),
            "mysql://root@127.0.0.1:3306/b"
        );
        assert_eq!(
            with_database("mysql://root@h:3306?ssl-mode=disabled", "b").unwrap(),
            "mysql://root@h:3306/b?ssl-mode=disabled"
        );
        assert!(with_database("postgres://h/db", "b").is_err());
    }
}
