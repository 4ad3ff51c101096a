//! Deciding what a database error means for the message being handled.

use diesel::result::{DatabaseErrorKind, Error};

use crate::backend::{mysql, pg, sqlite};

/// What an error means for the message that was being handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// A unique violation of the inbox's own index: the message was already processed.
    /// Acknowledge it.
    InboxDuplicate,
    /// The database or the connection failed in a way that a retry can fix: a
    /// serialization failure, a deadlock, a lock timeout, `SQLITE_BUSY`, a lost
    /// connection, or a connection left inside a transaction. Nothing was committed:
    /// reject the message for redelivery (and discard a connection left in a
    /// transaction).
    Transient,
    /// Retrying the same message will fail the same way, for example a unique violation
    /// raised by the business write, or an invalid key. Dead-letter the message.
    Permanent,
}

/// Classifies an error returned by an `#[idempotent]` handler or by diesel.
///
/// Only a unique violation of the index named [`INDEX_NAME`](crate::schema::INDEX_NAME)
/// is [`ErrorClass::InboxDuplicate`]; any other unique violation is
/// [`ErrorClass::Permanent`], so a constraint raised by the business write is never
/// mistaken for a duplicate delivery.
pub fn classify(error: &Error) -> ErrorClass {
    match error {
        Error::DatabaseError(DatabaseErrorKind::UniqueViolation, info) => {
            let info = info.as_ref();
            if pg::names_inbox_index(info)
                || mysql::names_inbox_index(info)
                || sqlite::names_inbox_index(info)
            {
                ErrorClass::InboxDuplicate
            } else {
                ErrorClass::Permanent
            }
        }
        Error::DatabaseError(
            DatabaseErrorKind::SerializationFailure
            | DatabaseErrorKind::ClosedConnection
            | DatabaseErrorKind::UnableToSendCommand,
            _,
        ) => ErrorClass::Transient,
        Error::DatabaseError(_, info) => {
            let message = info.message();
            if pg::is_transient(message)
                || mysql::is_transient(message)
                || sqlite::is_transient(message)
            {
                ErrorClass::Transient
            } else {
                ErrorClass::Permanent
            }
        }
        Error::RollbackErrorOnCommit { commit_error, .. } => classify(commit_error),
        Error::AlreadyInTransaction | Error::BrokenTransactionManager => ErrorClass::Transient,
        _ => ErrorClass::Permanent,
    }
}
