//! PostgreSQL.
//!
//! A duplicate is detected with `INSERT … ON CONFLICT DO NOTHING`: it waits for a
//! concurrent transaction holding the same key, then inserts nothing. No unique violation
//! is raised, so the transaction is never aborted (PostgreSQL would answer its `COMMIT`
//! with a silent `ROLLBACK`) and the server log gets no `ERROR` line per duplicate.
//!
//! The unique index is on a 128-bit digest of (consumer, key), `inbox_key_digest`, which
//! takes half the space of both texts. An insert that meets a marker reads its key back
//! to tell a duplicate from a collision (`markers.rs`); an inbox that 0.2 created keeps
//! its index on both texts until `upgrade_unique_index` swaps it (`upgrade.rs`).

use diesel::result::DatabaseErrorInformation;

use crate::schema::INDEX_NAME;

/// A unique violation names the violated index in its constraint field.
pub(crate) fn names_inbox_index(info: &dyn DatabaseErrorInformation) -> bool {
    info.constraint_name() == Some(INDEX_NAME)
}

/// Serialises concurrent `migrate` calls: concurrent `CREATE TABLE IF NOT EXISTS`
/// can fail on PostgreSQL's catalog unique indexes. The value spells "inboxmig".
#[cfg(feature = "postgres")]
const MIGRATE_LOCK: i64 = 0x696e_626f_786d_6967;

/// How the message of 25P02 begins: a statement in a transaction that an earlier error
/// aborted.
const ABORTED_TRANSACTION: &str = "current transaction is aborted";

/// diesel-async reports these SQLSTATEs as `Unknown`, with only the message text to go by
/// (in the server's `lc_messages` language; these are the English texts): 40P01
/// deadlock, 55P03 lock not available, 57014 a statement cancelled (by `lock_timeout`,
/// `statement_timeout`, `pg_cancel_backend` or a conflict with recovery: a marker insert
/// waiting for another delivery is cut short this way), and 25P02, a transaction
/// aborted by an earlier error that the handler did not propagate. Also the server out
/// of room: 53100, a disk full ("could not extend file …: No space left on device"), and
/// 53200, out of memory. No message is at fault there, and dead-lettered, every message
/// in flight while the disk was full would be lost to the dead letters.
pub(crate) fn is_transient(message: &str) -> bool {
    [
        "deadlock detected",
        "could not obtain lock",
        "canceling statement due to",
        // 40001, which diesel-async reports as `SerializationFailure`; its text is all a
        // wrapper that hides the kind leaves.
        "could not serialize access",
        ABORTED_TRANSACTION,
        "out of memory",
    ]
    .iter()
    .any(|prefix| message.starts_with(prefix))
        || message.ends_with(": No space left on device")
}

/// A statement that names the key's digest, on an inbox that this version's `migrate` has
/// not reached yet (instances upgrading one by one, or a migration not yet applied):
/// retried, since the next delivery finds it migrated. The function's name stands in
/// the message in every server language.
pub(crate) fn lacks_key_digest(message: &str) -> bool {
    message.contains("inbox_key_digest(")
}

/// A statement that names a claim column, on an inbox of 0.1 that this version's
/// `migrate` has not reached yet: retried, as [`lacks_key_digest`] is. Every server
/// language quotes the column's name.
pub(crate) fn lacks_claim_columns(message: &str) -> bool {
    message.contains("\"lease_ends_at\"")
}

/// A pooler between the client and the server that hands one client's prepared
/// statements to another: PgBouncer in transaction pool mode (before 1.21, or without
/// `max_prepared_statements`) or in statement pool mode. The server finds a statement
/// missing (26000), already there (42P05) or taking other parameters (08P01), or
/// PgBouncer refuses a transaction block. No message is at fault; and where a statement
/// can run as another, no handler can be trusted on the connection.
pub(crate) fn is_shared_statements(message: &str) -> bool {
    (message.starts_with("prepared statement \"")
        && (message.ends_with("\" does not exist") || message.ends_with("\" already exists")))
        || (message.starts_with("bind message supplies ")
            && message.contains(" parameters, but prepared statement \""))
        || message == "transaction blocks not allowed in statement pooling mode"
}

/// 25006, a write in a read-only transaction: a standby, a primary being demoted, or
/// `default_transaction_read_only` set during a failover. Another connection, or this
/// one later, can take it.
pub(crate) fn is_read_only(message: &str) -> bool {
    message.starts_with("cannot execute ") && message.ends_with(" in a read-only transaction")
}

/// Whether the server words its errors as the recognisers above expect: `lc_messages`
/// in English, or the untranslated `C`/`POSIX` (the empty setting follows the server's
/// environment, which is beyond reach, and is taken as it is).
#[cfg(feature = "postgres")]
pub(crate) fn speaks_english(lc_messages: &str) -> bool {
    let language = lc_messages.to_ascii_lowercase();
    language.is_empty()
        || language.starts_with("en")
        || language.starts_with("c.")
        || language == "c"
        || language == "posix"
}

/// 57P01 and its kin: the server ended the session (`pg_terminate_backend`, a shutdown).
pub(crate) fn is_connection_lost(message: &str) -> bool {
    message.starts_with("terminating connection")
}

#[cfg(feature = "postgres")]
mod catalog;
#[cfg(feature = "postgres")]
mod claims;
#[cfg(feature = "postgres")]
mod ddl;
#[cfg(feature = "postgres")]
mod markers;
#[cfg(feature = "postgres")]
mod outbox;
#[cfg(feature = "postgres")]
pub(crate) mod pipeline;
#[cfg(feature = "postgres")]
mod statements;
#[cfg(all(feature = "postgres", feature = "testing"))]
pub(crate) mod testing;
#[cfg(feature = "postgres")]
mod upgrade;
