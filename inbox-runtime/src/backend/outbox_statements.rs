//! The outbox's statements, which each backend writes in its own SQL (in
//! `crate::outbox`): due times and leases are set and compared on the database's clock,
//! whose arithmetic differs, and taking due messages without waiting for another relay's
//! differs most of all.
//!
//! The relay's statements (take, sent, retry later, park) and the operator's (requeue,
//! discard) each commit on their own; `next_in_order` and `insert_outgoing` run in the
//! caller's transaction, which they are part of.

use std::future::Future;

use diesel::QueryResult;
use diesel::sql_types::{BigInt, Binary, Integer, Nullable};
use diesel_async::AsyncConnection;

/// A message to write to the outbox, checked and encoded.
#[derive(Debug, Clone)]
pub struct NewOutgoing {
    pub message_id: String,
    pub destination: String,
    pub routing_key: String,
    /// The ordering key, and the message's number among its messages.
    pub ordering: Option<(String, i64)>,
    pub headers: Vec<u8>,
    pub payload: Vec<u8>,
}

/// An unsent message as the relay and the operator read it. Its texts are read as
/// UTF-8 bytes, which no PostgreSQL `client_encoding` converts on their way out.
#[derive(Debug, diesel::QueryableByName)]
pub struct OutgoingRow {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Binary)]
    pub message_id: Vec<u8>,
    #[diesel(sql_type = Binary)]
    pub destination: Vec<u8>,
    #[diesel(sql_type = Binary)]
    pub routing_key: Vec<u8>,
    #[diesel(sql_type = Nullable<Binary>)]
    pub ordering_key: Option<Vec<u8>>,
    #[diesel(sql_type = Binary)]
    pub headers: Vec<u8>,
    #[diesel(sql_type = Binary)]
    pub payload: Vec<u8>,
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    #[diesel(sql_type = Nullable<Binary>)]
    pub last_error: Option<Vec<u8>>,
}

/// The columns an [`OutgoingRow`] reads, in a statement's select list, on the backends
/// whose texts read as bytes as they are.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) const OUTGOING_COLUMNS: &str = "id, message_id, destination, routing_key, ordering_key, \
     headers, payload, attempts, last_error";

/// Row ids as the list of an `IN (…)`: ids the database gave, written as numbers, so
/// that nothing of a caller's reaches a statement's text.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) fn id_list(ids: impl IntoIterator<Item = i64>) -> String {
    ids.into_iter()
        .map(|id| id.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Due: unsent, not parked, and not held by a relay whose lease runs; and the first
/// unsent message of its ordering key, so that one key's messages go out in order;
/// `o` names the outbox in the statement. `$now` is the backend's current time.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
macro_rules! due {
    ($now:expr) => {
        concat!(
            "o.sent_at IS NULL AND NOT o.parked AND o.due_at <= ",
            $now,
            " AND (o.ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM inbox_outbox e \
             WHERE e.ordering_key = o.ordering_key AND e.sent_at IS NULL \
             AND e.ordering_seq < o.ordering_seq))"
        )
    };
}
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) use due;

/// What the outbox needs of a backend, out of reach of other crates.
pub trait OutboxStatements: diesel::backend::Backend + Sized {
    /// Creates the outbox's tables where they are missing.
    fn migrate_outbox<C>(conn: &mut C) -> impl Future<Output = QueryResult<()>> + Send
    where
        C: AsyncConnection<Backend = Self>;

    /// The next number of `ordering_key`'s messages. Waits for the other transactions
    /// that enqueued under the key to end, and holds the key until this one does: a
    /// key's messages are numbered in the order their transactions commit.
    fn next_in_order<C>(
        conn: &mut C,
        ordering_key: String,
    ) -> impl Future<Output = QueryResult<i64>> + Send
    where
        C: AsyncConnection<Backend = Self>;

    /// Writes the message, in the caller's transaction.
    fn insert_outgoing<C>(
        conn: &mut C,
        message: NewOutgoing,
    ) -> impl Future<Output = QueryResult<()>> + Send
    where
        C: AsyncConnection<Backend = Self>;

    /// Takes up to `limit` due messages for the relay `token`, for `lease_micros`,
    /// skipping those another relay is taking at the same moment.
    fn take_due<C>(
        conn: &mut C,
        token: String,
        lease_micros: i64,
        limit: i64,
    ) -> impl Future<Output = QueryResult<Vec<OutgoingRow>>> + Send
    where
        C: AsyncConnection<Backend = Self>;

    /// Marks messages `ids` sent, whoever holds them: they have been published.
    fn mark_sent<C>(conn: &mut C, ids: Vec<i64>) -> impl Future<Output = QueryResult<()>> + Send
    where
        C: AsyncConnection<Backend = Self>;

    /// Makes message `id` due again in `delay_micros`, with `error`, if relay `token`
    /// still holds it.
    fn retry_later<C>(
        conn: &mut C,
        id: i64,
        token: String,
        delay_micros: i64,
        error: String,
    ) -> impl Future<Output = QueryResult<bool>> + Send
    where
        C: AsyncConnection<Backend = Self>;

    /// Parks message `id` with `reason`, if relay `token` still holds it.
    fn park<C>(
        conn: &mut C,
        id: i64,
        token: String,
        reason: String,
    ) -> impl Future<Output = QueryResult<bool>> + Send
    where
        C: AsyncConnection<Backend = Self>;

    /// The parked messages, oldest first, after `after_id`, at most `limit`.
    fn parked<C>(
        conn: &mut C,
        after_id: i64,
        limit: i64,
    ) -> impl Future<Output = QueryResult<Vec<OutgoingRow>>> + Send
    where
        C: AsyncConnection<Backend = Self>;

    /// Makes parked message `id` due now; `false` if it is not parked.
    fn requeue<C>(conn: &mut C, id: i64) -> impl Future<Output = QueryResult<bool>> + Send
    where
        C: AsyncConnection<Backend = Self>;

    /// Deletes parked message `id`, returning its ordering key; `None` if it is not
    /// parked.
    fn discard<C>(
        conn: &mut C,
        id: i64,
    ) -> impl Future<Output = QueryResult<Option<DeletedKey>>> + Send
    where
        C: AsyncConnection<Backend = Self>;

    /// Deletes up to `limit` messages sent more than `window_micros` ago, oldest first,
    /// skipping those another pruner is deleting; returns the ordering keys of those it
    /// deleted.
    fn delete_sent<C>(
        conn: &mut C,
        window_micros: i64,
        limit: i64,
    ) -> impl Future<Output = QueryResult<Vec<DeletedKey>>> + Send
    where
        C: AsyncConnection<Backend = Self>;

    /// Deletes the rows of those `ordering_keys` that no unsent message has, skipping
    /// those a transaction is enqueuing under. Safe at any moment: `next_in_order`
    /// numbers a key whose row is gone after its unsent messages.
    fn delete_idle_keys<C>(
        conn: &mut C,
        ordering_keys: Vec<Vec<u8>>,
    ) -> impl Future<Output = QueryResult<usize>> + Send
    where
        C: AsyncConnection<Backend = Self>;
}

/// The ordering key of a deleted message, as UTF-8 bytes.
#[derive(Debug, diesel::QueryableByName)]
pub struct DeletedKey {
    #[diesel(sql_type = Nullable<Binary>)]
    pub ordering_key: Option<Vec<u8>>,
}

/// The number an ordering key's row holds after this transaction's update.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[derive(Debug, diesel::QueryableByName)]
pub(crate) struct LastSeq {
    #[diesel(sql_type = BigInt)]
    pub last_seq: i64,
}
