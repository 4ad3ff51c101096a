//! Deciding what a database error means for the message being handled.

use diesel::result::{DatabaseErrorKind, Error};

use crate::backend::{
    UNSUPPORTED_SESSION, lacks_inbox_column, mysql, postgres, sqlite, starts_with_any,
};
use crate::error::InboxError;

/// What an error means for the message that was being handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// A unique violation of the inbox's own index: the message was already processed.
    /// Acknowledge it.
    InboxDuplicate,
    /// A conflict that a retry on the same connection can resolve: a serialization
    /// failure (MariaDB's snapshot conflict among them), a deadlock, a lock or statement
    /// timeout, `SQLITE_BUSY`, an interrupted statement. Or a server out of room, a full
    /// disk, table or memory, which a later retry gets past once there is room again.
    /// Nothing was committed: redeliver the message.
    Transient,
    /// The connection cannot be used again, or could not be had: it was lost, left
    /// inside a transaction (by a cancelled handler, or a rollback that failed), reaches
    /// a server that is read-only for now (a failover), or could not be opened or taken
    /// from the pool. Nothing of this call was committed: discard the connection (pools
    /// do this for a connection left in a transaction) and redeliver the message on
    /// another.
    ConnectionUnusable,
    /// Retrying the same message will fail the same way, for example a unique violation
    /// raised by the business write, or an invalid key. Dead-letter the message.
    Permanent,
}

impl ErrorClass {
    /// Whether the message should be delivered again: [`ErrorClass::Transient`] and
    /// [`ErrorClass::ConnectionUnusable`].
    pub const fn is_retryable(self) -> bool {
        matches!(self, Self::Transient | Self::ConnectionUnusable)
    }
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
            if postgres::names_inbox_index(info)
                || mysql::names_inbox_index(info)
                || sqlite::names_inbox_index(info)
            {
                ErrorClass::InboxDuplicate
            } else {
                ErrorClass::Permanent
            }
        }
        Error::DatabaseError(DatabaseErrorKind::SerializationFailure, _) => ErrorClass::Transient,
        // A standby, a demoted primary, a read-only session: the pool's next connection,
        // or a later one, can take the write.
        Error::DatabaseError(DatabaseErrorKind::ReadOnlyTransaction, _) => {
            ErrorClass::ConnectionUnusable
        }
        Error::DatabaseError(
            DatabaseErrorKind::ClosedConnection | DatabaseErrorKind::UnableToSendCommand,
            _,
        ) => ErrorClass::ConnectionUnusable,
        Error::DatabaseError(_, info) => {
            classify_message(info.message()).unwrap_or(ErrorClass::Permanent)
        }
        // A claim lost to a takeover can be redelivered; every other refusal of claim
        // mode, like an invalid key or a fingerprint mismatch, is permanent.
        Error::SerializationError(inner) => match inner.downcast_ref::<InboxError>() {
            Some(InboxError::Claim(claim)) if claim.is_transient() => ErrorClass::Transient,
            Some(InboxError::Claim(claim)) if claim.leaves_connection_unusable() => {
                ErrorClass::ConnectionUnusable
            }
            _ => ErrorClass::Permanent,
        },
        // The rollback after a failed COMMIT failed too: the transaction may still be
        // open on this connection.
        Error::RollbackErrorOnCommit { .. } => ErrorClass::ConnectionUnusable,
        Error::AlreadyInTransaction | Error::BrokenTransactionManager => {
            ErrorClass::ConnectionUnusable
        }
        _ => ErrorClass::Permanent,
    }
}

/// The class of a database error from its message alone, for the errors diesel-async
/// reports as `Unknown`; `None` when the message is not one of them.
///
/// A server in read-only mode counts as an unusable connection: during a failover the
/// pool's next connection, or a later one, reaches the server that now takes writes.
pub(crate) fn classify_message(message: &str) -> Option<ErrorClass> {
    if message.starts_with(UNSUPPORTED_SESSION)
        || postgres::is_shared_statements(message)
        || postgres::is_connection_lost(message)
        || mysql::is_connection_lost(message)
        || postgres::is_read_only(message)
        || mysql::is_read_only(message)
        || sqlite::is_read_only(message)
    {
        Some(ErrorClass::ConnectionUnusable)
    } else if postgres::is_transient(message)
        || mysql::is_transient(message)
        || sqlite::is_transient(message)
        || lacks_inbox_column(message)
    {
        Some(ErrorClass::Transient)
    } else {
        None
    }
}

