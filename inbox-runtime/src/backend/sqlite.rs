//! SQLite.
//!
//! `INSERT … ON CONFLICT DO NOTHING` is the first statement of the transaction, so a
//! second writer waits in the busy handler instead of failing at once with
//! `SQLITE_BUSY` (SQLite skips the busy handler for a transaction that has already read).
//! Connections need `PRAGMA busy_timeout`; `journal_mode = WAL` lets the fast-path read
//! run while another connection writes.

use diesel::result::DatabaseErrorInformation;

/// SQLite names the columns of the violated index, in index order.
pub(crate) fn names_inbox_index(info: &dyn DatabaseErrorInformation) -> bool {
    info.message() == "UNIQUE constraint failed: inbox.message_id, inbox.consumer"
}

/// `SQLITE_BUSY` and `SQLITE_LOCKED`, which diesel reports as `Unknown`.
pub(crate) fn is_transient(message: &str) -> bool {
    message == "database is locked" || message.starts_with("database table is locked")
}

#[cfg(feature = "sqlite")]
mod imp {
    use diesel::QueryResult;
    use diesel_async::AsyncConnection;

    use super::super::sealed;

    impl sealed::Backend for diesel::sqlite::Sqlite {
        shared_statements!(already_processed, commit, insert_marker);

        async fn migrate<C>(conn: &mut C) -> QueryResult<()>
        where
            C: AsyncConnection<Backend = Self>,
        {
            // Both statements are `IF NOT EXISTS`, and SQLite serialises writers.
            conn.batch_execute(include_str!(
                "../../migrations/sqlite/2026-11-30-000000_create_inbox/up.sql"
            ))
            .await
        }
    }
}
