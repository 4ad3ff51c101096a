//! Deleting sent messages, once they are old enough to be of no more use, and the
//! ordering keys they leave unused.

use std::time::Duration;

use diesel::QueryResult;
use diesel_async::AsyncConnection;

use super::relaying::micros;
use crate::backend::InboxBackend;
use crate::backend::outbox_statements::OutboxStatements as _;
use crate::backend::outside_a_transaction;
use crate::prune::LONGEST_WINDOW;

/// Messages per statement: enough to make each round trip worth it, few enough that
/// each batch's locks and transaction stay short beside the handlers.
pub(crate) const BATCH: usize = 1_000;

/// Deletes the messages sent more than `older_than` ago, as the database's clock tells
/// time, and the rows of ordering keys that no unsent message uses any more; returns how
/// many messages it deleted. Unsent and parked messages are never deleted.
///
/// Works in batches of 1,000 messages, oldest first, each its own short transaction;
/// several instances may prune at once, skipping each other's rows. A [`Relay`] prunes
/// on its own ([`RelaySettings::with_sent_retention`]). Like a handler, it refuses a
/// connection inside a transaction, where its batches would not be short.
///
/// Keep sent messages for as long as you want them for inspection: receivers
/// deduplicate by their own inbox, not by the outbox.
///
/// [`Relay`]: super::Relay
/// [`RelaySettings::with_sent_retention`]: super::RelaySettings::with_sent_retention
///
/// # Errors
///
/// A database error, or
/// [`Error::AlreadyInTransaction`](diesel::result::Error::AlreadyInTransaction).
/// Batches deleted before an error stay deleted.
pub async fn prune_sent<C>(conn: &mut C, older_than: Duration) -> QueryResult<u64>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let mut deleted = 0;
    loop {
        let batch = prune_sent_batch(conn, older_than).await?;
        deleted += batch as u64;
        if batch < BATCH {
            return Ok(deleted);
        }
    }
}

/// Deletes one batch of old sent messages, and their keys where unused; how many
/// messages it deleted (fewer than [`BATCH`] when no more are old enough).
pub(crate) async fn prune_sent_batch<C>(conn: &mut C, older_than: Duration) -> QueryResult<usize>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    outside_a_transaction(conn)?;
    if older_than > LONGEST_WINDOW {
        return Ok(0);
    }
    let deleted = C::Backend::delete_sent(conn, micros(older_than), BATCH as i64).await?;
    let count = deleted.len();
    let mut keys: Vec<Vec<u8>> = deleted
        .into_iter()
        .filter_map(|row| row.ordering_key)
        .collect();
    keys.sort_unstable();
    keys.dedup();
    if !keys.is_empty() {
        C::Backend::delete_idle_keys(conn, keys).await?;
    }
    tracing::debug!(
        target: "diesel_inbox",
        { outbox.pruned = count },
        "pruned a batch of sent outbox messages"
    );
    Ok(count)
}
