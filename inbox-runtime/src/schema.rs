//! The inbox table.
//!
//! Each row records that one consumer has processed one message, or, in claim mode, is
//! processing it. The unique index
//! [`INDEX_NAME`] on (`message_id`, `consumer`) is what makes processing exactly-once:
//! the database, not a read-then-write check, decides which delivery wins. On
//! PostgreSQL it is on `inbox_key_digest(consumer, message_id)`, a 16-byte digest of the
//! two, on MySQL/MariaDB on the virtual column `key_digest`, the same digest; the crate
//! compares the stored key whenever an insert meets a marker.
//!
//! The SQL for each backend ships as diesel-CLI migration folders under `migrations/`
//! in this crate's repository, and [`migrate`](crate::migrate) runs the same SQL.
//! PostgreSQL stores `processed_at` as `timestamptz`, which reads back through the
//! `Timestamp` SQL type as UTC; MySQL keeps microseconds in the session's time zone;
//! SQLite keeps whole seconds of UTC.

/// Name of the unique index on (`message_id`, `consumer`).
///
/// [`classify`](crate::classify) recognises a duplicate by this name, so it must not be
/// changed in your migrations.
pub const INDEX_NAME: &str = "ux_inbox_message_consumer";

/// What [`upgrade_unique_index`](crate::upgrade_unique_index) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IndexUpgrade {
    /// The unique index was rebuilt and swapped in.
    Rebuilt,
    /// The unique index was already the current one.
    Current,
}

/// Longest stored `message_id`, in bytes. Longer keys are rejected, never truncated.
pub const MESSAGE_ID_MAX_BYTES: usize = 512;

/// Longest consumer name, in bytes.
pub const CONSUMER_MAX_BYTES: usize = 200;

diesel::table! {
    /// One row per (message, consumer) that has been processed.
    inbox (id) {
        /// Surrogate key, assigned in insertion order.
        id -> BigInt,
        /// The encoded [`InboxKey`](crate::InboxKey) of the message.
        message_id -> Text,
        /// The consumer (handler) that processed the message.
        consumer -> Text,
        /// When the message was processed: the marker is written as the handler's
        /// transaction starts, and commits with it. For a claim not yet completed, when
        /// it was first claimed.
        processed_at -> Timestamp,
        /// `NULL` for a completed marker: every transactional one, and a claim whose
        /// body finished. Otherwise the end of the claim's lease, on the database's clock.
        lease_ends_at -> Nullable<Timestamp>,
        /// The token of the claim's current holder; `NULL` once a failed body released it.
        claim_token -> Nullable<Text>,
        /// How many times a claim's body was started: 1, plus one per takeover.
        attempts -> Integer,
        /// The hex SHA-256 of the payload, when the handler gives a `fingerprint`.
        fingerprint -> Nullable<Text>,
    }
}
