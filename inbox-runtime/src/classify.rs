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

#[cfg(test)]
mod tests {
    use diesel::result::DatabaseErrorInformation;

    use super::*;

    /// An error as a driver reports it: a message and, on PostgreSQL, a constraint name.
    struct Reported {
        message: &'static str,
        constraint: Option<&'static str>,
    }

    impl DatabaseErrorInformation for Reported {
        fn message(&self) -> &str {
            self.message
        }
        fn details(&self) -> Option<&str> {
            None
        }
        fn hint(&self) -> Option<&str> {
            None
        }
        fn table_name(&self) -> Option<&str> {
            None
        }
        fn column_name(&self) -> Option<&str> {
            None
        }
        fn constraint_name(&self) -> Option<&str> {
            self.constraint
        }
        fn statement_position(&self) -> Option<i32> {
            None
        }
    }

    fn error(
        kind: DatabaseErrorKind,
        message: &'static str,
        constraint: Option<&'static str>,
    ) -> Error {
        Error::DatabaseError(
            kind,
            Box::new(Reported {
                message,
                constraint,
            }),
        )
    }

    fn unique(message: &'static str, constraint: Option<&'static str>) -> ErrorClass {
        classify(&error(
            DatabaseErrorKind::UniqueViolation,
            message,
            constraint,
        ))
    }

    fn unknown(message: &'static str) -> ErrorClass {
        classify(&error(DatabaseErrorKind::Unknown, message, None))
    }

    #[test]
    fn only_the_inbox_index_is_a_duplicate() {
        let pg = "duplicate key value violates unique constraint \"ux_inbox_message_consumer\"";
        assert_eq!(
            unique(pg, Some("ux_inbox_message_consumer")),
            ErrorClass::InboxDuplicate
        );
        assert_eq!(
            unique(pg, Some("accounts_email_key")),
            ErrorClass::Permanent
        );

        let mariadb = "Duplicate entry 'm1-credit' for key 'ux_inbox_message_consumer'";
        let mysql8 = "Duplicate entry 'm1-credit' for key 'inbox.ux_inbox_message_consumer'";
        assert_eq!(unique(mariadb, None), ErrorClass::InboxDuplicate);
        assert_eq!(unique(mysql8, None), ErrorClass::InboxDuplicate);
        // The quoted value is the caller's data; only the key name counts.
        let lookalike = "Duplicate entry 'for key 'ux_inbox_message_consumer'' for key 'email'";
        assert_eq!(unique(lookalike, None), ErrorClass::Permanent);
        let other_table = "Duplicate entry 'x' for key 'audit.ux_inbox_message_consumer'";
        assert_eq!(unique(other_table, None), ErrorClass::Permanent);
        let longer_name = "Duplicate entry 'x' for key 'ux_inbox_message_consumer_v2'";
        assert_eq!(unique(longer_name, None), ErrorClass::Permanent);

        let sqlite = "UNIQUE constraint failed: inbox.message_id, inbox.consumer";
        assert_eq!(unique(sqlite, None), ErrorClass::InboxDuplicate);
        let sqlite_other = "UNIQUE constraint failed: ledger.entry";
        assert_eq!(unique(sqlite_other, None), ErrorClass::Permanent);
    }

    #[test]
    fn retryable_failures_are_transient() {
        assert_eq!(unknown("deadlock detected"), ErrorClass::Transient);
        assert_eq!(
            unknown("Deadlock found when trying to get lock; try restarting transaction"),
            ErrorClass::Transient
        );
        assert_eq!(
            unknown("Lock wait timeout exceeded; try restarting transaction"),
            ErrorClass::Transient
        );
        assert_eq!(unknown("database is locked"), ErrorClass::Transient);
        let serialization = error(
            DatabaseErrorKind::SerializationFailure,
            "could not serialize",
            None,
        );
        assert_eq!(classify(&serialization), ErrorClass::Transient);
        let closed = error(
            DatabaseErrorKind::ClosedConnection,
            "connection closed",
            None,
        );
        assert_eq!(classify(&closed), ErrorClass::Transient);
        assert_eq!(
            classify(&Error::AlreadyInTransaction),
            ErrorClass::Transient
        );
        assert_eq!(
            classify(&Error::BrokenTransactionManager),
            ErrorClass::Transient
        );
        let commit = Error::RollbackErrorOnCommit {
            rollback_error: Box::new(Error::BrokenTransactionManager),
            commit_error: Box::new(serialization),
        };
        assert_eq!(classify(&commit), ErrorClass::Transient);
    }

    #[test]
    fn everything_else_is_permanent() {
        assert_eq!(unknown("division by zero"), ErrorClass::Permanent);
        let check = error(
            DatabaseErrorKind::CheckViolation,
            "check",
            Some("positive_balance"),
        );
        assert_eq!(classify(&check), ErrorClass::Permanent);
        assert_eq!(classify(&Error::NotFound), ErrorClass::Permanent);
        let invalid = Error::from(crate::InvalidKey::Empty);
        assert_eq!(classify(&invalid), ErrorClass::Permanent);
    }
}
