//! The inbox table.
//!
//! Each row records that one consumer has processed one message. The unique index
//! [`INDEX_NAME`] on (`message_id`, `consumer`) is what makes processing exactly-once:
//! the database, not a read-then-write check, decides which delivery wins.
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
        /// transaction starts, and commits with it.
        processed_at -> Timestamp,
    }
}
