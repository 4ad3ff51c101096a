//! The transactional outbox: a body's outgoing messages are rows written in its
//! transaction, published by a relay once they have committed.
//!
//! Publishing from inside a body is wrong both ways: a rollback, a retry or a crash
//! leaves an event for a credit that never happened, or two; publishing after the
//! commit loses the event to a crash in between. [`enqueue`] writes the message in the
//! caller's transaction instead (the `#[idempotent]` body's, or any of the caller's
//! own), so that it commits or rolls back with the writes it announces. A relay then
//! [`take`]s due messages, publishes each with the broker's confirmation, and marks it
//! [sent](Taken::sent). A relay that dies between the publish and the mark publishes
//! the message again: receivers deduplicate it by its [id](OutboxMessage::id), through
//! their own inbox.
//!
//! `Relay` (feature `relay`) is that relay, as a background task: it publishes through
//! a [`Publisher`], which the broker crates implement (`diesel_inbox_lapin::OutboxPublisher`
//! for RabbitMQ), and which you can implement for another broker. The functions below
//! are its parts, for a relay of your own.
//!
//! - **Several relays** may take at once: each message is leased to one relay, which
//!   holds it until the lease ends (PostgreSQL and MySQL/MariaDB skip the rows another
//!   relay is taking instead of waiting for them; SQLite has one writer at a time).
//! - **Order:** messages with the same [ordering key](OutboxMessage::ordering_key) are
//!   numbered in the order their transactions commit, and a relay takes only the first
//!   unsent one of each key, so they are published in that order. A transaction that
//!   enqueues under a key waits for the other open transactions that did. Messages
//!   without a key, or with different keys, go out in any order. A relay whose lease
//!   ends while it is still publishing can have the message published again after a
//!   later one of its key: a duplicate, which the receiver drops.
//! - **Failures:** a publish that may succeed later is [retried later](Taken::retry_later);
//!   one that never will (an unroutable destination, a payload too large) is
//!   [parked](Taken::park) with its reason, never dropped. A parked message holds back
//!   the later messages of its ordering key until an operator [requeues](requeue) or
//!   [discards](discard) it; [`parked`] lists them.
//! - **Claim mode:** a claim's body runs outside a transaction, so each `enqueue` there
//!   commits at once. With the default ids a body run again after a takeover enqueues
//!   the same ids again, and receivers drop the copies.
//!
//! Create the tables with [`migrate`], or copy the `outbox` migration for your backend.

mod message;
mod pruning;
mod publisher;
#[cfg(feature = "relay")]
mod relay;
mod relaying;

use diesel::QueryResult;
use diesel_async::AsyncConnection;

use crate::backend::InboxBackend;
use crate::backend::outbox_statements::{NewOutgoing, OutboxStatements as _};
pub use crate::error::InvalidOutboxMessage;
pub use message::{ID_MAX_BYTES, NAME_MAX_BYTES, OutboxMessage};
use message::{encode_headers, next_default_id};
pub use pruning::prune_sent;
pub use publisher::{PublishError, Publisher};
#[cfg(feature = "relay")]
pub use relay::{Relay, RelaySettings, RelayWaker};
pub use relaying::{Outgoing, Taken, discard, parked, requeue, sent_all, take};

/// Creates the outbox's tables where they are missing: `inbox_outbox`, and
/// `inbox_outbox_keys` for the ordering keys. Idempotent, and safe to call from several
/// instances at once.
pub async fn migrate<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    C::Backend::migrate_outbox(conn).await
}

/// Writes `message` to the outbox in the connection's current transaction, and returns
/// its id. Call it inside an `#[idempotent]` body, or in a transaction of your own: the
/// message is published if and only if that transaction commits.
///
/// A message that cannot be stored is refused before anything is written, with an
/// [`InvalidOutboxMessage`] inside the error ([`InboxError::find`](crate::InboxError::find)
/// finds it); a handler that returns it fails, permanently.
///
/// ```no_run
/// # #[cfg(feature = "postgres")] mod example {
/// # use inbox_runtime as diesel_inbox;
/// use diesel_inbox::outbox::{self, OutboxMessage};
///
/// async fn credit(conn: &mut diesel_async::AsyncPgConnection) -> diesel::QueryResult<()> {
///     // … the credit's writes, then, in the same transaction:
///     outbox::enqueue(conn, OutboxMessage::new("accounts", b"credited".to_vec())).await?;
///     Ok(())
/// }
/// # }
/// ```
pub async fn enqueue<C>(conn: &mut C, message: OutboxMessage) -> QueryResult<String>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    message.check()?;
    let message_id = message.id.unwrap_or_else(next_default_id);
    let ordering = match message.ordering_key {
        Some(key) => {
            let seq = C::Backend::next_in_order(conn, key.clone()).await?;
            Some((key, seq))
        }
        None => None,
    };
    let outgoing = NewOutgoing {
        message_id: message_id.clone(),
        destination: message.destination,
        routing_key: message.routing_key,
        ordering,
        headers: encode_headers(&message.headers),
        payload: message.payload,
    };
    C::Backend::insert_outgoing(conn, outgoing).await?;
    Ok(message_id)
}
