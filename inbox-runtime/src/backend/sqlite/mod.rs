//! SQLite.
//!
//! The marker insert is the first statement of the transaction, so a second writer waits
//! in the busy handler instead of failing at once with `SQLITE_BUSY` (SQLite skips the
//! busy handler for a transaction that has already read). It is sent with BEGIN and the
//! savepoint in one batch, one hop to the connection's blocking thread: a duplicate is
//! a unique violation there, which ends the batch and leaves the transaction open.
//! Connections need `PRAGMA busy_timeout`; `journal_mode = WAL` lets the fast-path read
//! run while another connection writes.

use diesel::result::DatabaseErrorInformation;

/// SQLite names the columns of the violated index, in index order.
pub(crate) fn names_inbox_index(info: &dyn DatabaseErrorInformation) -> bool {
    info.message() == "UNIQUE constraint failed: inbox.message_id, inbox.consumer"
}

/// `SQLITE_BUSY` and `SQLITE_LOCKED` (a table's, or in a shared cache the schema's,
/// while another connection changes it), which diesel reports as `Unknown`; and
/// `SQLITE_FULL`, a full disk or `max_page_count`, which no message causes and which
/// room made later gets past.
pub(crate) fn is_transient(message: &str) -> bool {
    message == "database is locked"
        || message.starts_with("database table is locked")
        || message.starts_with("database schema is locked")
        || message == "database or disk is full"
}

/// A statement that names a claim column, on an inbox of 0.1 that this version's
/// `migrate` has not reached yet: retried, as on PostgreSQL. A read says "no such
/// column", an insert that the table "has no column named" it.
pub(crate) fn lacks_claim_columns(message: &str) -> bool {
    (message.starts_with("no such column:") || message.starts_with("table inbox has no column"))
        && message.ends_with("lease_ends_at")
}

/// `SQLITE_READONLY`: the database file cannot be written now (its directory or file
/// lost write permission, or it is opened read-only); the message is not at fault.
pub(crate) fn is_read_only(message: &str) -> bool {
    message.starts_with("attempt to write a readonly database")
}

#[cfg(feature = "sqlite")]
mod claims;
#[cfg(feature = "sqlite")]
mod outbox;
#[cfg(feature = "sqlite")]
mod statements;
#[cfg(all(feature = "sqlite", feature = "testing"))]
pub(crate) mod testing;
