//! MySQL and MariaDB.
//!
//! The marker is a plain `INSERT`: a duplicate raises 1062, which rolls back only that
//! statement. diesel's `on_conflict_do_nothing` cannot be used: on MySQL it becomes
//! `ON DUPLICATE KEY UPDATE id = id`, which reports one affected row for a new row and for
//! a duplicate alike under diesel-async's `CLIENT_FOUND_ROWS`. `INSERT IGNORE` would also
//! hide truncation and conversion errors.

use diesel::result::DatabaseErrorInformation;

use crate::schema::INDEX_NAME;

/// MariaDB ends the message with `for key 'ux_inbox_message_consumer'`, MySQL 8.0.19+
/// with `for key 'inbox.ux_inbox_message_consumer'`. Only the end of the message is
/// ours: the duplicate value quoted before it is the caller's data.
pub(crate) fn names_inbox_index(info: &dyn DatabaseErrorInformation) -> bool {
    let message = info.message();
    message
        .strip_suffix('\'')
        .and_then(|rest| rest.strip_suffix(INDEX_NAME))
        .is_some_and(|rest| rest.ends_with("for key '") || rest.ends_with("for key 'inbox."))
}

/// 1213 deadlock and 1205 lock wait timeout, which diesel-async reports as `Unknown`,
/// and the driver's texts for a lost connection.
pub(crate) fn is_transient(message: &str) -> bool {
    [
        "Deadlock found when trying to get lock",
        "Lock wait timeout exceeded",
        "Input/output error",
        "Lost connection to",
        "server has gone away",
        "Connection was killed",
        "Connection to the server is closed",
    ]
    .iter()
    .any(|pattern| message.contains(pattern))
}

#[cfg(feature = "mysql")]
mod imp {
    use std::future::Future;

    use diesel::QueryResult;
    use diesel::result::{DatabaseErrorKind, Error};
    use diesel_async::{AsyncConnection, RunQueryDsl};

    use super::super::queries::plain_insert;
    use super::super::sealed::{self, Marker};
    use super::names_inbox_index;
    use crate::schema::INDEX_NAME;

    impl sealed::Backend for diesel::mysql::Mysql {
        shared_statements!(already_processed, commit);

        fn insert_marker<'c, C>(
            conn: &'c mut C,
            marker: &Marker,
        ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, C>
        where
            C: AsyncConnection<Backend = Self>,
        {
            let insert = plain_insert(marker.message_id.clone(), marker.consumer);
            async move {
                match insert.execute(conn).await {
                    Ok(_) => Ok(true),
                    Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, info))
                        if names_inbox_index(info.as_ref()) =>
                    {
                        Ok(false)
                    }
                    Err(other) => Err(other),
                }
            }
        }

        async fn migrate<C>(conn: &mut C) -> QueryResult<()>
        where
            C: AsyncConnection<Backend = Self>,
        {
            // CREATE TABLE IF NOT EXISTS is atomic DDL, safe to race.
            conn.batch_execute(include_str!(
                "../../migrations/mysql/2026-11-30-000000_create_inbox/up.sql"
            ))
            .await?;
            // A table created by hand may lack the index, and MySQL has no
            // CREATE INDEX IF NOT EXISTS. A concurrent creator's 1061 "Duplicate key
            // name" is success for us, so it is checked again rather than reported.
            if inbox_index_exists(conn).await? {
                return Ok(());
            }
            let create =
                format!("CREATE UNIQUE INDEX {INDEX_NAME} ON inbox (message_id, consumer)");
            match conn.batch_execute(&create).await {
                Err(_) if inbox_index_exists(conn).await? => Ok(()),
                result => result,
            }
        }
    }

    async fn inbox_index_exists<C>(conn: &mut C) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = diesel::mysql::Mysql>,
    {
        let query = format!(
            "EXISTS (SELECT 1 FROM information_schema.statistics \
             WHERE table_schema = DATABASE() AND table_name = 'inbox' \
             AND index_name = '{INDEX_NAME}' AND non_unique = 0)"
        );
        diesel::select(diesel::dsl::sql::<diesel::sql_types::Bool>(&query))
            .get_result(conn)
            .await
    }
}