/// The class of an error known by its text alone, `None` where the text says nothing
/// retryable: what is left where a wrapper hid the diesel error from `source()`
/// (`#[error(transparent)]`, an anyhow or eyre error boxed). The server's words
/// ([`classify_message`]), and those with which the drivers, the pools, diesel and
/// this crate report what another connection, or a later delivery, gets past. A lost
/// connection reaches the handler in the driver's words, not the server's: dead-lettered
/// on those, a two-second outage sent nearly every message in flight to the dead
/// letters.
///
/// A wrapper may also fold the text into its own (`anyhow!("credit {id}: {error}")`,
/// `#[error("database: {0}")]` over the error's text): each clause after a `": "` is
/// read as well, the outermost first.
pub(crate) fn classify_text(text: &str) -> Option<ErrorClass> {
    let folded = text
        .match_indices(": ")
        .map(|(at, separator)| text[at + separator.len()..].trim_start());
    std::iter::once(text)
        .chain(folded)
        .find_map(classify_clause)
}

/// [`classify_text`] of one clause: the texts it knows open it.
fn classify_clause(text: &str) -> Option<ErrorClass> {
    /// Openings of the texts of errors that leave the connection unusable.
    const CONNECTION_UNUSABLE: &[&str] = &[
        // diesel's `BrokenTransactionManager` and `AlreadyInTransaction`.
        "The transaction manager is broken",
        "Cannot perform this operation while a transaction is open",
        // tokio-postgres (through diesel-async): the connection closed, or failed.
        "connection closed",
        "error communicating with the server",
        "error connecting to server",
    ];
    /// Openings of the texts of errors that a later attempt gets past.
    const TRANSIENT: &[&str] = &[
        // The server refusing a connection for now.
        "sorry, too many clients already",
        "Too many connections",
        // deadpool's and bb8's time-outs waiting for, creating or recycling one.
        "Timeout occurred while ",
        "Timed out in bb8",
    ];
    if let Some(class) = classify_message(text) {
        return Some(class);
    }
    if starts_with_any(text, CONNECTION_UNUSABLE) || crate::error::leaves_connection_unusable(text)
    {
        Some(ErrorClass::ConnectionUnusable)
    } else if starts_with_any(text, TRANSIENT) || crate::error::is_transient(text) {
        Some(ErrorClass::Transient)
    } else {
        None
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

    /// An instance of this version meets an inbox not yet migrated to the key's digest
    /// while instances upgrade: the delivery is retried, never dead-lettered.
    #[test]
    fn a_missing_key_digest_is_retried() {
        let pg = "function inbox_key_digest(text, text) does not exist";
        let pg_spanish = "la función inbox_key_digest(text, text) no existe";
        let mariadb = "Unknown column 'key_digest' in 'WHERE'";
        let mariadb_german = "Unbekanntes Tabellenfeld 'key_digest' in WHERE";
        for message in [pg, pg_spanish, mariadb, mariadb_german] {
            assert_eq!(unknown(message), ErrorClass::Transient, "{message}");
        }
        assert_eq!(
            unknown("function other_digest(text) does not exist"),
            ErrorClass::Permanent
        );
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

        // Every server language quotes the value first and the key's name last.
        for translated in [
            "Doppelter Eintrag 'm1-credit' für Schlüssel 'ux_inbox_message_consumer'",
            "'m1-credit' は索引 'ux_inbox_message_consumer' で重複しています。",
            "Duplikalt bejegyzes 'm1-credit' a 'ux_inbox_message_consumer' kulcs szerint",
            "Zvojený klíč 'm1-credit' (číslo klíče 'ux_inbox_message_consumer')",
        ] {
            assert_eq!(
                unique(translated, None),
                ErrorClass::InboxDuplicate,
                "{translated}"
            );
        }
        let translated_lookalike = "'ux_inbox_message_consumer' は索引 'email' で重複しています。";
        assert_eq!(unique(translated_lookalike, None), ErrorClass::Permanent);

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
        // MariaDB's snapshot conflicts (`innodb_snapshot_isolation`), whichever way the
        // translation places the table.
        for message in [
            "Record has changed since last read in table 'accounts'; try restarting transaction",
            "Datensatz hat sich seit dem letzten Zugriff auf Tabelle 'accounts' geändert. \
             Versuchen Sie, die Transaktion neu zu starten",
            "表 'accounts' の最後の読み込み時点から、レコードが変化しました。\
             トランザクションを再試行してください。",
            "Kirje tabelis 'accounts' on muutunud viimasest lugemisest saadik; alusta \
             transaktsiooni otsast",
        ] {
            assert_eq!(unknown(message), ErrorClass::Transient, "{message}");
        }
        // Waits cut short, in any language the server speaks.
        for message in [
            "canceling statement due to statement timeout",
            "canceling statement due to user request",
            "Query execution was interrupted",
            "Query execution was interrupted (max_statement_time exceeded)",
            "Ausführung der Abfrage wurde unterbrochen",
            "Beim Warten auf eine Sperre wurde die zulässige Wartezeit überschritten. Bitte \
             versuchen Sie, die Transaktion neu zu starten",
            "Timeout sur l'obtention du verrou",
            "Tiempo de espera de bloqueo excedido; intente rearrancar la transacción",
            "Beim Versuch, eine Sperre anzufordern, ist ein Deadlock aufgetreten. Versuchen \
             Sie, die Transaktion neu zu starten",
            // InnoDB rolled back the whole transaction under a nested `conn.transaction`.
            "SAVEPOINT diesel_savepoint_1 does not exist",
            "SAVEPOINT diesel_savepoint_2 existiert nicht",
            "SAVEPOINTdiesel_savepoint_1不存在",
            // PostgreSQL out of room: a full disk (53100), memory (53200).
            "could not extend file \"base/16384/16403\": No space left on device",
            "could not extend file \"base/16384/16403\" with FileFallocate(): No space left \
             on device",
            "could not write to file \"base/pgsql_tmp/pgsql_tmp1.0\": No space left on device",
            "out of memory",
            // PostgreSQL in other languages, a relation's name where its texts have one.
            "Verklemmung (Deadlock) entdeckt",
            "storniere Anfrage wegen Zeitüberschreitung einer Sperre",
            "\"accounts\" 릴레이션의 잠금 정보를 구할 수 없음",
            "la transaction est annulée, les commandes sont ignorées jusqu'à la fin du bloc\n\
             de la transaction",
            "メモリ不足です",
            // MySQL/MariaDB out of room: a full table (InnoDB's full disk), in each
            // language (Korean's ends in a space), and a file it could not write.
            "The table 'accounts' is full",
            "Tabelle 'accounts' ist voll",
            "테이블 'accounts'가 full났습니다. ",
            "Error writing file './test/accounts.ibd' (errno: 28 \"No space left on device\")",
        ] {
            assert_eq!(unknown(message), ErrorClass::Transient, "{message}");
        }
        let serialization = error(
            DatabaseErrorKind::SerializationFailure,
            "could not serialize",
            None,
        );
        assert_eq!(classify(&serialization), ErrorClass::Transient);
        assert!(ErrorClass::Transient.is_retryable());
    }

    #[test]
    fn a_connection_that_cannot_be_used_again_says_so() {
        let closed = error(
            DatabaseErrorKind::ClosedConnection,
            "connection closed",
            None,
        );
        assert_eq!(classify(&closed), ErrorClass::ConnectionUnusable);
        for message in [
            "terminating connection due to administrator command",
            "Lost connection to server during query",
            "MySQL server has gone away",
            "Input/output error: broken pipe",
            // Galera 1047: this node has left the primary component.
            "WSREP has not yet prepared node for application use",
            // Galera 1180: a commit in flight as the node left the primary component.
            "Error while appending streaming replication fragment(provider status: Not \
             connected to Primary Component)",
        ] {
            assert_eq!(
                unknown(message),
                ErrorClass::ConnectionUnusable,
                "{message}"
            );
        }
        assert_eq!(
            classify(&Error::AlreadyInTransaction),
            ErrorClass::ConnectionUnusable
        );
        assert_eq!(
            classify(&Error::BrokenTransactionManager),
            ErrorClass::ConnectionUnusable
        );
        let serialization = error(
            DatabaseErrorKind::SerializationFailure,
            "could not serialize",
            None,
        );
        let commit = Error::RollbackErrorOnCommit {
            rollback_error: Box::new(Error::BrokenTransactionManager),
            commit_error: Box::new(serialization),
        };
        assert_eq!(classify(&commit), ErrorClass::ConnectionUnusable);
        assert!(ErrorClass::ConnectionUnusable.is_retryable());
        assert!(!ErrorClass::Permanent.is_retryable());
        assert!(!ErrorClass::InboxDuplicate.is_retryable());
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn known_postgresql_languages_are_recognised() {
        for known in [
            "",
            "C",
            "C.UTF-8",
            "c.utf8",
            "POSIX",
            "en_US.UTF-8",
            "en_GB",
            "de_DE.UTF-8",
            "fr_FR",
            "ja_JP.UTF-8",
            "zh_TW.UTF-8",
        ] {
            assert!(postgres::speaks_a_known_language(known), "{known}");
        }
        for other in ["pl_PL.UTF-8", "pt_BR", "Catalan", "German_Germany.1252"] {
            assert!(!postgres::speaks_a_known_language(other), "{other}");
        }
    }

    #[test]
    fn a_read_only_server_is_retried_elsewhere() {
        let kind = error(DatabaseErrorKind::ReadOnlyTransaction, "read-only", None);
        assert_eq!(classify(&kind), ErrorClass::ConnectionUnusable);
        for message in [
            "cannot execute INSERT in a read-only transaction",
            "Cannot execute statement in a READ ONLY transaction",
            "No puedo ejecutar sentencia en una transacción READ ONLY",
            "The MariaDB server is running with the --read-only option so it cannot execute \
             this statement",
            "The MySQL server is running with the --super-read-only option so it cannot \
             execute this statement",
            "MariaDBサーバーが --read-only オプションで実行されているので、このステートメントは実行できません。",
            "attempt to write a readonly database",
        ] {
            assert_eq!(
                unknown(message),
                ErrorClass::ConnectionUnusable,
                "{message}"
            );
        }
        let other_option = "The MariaDB server is running with the --skip-grant-tables \
                            option so it cannot execute this statement";
        assert_eq!(unknown(other_option), ErrorClass::Permanent);
    }

    #[test]
    fn everything_else_is_permanent() {
        assert_eq!(unknown("division by zero"), ErrorClass::Permanent);
        assert_eq!(
            unknown("SAVEPOINT my_own_savepoint does not exist"),
            ErrorClass::Permanent
        );
        #[cfg(any(feature = "mysql", feature = "sqlite"))]
        assert_eq!(
            classify(&crate::backend::committed_early()),
            ErrorClass::Permanent
        );
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

    /// Every translation MariaDB ships of the errors `classify` must recognise, read from
    /// the server's own message catalogue: a server upgrade that adds or rewords one
    /// fails here instead of dead-lettering messages.
    #[test]
    fn every_mariadb_translation_is_recognised() {
        let path = std::env::var("MARIADB_ERRMSG")
            .unwrap_or_else(|_| String::from("/usr/share/mysql/errmsg-utf8.txt"));
        let Ok(catalogue) = std::fs::read_to_string(&path) else {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI has MariaDB's message catalogue at {path}"
            );
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!("SKIPPED: no MariaDB message catalogue at {path}\n").as_bytes(),
            );
            return;
        };
        let translations = |code: &str| -> Vec<String> {
            catalogue
                .lines()
                .skip_while(|line| line.split_whitespace().next() != Some(code))
                .skip(1)
                .take_while(|line| line.starts_with(char::is_whitespace))
                .filter_map(|line| {
                    let (_language, text) = line.trim().split_once(char::is_whitespace)?;
                    Some(text.trim().trim_matches('"').to_owned())
                })
                .collect()
        };
        let mut checked = 0;
        for code in [
            "ER_LOCK_WAIT_TIMEOUT",
            "ER_LOCK_DEADLOCK",
            "ER_QUERY_INTERRUPTED",
            "ER_STATEMENT_TIMEOUT",
        ] {
            for text in translations(code) {
                let error = error(DatabaseErrorKind::Unknown, text.clone().leak(), None);
                assert_eq!(classify(&error), ErrorClass::Transient, "{code}: {text}");
                checked += 1;
            }
        }
        for text in translations("ER_CHECKREAD") {
            let message = text.replacen("%-.192s", "accounts", 1);
            let error = error(DatabaseErrorKind::Unknown, message.clone().leak(), None);
            assert_eq!(classify(&error), ErrorClass::Transient, "{message}");
            checked += 1;
        }
        for text in translations("ER_SP_DOES_NOT_EXIST") {
            let message =
                text.replacen("%s", "SAVEPOINT", 1)
                    .replacen("%s", "diesel_savepoint_1", 1);
            let error = error(DatabaseErrorKind::Unknown, message.clone().leak(), None);
            assert_eq!(classify(&error), ErrorClass::Transient, "{message}");
            checked += 1;
        }
        for text in translations("ER_DUP_ENTRY_WITH_KEY_NAME") {
            let message = text
                .replacen("%-.64T", "it's 'ux_inbox_message_consumer'", 1)
                .replacen("%-.192s", "ux_inbox_message_consumer", 1);
            assert_eq!(
                unique(message.clone().leak(), None),
                ErrorClass::InboxDuplicate,
                "{message}"
            );
            let other = text
                .replacen("%-.64T", "'ux_inbox_message_consumer'", 1)
                .replacen("%-.192s", "email", 1);
            assert_eq!(
                unique(other.clone().leak(), None),
                ErrorClass::Permanent,
                "{other}"
            );
            checked += 1;
        }
        assert!(checked > 60, "only {checked} translations found in {path}");
    }

    /// A conflict whose read-back found no marker of the key, where the marker holding
    /// the digest is the key's own after all (a read that a statement time-out cut
    /// short): transient. It was a `KeyCollision` naming the key twice, dead-lettered.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    #[test]
    fn a_conflict_with_the_keys_own_marker_is_never_a_collision() {
        use crate::backend::met_another_marker;

        let own = met_another_marker("m-1", "c", Some((b"m-1".to_vec(), b"c".to_vec())));
        assert_eq!(classify(&own), ErrorClass::Transient, "{own}");
        for other in [
            (b"m-2".to_vec(), b"c".to_vec()),
            (b"m-1".to_vec(), b"d".to_vec()),
        ] {
            let collision = met_another_marker("m-1", "c", Some(other));
            assert_eq!(classify(&collision), ErrorClass::Permanent, "{collision}");
        }
    }

    /// A pooler that hands prepared statements between clients (PgBouncer's transaction
    /// or statement mode): no message is at fault, and the connection cannot be trusted.
    #[test]
    fn a_pooler_sharing_prepared_statements_is_an_unusable_connection() {
        for said in [
            "prepared statement \"s17\" does not exist",
            "prepared statement \"s76\" already exists",
            "bind message supplies 2 parameters, but prepared statement \"s52\" requires 0",
            "transaction blocks not allowed in statement pooling mode",
            // A server speaking another language.
            "vorbereitete Anweisung »s17« existiert nicht",
            "l'instruction préparée « s76 » existe déjà",
            "バインドメッセージは2パラメータを提供しましたが、準備された文\"s52\"では0必要でした",
            "绑定消息提供 2 个参数，但预备语句 \"s52\" 需要 0 个",
        ] {
            assert_eq!(
                classify_message(said),
                Some(ErrorClass::ConnectionUnusable),
                "{said}"
            );
        }
        assert_eq!(classify_message("prepared statement of the order"), None);
    }

    /// A wrapper that folds the error's text into its own: each clause is read. Before,
    /// only the opening was, and a lost connection so wrapped was dead-lettered.
    #[test]
    fn a_text_folded_into_a_wrappers_is_read_clause_by_clause() {
        for (said, class) in [
            (
                "credit m-1: connection closed",
                ErrorClass::ConnectionUnusable,
            ),
            (
                "database error: error communicating with the server: Broken pipe",
                ErrorClass::ConnectionUnusable,
            ),
            (
                "handler credit failed:  deadlock detected",
                ErrorClass::Transient,
            ),
            (
                "credit: pool: Timeout occurred while waiting for a slot to become available",
                ErrorClass::Transient,
            ),
            (
                "refund r-7: the handler's transaction was rolled back by the database \
                 before it could commit",
                ErrorClass::Transient,
            ),
        ] {
            assert_eq!(classify_text(said), Some(class), "{said}");
        }
        // Words that open no clause are not read: a business text may mention them.
        assert_eq!(
            classify_text("the customer's connection closed before payment"),
            None
        );
    }

    /// What a wrapper that hides the diesel error leaves: the text. Each of the crate's
    /// own retryable errors, diesel's, the drivers' and the pools' is known by it, and a
    /// business error's is not.
    #[test]
    fn texts_alone_say_what_a_retry_gets_past() {
        use crate::error::ClaimError;

        let text = |error: Error| error.to_string();
        for transient in [
            ClaimError::Lost { attempt: 3 },
            ClaimError::LeaseUsedUp { attempt: 1 },
            ClaimError::Unfinished,
        ] {
            let said = text(transient.into());
            assert_eq!(classify_text(&said), Some(ErrorClass::Transient), "{said}");
        }
        let left_open = text(ClaimError::TransactionLeftOpen { attempt: 2 }.into());
        assert_eq!(
            classify_text(&left_open),
            Some(ErrorClass::ConnectionUnusable),
            "{left_open}"
        );
        #[cfg_attr(
            not(any(feature = "postgres", feature = "mysql")),
            expect(unused_mut, reason = "only the digest's backends meet a pruned marker")
        )]
        let mut own = vec![text(crate::backend::rolled_back_underneath())];
        #[cfg(any(feature = "postgres", feature = "mysql"))]
        own.push(text(crate::backend::met_another_marker("m-1", "c", None)));
        #[cfg(any(feature = "postgres", feature = "mysql"))]
        own.push(text(crate::backend::met_another_marker(
            "m-1",
            "c",
            Some((b"m-1".to_vec(), b"c".to_vec())),
        )));
        for said in own {
            assert_eq!(classify_text(&said), Some(ErrorClass::Transient), "{said}");
        }
        for (said, class) in [
            (
                text(Error::BrokenTransactionManager),
                ErrorClass::ConnectionUnusable,
            ),
            (
                text(Error::AlreadyInTransaction),
                ErrorClass::ConnectionUnusable,
            ),
            (
                "connection closed".to_owned(),
                ErrorClass::ConnectionUnusable,
            ),
            (
                "error communicating with the server: Connection reset by peer".to_owned(),
                ErrorClass::ConnectionUnusable,
            ),
            (
                "error connecting to server: Connection refused".to_owned(),
                ErrorClass::ConnectionUnusable,
            ),
            (
                "sorry, too many clients already".to_owned(),
                ErrorClass::Transient,
            ),
            ("Too many connections".to_owned(), ErrorClass::Transient),
            (
                "Timeout occurred while waiting for a slot to become available".to_owned(),
                ErrorClass::Transient,
            ),
            ("Timed out in bb8".to_owned(), ErrorClass::Transient),
            // PostgreSQL on an inbox of 0.1 that `migrate` has not reached yet.
            (
                "column \"lease_ends_at\" does not exist".to_owned(),
                ErrorClass::Transient,
            ),
        ] {
            assert_eq!(classify_text(&said), Some(class), "{said}");
        }
        for business in [
            "new row for relation \"accounts\" violates check constraint \"positive\"",
            "credit m-1: new row for relation \"accounts\" violates check constraint",
            "refund: the order was cancelled: by its buyer",
            "attempt to debit a closed account",
            "the order was cancelled",
        ] {
            assert_eq!(classify_text(business), None, "{business}");
        }
    }
}
