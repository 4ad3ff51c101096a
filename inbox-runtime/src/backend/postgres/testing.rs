//! PostgreSQL's test database: a schema per test.

use std::future::Future;

use diesel::QueryResult;
use diesel::sql_types::BigInt;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::backend::testing::{TestConnection, TestDatabaseError, sealed};

/// The server to administer the schema through, and the URL of the test's connections.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct Schema {
    server_url: String,
    url: String,
    schema: String,
}

impl Schema {
    /// The schema `schema` on the server at `url`.
    pub(crate) fn on_server(url: &str, schema: String) -> Result<Self, TestDatabaseError> {
        Ok(Self {
            server_url: url.to_owned(),
            url: with_schema(url, &schema)?,
            schema,
        })
    }
}

/// `url` with connection options that put its sessions in `schema`, and name them after
/// it: set by the server at connection start-up, they hold for pooled connections too.
fn with_schema(url: &str, schema: &str) -> Result<String, TestDatabaseError> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(TestDatabaseError::InvalidUrl(url.to_owned()));
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    Ok(format!(
        "{url}{separator}options=-csearch_path%3D{schema}&application_name={schema}"
    ))
}

impl sealed::Sealed for AsyncPgConnection {}

impl TestConnection for AsyncPgConnection {
    type Place = Schema;

    async fn create(place: &Schema) -> Result<(), TestDatabaseError> {
        let mut admin = Self::establish(&place.server_url).await?;
        admin
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {0} CASCADE; CREATE SCHEMA {0}",
                place.schema
            ))
            .await?;
        Ok(())
    }

    async fn connect(place: &Schema) -> Result<Self, TestDatabaseError> {
        Ok(Self::establish(&place.url).await?)
    }

    fn url(place: &Schema) -> &str {
        &place.url
    }

    async fn remove(place: Schema) -> Result<(), TestDatabaseError> {
        let mut admin = Self::establish(&place.server_url).await?;
        admin
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", place.schema))
            .await?;
        Ok(())
    }

    fn select_i64(
        conn: &mut Self,
        sql: String,
    ) -> impl Future<Output = QueryResult<i64>> + Send + use<'_> {
        diesel::select(diesel::dsl::sql::<BigInt>(&sql)).get_result(conn)
    }
}

#[cfg(test)]
mod tests {
    use super::with_schema;

    #[test]
    fn schema_options_join_the_url() {
        assert_eq!(
            with_schema("postgres://u@h/db", "inbox_test_a").unwrap(),
            "postgres://u@h/db?options=-csearch_path%3Dinbox_test_a&application_name=inbox_test_a"
        );
        assert!(
            with_schema("postgresql://u@h/db?sslmode=disable", "s")
                .unwrap()
                .starts_with("postgresql://u@h/db?sslmode=disable&options=")
        );
        assert!(with_schema("host=h user=u", "s").is_err());
    }
}
