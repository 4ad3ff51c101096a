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

/// How the message of 25P02 begins: a statement in a transaction that an earlier error
/// aborted.
const ABORTED_TRANSACTION: &str = "current transaction is aborted";

/// diesel-async reports these SQLSTATEs as `Unknown`, with only the message text to go by
/// (in the server's `lc_messages` language; these are the English texts): 40P01
/// deadlock, 55P03 lock not available, and 25P02, a transaction aborted by an earlier
/// error that the handler did not propagate.
pub(crate) fn is_transient(message: &str) -> bool {
    [
        "deadlock detected",
        "could not obtain lock",
        "canceling statement due to lock timeout",
        ABORTED_TRANSACTION,
        "terminating connection",
    ]
    .iter()
    .any(|prefix| message.starts_with(prefix))
}

#[cfg(feature = "postgres")]
mod imp {
    use std::future::Future;

    use diesel::QueryResult;
    use diesel::connection::{TransactionDepthChange, TransactionManagerStatus};
    use diesel::result::{DatabaseErrorKind, Error};
    use diesel_async::{AsyncConnection, TransactionManager};

    use super::super::sealed::{self, Marker};
    use super::super::{roll_back_for, rolled_back_underneath};
    use super::ABORTED_TRANSACTION;

    /// Serialises concurrent `migrate` calls: concurrent `CREATE TABLE IF NOT EXISTS`
    /// can fail on PostgreSQL's catalog unique indexes. The value spells "inboxmig".
    const MIGRATE_LOCK: i64 = 0x696e_626f_786d_6967;

    impl sealed::Backend for diesel::pg::Pg {
        shared_statements!(already_processed, insert_marker);

        fn commit<'c, C>(
            conn: &'c mut C,
            _marker: &Marker,
        ) -> impl Future<Output = QueryResult<()>> + Send + use<'c, C>
        where
            C: AsyncConnection<Backend = Self>,
        {
            async move {
                // After an error the handler did not propagate, the transaction is aborted
                // and PostgreSQL answers COMMIT with a silent ROLLBACK. `SELECT 1` fails
                // there instead (25P02), and the rest of a simple query is then skipped.
                // Sent with COMMIT it costs no round trip of its own, which a separate
                // statement would: 8% of throughput (inbox-bench/BENCHMARKS.md).
                match conn.batch_execute("SELECT 1; COMMIT").await {
                    Ok(()) => leave_transaction(conn),
                    Err(error) if is_aborted(&error) => {
                        Err(roll_back_for(conn, rolled_back_underneath()).await)
                    }
                    Err(error) => Err(roll_back_for(conn, error).await),
                }
            }
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

    /// Records in the transaction manager that the COMMIT it did not send has ended the
    /// transaction. Had the call been cancelled before this, the manager would still
    /// count a transaction, and pools discard such a connection.
    fn leave_transaction<C: AsyncConnection>(conn: &mut C) -> QueryResult<()> {
        match C::TransactionManager::transaction_manager_status_mut(conn) {
            TransactionManagerStatus::Valid(status) => {
                status.change_transaction_depth(TransactionDepthChange::DecreaseDepth)
            }
            TransactionManagerStatus::InError => Err(Error::BrokenTransactionManager),
        }
    }

    /// 25P02, which diesel-async reports as `Unknown` with only the message text.
    fn is_aborted(error: &Error) -> bool {
        matches!(
            error,
            Error::DatabaseError(DatabaseErrorKind::Unknown, info)
                if info.message().starts_with(ABORTED_TRANSACTION)
        )
    }
}
