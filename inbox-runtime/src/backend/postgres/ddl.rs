//! PostgreSQL: schema changes of the inbox and the outbox while handlers run. A statement
//! waiting for a table's lock holds up every later statement on the table behind it
//! (PostgreSQL grants locks in the order they are asked for), so it waits a second at a
//! time, and tries again.

use std::time::Duration;

use diesel::QueryResult;
use diesel::result::Error;
use diesel_async::{AsyncConnection, TransactionManager as _};

/// Longest wait for a table's lock, each attempt.
const LOCK_TIMEOUT: &str = "1s";

/// Attempts before the lock time-out is reported.
const LOCK_ATTEMPTS: u32 = 30;

/// `statements` as one simple query, and so one transaction, each of their locks waited
/// for [`LOCK_TIMEOUT`] at most: a time-out rolls the transaction back, and it is tried
/// again after a pause that lets the statements queued behind it through. Under the
/// advisory lock `serialised_by` where there is one, taken before the time-out applies:
/// it only waits for another migration, which no handler waits for.
///
/// In the caller's transaction, which a time-out would abort and a setting would
/// outlive, they are sent once, as they are.
pub(super) async fn with_short_lock_waits<C>(
    conn: &mut C,
    serialised_by: Option<i64>,
    statements: &str,
) -> QueryResult<()>
where
    C: AsyncConnection<Backend = diesel::pg::Pg>,
{
    let serialise = serialised_by
        .map(|lock| format!("SELECT pg_catalog.pg_advisory_xact_lock({lock}); "))
        .unwrap_or_default();
    if C::TransactionManager::transaction_manager_status_mut(conn)
        .transaction_depth()?
        .is_some()
    {
        return conn
            .batch_execute(&format!("{serialise}{statements}"))
            .await;
    }
    let bounded = format!("{serialise}SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'; {statements}");
    let mut attempt = 1;
    loop {
        match conn.batch_execute(&bounded).await {
            Err(error) if attempt < LOCK_ATTEMPTS && is_lock_timeout(&error) => {}
            result => return result,
        }
        attempt += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// 55P03 as diesel-async reports it: `Unknown`, with the message alone.
fn is_lock_timeout(error: &Error) -> bool {
    matches!(
        error,
        Error::DatabaseError(_, info)
            if super::is_lock_timeout(info.message())
    )
}
