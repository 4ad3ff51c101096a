//! PostgreSQL.
//!
//! A duplicate is detected with `INSERT … ON CONFLICT DO NOTHING`: it waits for a
//! concurrent transaction holding the same key, then inserts nothing. No unique violation
//! is raised, so the transaction is never aborted (PostgreSQL would answer its `COMMIT`
//! with a silent `ROLLBACK`) and the server log gets no `ERROR` line per duplicate.

use diesel::result::DatabaseErrorInformation;

use crate::schema::INDEX_NAME;

/// A unique violation names the violated index in its constraint field.
pub(crate) fn names_inbox_index(info: &dyn DatabaseErrorInformation) -> bool {
    info.constraint_name() == Some(INDEX_NAME)
}

/// diesel-async reports these SQLSTATEs as `Unknown`, with only the message text to go by
/// (in the server's `lc_messages` language; these are the English texts): 40P01
/// deadlock, 55P03 lock not available, and 25P02, a transaction aborted by an earlier
/// error that the handler did not propagate.
pub(crate) fn is_transient(message: &str) -> bool {
    [
        "deadlock detected",
        "could not obtain lock",
        "canceling statement due to lock timeout",
        "current transaction is aborted",
        "terminating connection",
    ]
    .iter()
    .any(|prefix| message.starts_with(prefix))
}

#[cfg(feature = "postgres")]
mod imp {
    use std::future::Future;

    use diesel::QueryResult;
    use diesel_async::AsyncConnection;

    use super::super::queries::shared;
    use super::super::sealed::{self, Marker};

    diesel::define_sql_function! {
        /// The current time, which unlike `now()` advances within a transaction.
        fn clock_timestamp() -> diesel::sql_types::Timestamp;
    }

    /// Serialises concurrent `migrate` calls: concurrent `CREATE TABLE IF NOT EXISTS`
    /// can fail on PostgreSQL's catalog unique indexes. The value spells "inboxmig".
    const MIGRATE_LOCK: i64 = 0x696e_626f_786d_6967;

    impl sealed::Backend for diesel::pg::Pg {
        shared_statements!(already_processed, insert_marker);

        fn mark_processed<'c, C>(
            conn: &'c mut C,
            marker: &Marker,
        ) -> impl Future<Output = QueryResult<usize>> + Send + use<'c, C>
        where
            C: AsyncConnection<Backend = Self>,
        {
            // `now()` is the transaction's start on PostgreSQL, which would make
            // `processed_at` a copy of `received_at`.
            shared::mark_processed(conn, marker, clock_timestamp())
        }

        async fn migrate<C>(conn: &mut C) -> QueryResult<()>
        where
            C: AsyncConnection<Backend = Self>,
        {
            let lock = format!("SELECT pg_advisory_xact_lock({MIGRATE_LOCK})");
            conn.transaction(async |conn| {
                conn.batch_execute(&lock).await?;
                conn.batch_execute(include_str!(
                    "../../migrations/postgres/2026-11-30-000000_create_inbox/up.sql"
                ))
                .await
            })
            .await
        }
    }
}
