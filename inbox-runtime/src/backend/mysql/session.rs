//! Everything diesel-inbox keeps in a MySQL/MariaDB session, in one place.
//!
//! | state | set by | holds | put back by |
//! |---|---|---|---|
//! | `autocommit` | the marker insert's round trip, off (a batch's BEGIN, before its inserts) | off while the handler's transaction is open | the statement after the `COMMIT`, the `ROLLBACK` batch, or [`restore_autocommit!`] after any other end of the transaction |
//! | [`saved_autocommit!`] | the same | the session's setting | cleared by the same statements |
//! | [`marker_id!`] | the marker insert's round trip (a batch's inserts: after them, and before a multi-row insert that follows a successful one) | the id of a marker row this call inserted, for the check after the `COMMIT` and after an early end | the next call |
//! | [`database!`] | the same | the database the marker went into, for the check after the `COMMIT` | the next call |
//! | [`after_commit_text!`] | a connection's first `COMMIT` | the text of [`after_commit!`], to prepare it | cleared in the same round trip |
//! | statement [`after_commit!`] | a connection's first `COMMIT` | the check after the `COMMIT` and the autocommit restore | kept for the connection's life; prepared again on a database change or a session reset |
//!
//! Claim mode keeps nothing here: it never changes the session, but commits each of its
//! statements (`crate::claims`'s MySQL module).
//!
//! One saved value is the whole stack: autocommit is off only while a handler's
//! transaction is open, and no handler runs inside another's transaction (it refuses
//! with `AlreadyInTransaction`; in a test transaction it leaves autocommit alone). A
//! handler cancelled while its transaction is open leaves the connection inside it, and
//! diesel-async says so (`is_broken_transaction_manager`): pools discard the connection
//! and handlers refuse it, so its session goes with it. Every other way out of a
//! handler, an error included, runs one of the statements that put the session back,
//! in the same round trip as the statement that ends the transaction.
//!
//! Each name is a quoted identifier holding a `.`, which an unquoted name cannot: no
//! user's variable or prepared statement bears one by accident.

/// This call's marker row's id. A session variable outlives the transaction, and
/// `LAST_INSERT_ID()` changes with the body's own inserts.
macro_rules! marker_id {
    () => {
        "@`diesel_inbox.marker_id`"
    };
}

/// The database the marker went into.
macro_rules! database {
    () => {
        "@`diesel_inbox.database`"
    };
}

/// The session's autocommit setting, while the handler's transaction has it off.
macro_rules! saved_autocommit {
    () => {
        "@`diesel_inbox.autocommit`"
    };
}

/// The text of [`after_commit!`], on its way to `PREPARE`.
macro_rules! after_commit_text {
    () => {
        "@`diesel_inbox.after_commit`"
    };
}

/// The statement that runs after every `COMMIT`, as the server's errors quote its name;
/// [`after_commit_statement!`] is the name as a statement writes it.
macro_rules! after_commit {
    () => {
        "diesel_inbox.after_commit"
    };
}

macro_rules! after_commit_statement {
    () => {
        concat!("`", after_commit!(), "`")
    };
}

/// What a call's session holds while its body runs: the database its markers went
/// into, and autocommit off, its setting saved. Assignments of a `SET`, which for one
/// marker also records the marker's id.
///
/// Autocommit off: should the transaction end underneath the body (a deadlock the body
/// swallows, a Galera abort whose error it never sees), the body's later statements
/// open a new transaction, which the commit then rolls back, instead of committing one
/// at a time. For one marker it goes off only once the marker is in, so a duplicate,
/// whose 1062 ends the batch at the insert, leaves the session as it was; a batch of
/// markers turns it off before its inserts, which the transaction may outlive too.
macro_rules! session_for_the_body {
    () => {
        concat!(
            database!(),
            " = DATABASE(), ",
            saved_autocommit!(),
            " = @@autocommit, autocommit = 0"
        )
    };
}

/// The assignments that put autocommit back as the marker insert found it. Run only
/// outside a transaction: turning autocommit on commits an open one.
macro_rules! autocommit_restored {
    () => {
        concat!(
            "autocommit = COALESCE(",
            saved_autocommit!(),
            ", @@autocommit), ",
            saved_autocommit!(),
            " = NULL"
        )
    };
}

/// [`autocommit_restored!`] as a statement.
macro_rules! restore_autocommit {
    () => {
        concat!("SET ", autocommit_restored!())
    };
}
