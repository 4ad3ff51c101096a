//! The operator's view of claims that nobody holds.

use std::time::Duration;

use diesel::QueryResult;
use diesel_async::AsyncConnection;

use crate::backend::InboxBackend;
use crate::backend::claim_statements::{ClaimKey, ClaimStatements as _, StaleRow};

/// A claim that nobody holds and that was never completed: its lease ended (the holder
/// crashed, or outlived it), or a failed body released it and no redelivery has come
/// since.
///
/// A claim whose lease ended may have made its external call: reconcile it with the
/// downstream system (which knows the [`Claim::idempotency_key`](crate::Claim)) before
/// settling it with [`complete_by_hand`] or [`release_by_hand`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StaleClaim {
    /// The stored key (the inbox's `message_id`).
    pub message_id: String,
    /// The consumer that claimed it.
    pub consumer: String,
    /// How many times its body was started.
    pub attempts: u32,
    /// Whether a failed body released it (it ended cleanly, without completing), rather
    /// than its lease running out.
    pub released: bool,
    /// Since the message was first claimed.
    pub age: Duration,
    /// Since its lease ended, or since it was released.
    pub idle: Duration,
}

impl From<StaleRow> for StaleClaim {
    fn from(row: StaleRow) -> Self {
        let duration = |micros: i64| Duration::from_micros(u64::try_from(micros).unwrap_or(0));
        Self {
            message_id: row.message_id,
            consumer: row.consumer,
            attempts: u32::try_from(row.attempts).unwrap_or(0),
            released: row.released,
            age: duration(row.age_micros),
            idle: duration(row.idle_micros),
        }
    }
}

/// Every claim that nobody holds and that was never completed, oldest first: those
/// quarantined by `takeover = false`, those out of `max_attempts`, and those whose
/// message was never redelivered. [`prune`](crate::prune) never deletes them.
///
/// Scans the inbox: claim mode adds no index, so that transactional handlers' inserts
/// cost what they did. Run it from an operator's tool or an alert, not per message.
pub async fn list_stale<C>(conn: &mut C) -> QueryResult<Vec<StaleClaim>>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let rows = C::Backend::list_stale(conn).await?;
    Ok(rows.into_iter().map(StaleClaim::from).collect())
}

/// Completes a claim that nobody holds, once a person has found that its external call
/// did take effect: later deliveries of the message are duplicates. Returns whether
/// there was such a claim; a claim still held is left to its holder.
pub async fn complete_by_hand<C>(
    conn: &mut C,
    consumer: &str,
    message_id: &str,
) -> QueryResult<bool>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    C::Backend::complete_stale(conn, key(consumer, message_id)).await
}

/// Releases a claim that nobody holds, once a person has found that its external call
/// did not take effect, with its attempts reset: the next delivery of the message runs
/// the body as attempt 1, even under `takeover = false` or past `max_attempts`. Returns
/// whether there was such a claim; a claim still held is left to its holder.
pub async fn release_by_hand<C>(conn: &mut C, consumer: &str, message_id: &str) -> QueryResult<bool>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    C::Backend::release_stale(conn, key(consumer, message_id)).await
}

fn key(consumer: &str, message_id: &str) -> ClaimKey {
    ClaimKey {
        message_id: message_id.to_owned(),
        consumer: consumer.to_owned(),
    }
}
