//! What each database needs done differently, one folder per database.
//!
//! The modes (the transaction of [`begin_transaction`](crate::begin_transaction), batches, claims) are the same
//! everywhere and speak to a database only through the sealed trait below and
//! [`claim_statements::ClaimStatements`]. Each of `postgres/`, `mysql/` and `sqlite/`
//! holds all that its database needs:
//!
//! | file | what it holds |
//! |---|---|
//! | `mod.rs` | recognising its errors: the inbox's index, transient and lost-connection messages (compiled without the feature too, so any error can be classified) |
//! | `statements.rs` | `sealed::Sealed`: the marker insert, the transaction around it, the commit checks, migration and pruning |
//! | `claims.rs` | claim mode's statements |
//! | `outbox.rs` | the outbox's statements |
//! | `testing.rs` | the test database: a schema, a database or a file per test |
//! | `session.rs` (MySQL) | the session state the transaction keeps, in one table |
//! | `call.rs` (MySQL) | statements sent outside any transaction (claim mode's, the fast path's read): their commit, and the connection marked while they are in flight |
//! | `markers.rs` (PostgreSQL, MySQL) | a marker found by its key through the digest's index or 0.2's, and a duplicate told from a collision; on PostgreSQL also the marker's statements, keys bound as bytes |
//! | `pipeline.rs` (PostgreSQL) | BEGIN and the insert in one round trip |
//! | `upgrade.rs` (PostgreSQL, MySQL) | the unique index on the key's digest, and the upgrade of 0.2's |
//!
//! A fourth database is one more folder: implement the two traits and the test database,
//! add its error recognition to [`classify`](crate::classify).

/// `sealed::Sealed::inbox_seen`, with `$tables` a query of one row whose column `tables`
/// counts the tables named `inbox` that the session sees, and `indexed` the rows of
/// their unique index named as the crate's ([`INDEX_NAME`](crate::schema::INDEX_NAME)).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
macro_rules! inbox_seen {
    ($tables:expr) => {
        fn inbox_seen<C>(
            conn: &mut C,
        ) -> impl ::std::future::Future<
            Output = ::diesel::QueryResult<$crate::backend::sealed::InboxSeen>,
        > + Send
        where
            C: ::diesel_async::AsyncConnection<Backend = Self>,
        {
            let query = ::diesel::sql_query($tables);
            async move {
                let counted: $crate::backend::sealed::Tables =
                    ::diesel_async::RunQueryDsl::get_result(query, conn).await?;
                Ok(counted.seen())
            }
        }
    };
}

/// Whether `message` opens with one of `openings`.
pub(crate) fn starts_with_any(message: &str, openings: &[&str]) -> bool {
    openings.iter().any(|opening| message.starts_with(opening))
}

/// Whether `message` is one of `texts`, each a server's text as the words before and
/// after what it names (a table, a statement), `""` after where it names nothing.
pub(crate) fn is_one_of(message: &str, texts: &[(&str, &str)]) -> bool {
    let message = message.trim_end();
    texts.iter().any(|(before, after)| {
        message.len() >= before.len() + after.len()
            && message.starts_with(before)
            && message.ends_with(after)
    })
}

pub(crate) mod claim_statements;
pub(crate) mod mysql;
pub(crate) mod outbox_statements;
pub(crate) mod postgres;
pub(crate) mod sqlite;
#[cfg(feature = "testing")]
pub(crate) mod testing;

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) mod prepared;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) mod queries;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
mod savepoint;

/// A diesel [`Backend`](diesel::backend::Backend) that `#[idempotent]` handlers can run
/// on.
///
/// Implemented for `Pg`, `Mysql` and `Sqlite` when the matching cargo feature is on. A
/// handler generic over its connection `C` needs the bound
/// `C::Backend: diesel_inbox::InboxBackend`. Sealed: the inbox's statements differ per
/// database, so only diesel-inbox implements it.
#[diagnostic::on_unimplemented(
    message = "diesel-inbox does not support the backend `{Self}`",
    label = "no diesel-inbox support for this connection's backend",
    note = "enable the matching feature of diesel-inbox (`postgres`, `mysql` or `sqlite`), \
            or add the bound `C::Backend: diesel_inbox::InboxBackend` to a generic handler"
)]
pub trait InboxBackend: diesel::backend::Backend + sealed::Sealed {}

// One impl per backend rather than a blanket impl over `Sealed`: an unsupported backend
// then fails with this trait's message alone, not also with a raw error on `Sealed`.
#[cfg(feature = "postgres")]
impl InboxBackend for diesel::pg::Pg {}
#[cfg(feature = "mysql")]
impl InboxBackend for diesel::mysql::Mysql {}
#[cfg(feature = "sqlite")]
impl InboxBackend for diesel::sqlite::Sqlite {}

/// Whether `message` says a statement named a column that the crate's inbox has, and the
/// table found does not: an inbox that this version's `migrate` has not reached yet
/// (retried, since the next delivery finds it migrated), or another table of that name
/// (which the session check tells apart).
pub(crate) fn lacks_inbox_column(message: &str) -> bool {
    postgres::lacks_key_digest(message)
        || postgres::lacks_claim_columns(message)
        || mysql::lacks_key_digest(message)
        || sqlite::lacks_claim_columns(message)
}

/// How the crate's error for a session it cannot work in begins (see `session_check`):
/// retried, since no message is at fault, while someone changes the setting it names.
pub(crate) const UNSUPPORTED_SESSION: &str = "diesel-inbox cannot work in this session: ";

/// The transaction the marker was inserted in is gone: the database rolled it back (a
/// MySQL deadlock does this, a PostgreSQL error aborts it) and the handler carried on
/// past the error. Nothing of it can commit, so the message must be redelivered.
pub(crate) fn rolled_back_underneath() -> diesel::result::Error {
    diesel::result::Error::DatabaseError(
        diesel::result::DatabaseErrorKind::SerializationFailure,
        Box::new(String::from(
            "the handler's transaction was rolled back by the database before it could \
             commit (an error inside the handler was not propagated); nothing of it was \
             committed, so the message must be redelivered",
        )),
    )
}

/// The transaction the marker was inserted in committed before the handler returned: a
/// statement in the body commits implicitly (on MySQL/MariaDB any DDL, such as `CREATE`,
/// `ALTER`, `DROP` or `TRUNCATE`) or the body sent `COMMIT` itself. The crate cannot undo
/// that, so the message needs a person, not a redelivery, which would be a duplicate.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) fn committed_early() -> diesel::result::Error {
    diesel::result::Error::DatabaseError(
        diesel::result::DatabaseErrorKind::Unknown,
        Box::new(String::from(
            "the handler's transaction was committed before the handler returned, by a \
             statement that commits implicitly (DDL such as CREATE, ALTER, DROP or TRUNCATE \
             on MySQL/MariaDB) or by a COMMIT in the handler: the marker and the writes \
             before that statement are committed, and the writes after it ran outside any \
             transaction, so a redelivery would be a duplicate of partly applied work; \
             move that statement out of the handler and reconcile this message by hand",
        )),
    )
}

/// The error for a key whose insert met a marker that is not its own, by the unique
/// index on the key's digest: a [`KeyCollision`](crate::KeyCollision) with the key and
/// consumer of the marker holding the digest, as read back; or, when none holds it any
/// more, a transient error, since a pruner deleted the marker met in between and a
/// redelivery inserts; or, when the key's own marker holds it after all, a transient
/// error too.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn met_another_marker(
    message_id: &str,
    consumer: &str,
    holder: Option<(Vec<u8>, Vec<u8>)>,
) -> diesel::result::Error {
    match holder {
        // The key's own marker, which the read before found none of: a read cut short
        // (MariaDB's `max_statement_time` can end a subquery with NULL, not an error).
        Some((stored_message_id, stored_consumer))
            if stored_message_id == message_id.as_bytes()
                && stored_consumer == consumer.as_bytes() =>
        {
            diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::SerializationFailure,
                Box::new(String::from(
                    "the marker this message's insert met is its own, but reading it back \
                     found nothing (a read cut short): nothing was written, and a \
                     redelivery reads it again",
                )),
            )
        }
        Some((stored_message_id, stored_consumer)) => crate::KeyCollision {
            message_id: message_id.to_owned(),
            consumer: consumer.to_owned(),
            stored_message_id: String::from_utf8_lossy(&stored_message_id).into_owned(),
            stored_consumer: String::from_utf8_lossy(&stored_consumer).into_owned(),
        }
        .into(),
        None => diesel::result::Error::DatabaseError(
            diesel::result::DatabaseErrorKind::SerializationFailure,
            Box::new(String::from(
                "the marker this message's insert met was deleted (pruned) before it \
                 could be compared: nothing was written, and a redelivery processes it",
            )),
        ),
    }
}

/// The key's own marker, read back after an insert met a marker: `None` where there is
/// none (the insert met another key's, or a pruned one); `Some(processed)` where there
/// is, `processed` being false for a claim that claim mode has not completed.
///
/// For a transactional or batch handler only a processed marker is a duplicate: an
/// unfinished claim (the consumer moved out of claim mode, say) is
/// [`ClaimError::Unfinished`](crate::ClaimError::Unfinished), since its body may or may
/// not have made its call; a claim-mode delivery judges such a claim itself.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) fn processed_or_unfinished(processed: bool) -> diesel::QueryResult<()> {
    if processed {
        Ok(())
    } else {
        Err(crate::ClaimError::Unfinished.into())
    }
}

/// Said where `migrate` leaves an inbox with markers on 0.2's unique index, whose
/// markers take `old` bytes against the digest's `new`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn warn_of_the_index_of_0_2(old: u32, new: u32) {
    tracing::warn!(
        target: "diesel_inbox",
        "the inbox's unique index is diesel-inbox 0.2's, on both texts of each marker \
         (about {old} bytes a marker): call `diesel_inbox::upgrade_unique_index` once to \
         replace it, while handlers run, with one on their digest (about {new} bytes)"
    );
}

/// `migrate`'s answer to an `inbox` table without the crate's unique index: another
/// table of that name, which its index and columns would turn into an inbox whose
/// inserts fail (a column of its own that is `NOT NULL`), or that dedupes on its rows.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) fn foreign_inbox() -> diesel::result::Error {
    diesel::result::Error::QueryBuilderError(
        format!(
            "the `inbox` table found here is not diesel-inbox's: it has no unique index \
             `{}`, so migrate leaves it as it is. Give the crate's inbox a database or \
             schema of its own, or rename that table",
            crate::schema::INDEX_NAME
        )
        .into(),
    )
}

/// Rolls back the transaction that `error` ended the use of, and returns `error`: it
/// explains more than a failed rollback, which marks the connection broken for its pool.
pub(crate) async fn roll_back_for<C: diesel_async::AsyncConnection>(
    conn: &mut C,
    error: diesel::result::Error,
) -> diesel::result::Error {
    let _already_broken =
        <C::TransactionManager as diesel_async::TransactionManager<C>>::rollback_transaction(conn)
            .await;
    error
}

/// Records in the transaction manager that a BEGIN about to be sent in a batch of our own
/// opens a transaction. Counted before the batch is sent: should the call be dropped
/// while it is in flight, the manager counts a transaction that the server may have
/// opened, and pools discard the connection. Counted after, a dropped call would leave a
/// connection that looks idle inside a transaction holding an uncommitted marker, where
/// on MySQL the next user's BEGIN would commit it without the body's effects.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) fn enter_transaction<C: diesel_async::AsyncConnection>(
    conn: &mut C,
) -> diesel::QueryResult<()> {
    change_transaction_depth(
        conn,
        diesel::connection::TransactionDepthChange::IncreaseDepth,
    )
}

/// Ends the transaction that `begin_with_marker` opened unless it inserted the marker
/// (`Ok(true)`, returned as it is): a duplicate, or an error, which explains more than
/// a rollback that failed because the connection was already broken, or found no
/// transaction, which the database ended itself on that error (SQLite on a full
/// database, and diesel noticed).
pub(crate) async fn end_unless_inserted<C: diesel_async::AsyncConnection>(
    conn: &mut C,
    inserted: diesel::QueryResult<bool>,
) -> diesel::QueryResult<bool> {
    use diesel::result::Error;
    use diesel_async::TransactionManager;

    if let Ok(true) = inserted {
        return inserted;
    }
    match (
        inserted,
        C::TransactionManager::rollback_transaction(conn).await,
    ) {
        (Ok(_), Ok(()) | Err(Error::NotInTransaction)) => Ok(false),
        (Err(error), Ok(()) | Err(Error::BrokenTransactionManager | Error::NotInTransaction)) => {
            Err(error)
        }
        (_, Err(rollback)) => Err(rollback),
    }
}

/// Records in the transaction manager that a COMMIT or ROLLBACK sent in a batch of our own
/// has ended the transaction. Had the call been cancelled before this, the manager would
/// still count a transaction, and pools discard such a connection.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) fn leave_transaction<C: diesel_async::AsyncConnection>(
    conn: &mut C,
) -> diesel::QueryResult<()> {
    change_transaction_depth(
        conn,
        diesel::connection::TransactionDepthChange::DecreaseDepth,
    )
}

/// Refuses a connection inside a transaction, a test transaction's included, for a
/// call whose statements must each be a transaction of their own: a prune's batches,
/// and on MySQL/MariaDB schema changes, before each of which the server commits the
/// open transaction (a test's writes would end unseen, and the handlers after it
/// commit for real).
pub(crate) fn outside_a_transaction<C: diesel_async::AsyncConnection>(
    conn: &mut C,
) -> diesel::QueryResult<()> {
    use diesel_async::TransactionManager;

    match C::TransactionManager::transaction_manager_status_mut(conn).transaction_depth()? {
        Some(_) => Err(diesel::result::Error::AlreadyInTransaction),
        None => Ok(()),
    }
}

/// The transaction manager's state, kept aside while a statement sent outside any
/// transaction is in flight, the manager reading as in error meanwhile: a call dropped
/// before the statement's answer came leaves the connection marked broken, which pools
/// discard and handlers refuse, as one dropped during a BEGIN of ours. mysql_async
/// hands the answer of a statement whose future was dropped to the connection's next
/// statement, which then takes it for its own (a fast-path read's `1` made a new
/// message a duplicate). Inside a transaction the manager already counts one, and
/// nothing is marked.
#[must_use = "the connection reads as broken until the statement is `answered`"]
pub(crate) struct InFlight(Option<diesel::connection::ValidTransactionManagerStatus>);

impl InFlight {
    /// Marks `conn` until [`InFlight::answered`], unless a transaction is open; a
    /// connection already marked is refused.
    pub(crate) fn mark<C: diesel_async::AsyncConnection>(
        conn: &mut C,
    ) -> diesel::QueryResult<Self> {
        use diesel::connection::TransactionManagerStatus;
        use diesel_async::TransactionManager;

        let status = C::TransactionManager::transaction_manager_status_mut(conn);
        if status.transaction_depth()?.is_some() {
            return Ok(Self(None));
        }
        match std::mem::replace(status, TransactionManagerStatus::InError) {
            TransactionManagerStatus::Valid(valid) => Ok(Self(Some(valid))),
            TransactionManagerStatus::InError => {
                Err(diesel::result::Error::BrokenTransactionManager)
            }
        }
    }

    /// The statements' answers are in: the manager's state is what it was.
    pub(crate) fn answered<C: diesel_async::AsyncConnection>(self, conn: &mut C) {
        use diesel::connection::TransactionManagerStatus;
        use diesel_async::TransactionManager;

        if let Some(valid) = self.0 {
            *C::TransactionManager::transaction_manager_status_mut(conn) =
                TransactionManagerStatus::Valid(valid);
        }
    }
}

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
fn change_transaction_depth<C: diesel_async::AsyncConnection>(
    conn: &mut C,
    change: diesel::connection::TransactionDepthChange,
) -> diesel::QueryResult<()> {
    use diesel::connection::TransactionManagerStatus;
    use diesel_async::TransactionManager;

    match C::TransactionManager::transaction_manager_status_mut(conn) {
        TransactionManagerStatus::Valid(status) => status.change_transaction_depth(change),
        TransactionManagerStatus::InError => Err(diesel::result::Error::BrokenTransactionManager),
    }
}

pub(crate) mod sealed {
    use std::future::Future;

    use diesel::QueryResult;
    use diesel_async::AsyncConnection;

    use super::claim_statements::ClaimStatements;
    use super::outbox_statements::OutboxStatements;

    /// The (message, consumer) pair a call is about.
    ///
    /// Statements bind copies of it rather than borrowing it: a borrow held across an
    /// `.await` inside the transaction closure makes rustc unable to prove the handler's
    /// future `Send` for concrete connection types (rust-lang/rust#100013), and handlers
    /// must be spawnable.
    #[derive(Debug, Clone)]
    pub struct Marker {
        pub message_id: String,
        pub consumer: &'static str,
        /// Stored with the marker when the handler gives one. Without one the insert
        /// names no column that 0.1's table lacks.
        pub fingerprint: Option<String>,
    }

    /// The ids the inbox holds, `start..end`: see [`Sealed::prune_bounds`].
    #[derive(Debug, diesel::QueryableByName)]
    pub struct PruneBounds {
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
        pub start: Option<i64>,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
        pub end: Option<i64>,
    }

    /// A marker found by [`Sealed::first_marker_from`].
    #[derive(Debug, diesel::QueryableByName)]
    pub struct MarkerAge {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        pub id: i64,
        /// Processed before the window.
        #[diesel(sql_type = diesel::sql_types::Bool)]
        pub old: bool,
    }

    /// What [`InboxBackend`](super::InboxBackend) needs of a backend, out of reach of
    /// other crates: the statements of transactional handlers here, claim mode's in
    /// [`ClaimStatements`], the outbox's in [`OutboxStatements`].
    pub trait Sealed:
        diesel::backend::Backend + ClaimStatements + OutboxStatements + Sized
    {
        /// Whether the marker row is already committed. Must never see another
        /// transaction's uncommitted marker, whatever the session's isolation level: that
        /// transaction may still roll back.
        fn already_processed<'c, C>(
            conn: &'c mut C,
            marker: &Marker,
        ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, Self, C>
        where
            C: AsyncConnection<Backend = Self>;

        /// Begins the transaction and inserts the marker as its first statement, as
        /// BEGIN then [`Sealed::insert_marker`] do, which is how it is done by default.
        /// `Ok(true)` leaves the transaction open with the marker; on `Ok(false)` (a
        /// duplicate) or `Err` the transaction is over.
        fn begin_with_marker<'c, C>(
            conn: &'c mut C,
            marker: &Marker,
        ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, Self, C>
        where
            C: AsyncConnection<Backend = Self>,
        {
            use diesel_async::TransactionManager;

            let marker = marker.clone();
            async move {
                C::TransactionManager::begin_transaction(conn).await?;
                let inserted = Self::insert_marker(conn, &marker).await;
                super::end_unless_inserted(conn, inserted).await
            }
        }

        /// Inserts the marker row right after BEGIN, or in a test transaction after the
        /// call's savepoint; `Ok(false)` when the row was already there (committed by
        /// another transaction, which this call waited for). Also prepares whatever
        /// [`Sealed::commit`] checks, where [`Sealed::begin_with_marker`] leaves that to
        /// it.
        fn insert_marker<'c, C>(
            conn: &'c mut C,
            marker: &Marker,
        ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, Self, C>
        where
            C: AsyncConnection<Backend = Self>;

        /// Inserts a batch's markers as the transaction's first statements (after BEGIN, or
        /// in a test transaction after the call's savepoint), in the order
        /// given (`message_ids` are distinct and sorted, so that overlapping batches take
        /// the keys' locks in one order and wait for each other rather than deadlock).
        /// Returns, for each id, whether its marker is new: `false` for one already
        /// there, committed by another transaction that this call waited for. When any
        /// is new, also prepares what [`Sealed::commit`] checks, where
        /// [`Sealed::begin_with_markers`] leaves that to it. The statements stay within
        /// the backend's bind-parameter limit, however long the batch.
        fn insert_markers<'c, C>(
            conn: &'c mut C,
            consumer: &'static str,
            message_ids: Vec<String>,
        ) -> impl Future<Output = QueryResult<Vec<bool>>> + Send + use<'c, Self, C>
        where
            C: AsyncConnection<Backend = Self>;

        /// Begins the transaction and inserts a batch's markers as its first statements,
        /// as BEGIN then [`Sealed::insert_markers`] do, which is how it is done by
        /// default. When any marker is new the transaction stays open with them; when
        /// none is, or on `Err`, the transaction is over.
        fn begin_with_markers<'c, C>(
            conn: &'c mut C,
            consumer: &'static str,
            message_ids: Vec<String>,
        ) -> impl Future<Output = QueryResult<Vec<bool>>> + Send + use<'c, Self, C>
        where
            C: AsyncConnection<Backend = Self>,
        {
            use diesel_async::TransactionManager;

            async move {
                C::TransactionManager::begin_transaction(conn).await?;
                match Self::insert_markers(conn, consumer, message_ids).await {
                    Ok(new) if new.contains(&true) => Ok(new),
                    Ok(new) => C::TransactionManager::rollback_transaction(conn)
                        .await
                        .map(|()| new),
                    Err(error) => Err(super::roll_back_for(conn, error).await),
                }
            }
        }

        /// Commits the transaction the marker was inserted in, after checking that it is
        /// still that transaction: the database may have rolled it back underneath a
        /// handler that carried on past the error (committing then would commit nothing,
        /// and `Processed` would lose the message), or a statement may have committed it
        /// early. On `Err` the transaction is over.
        fn commit<'c, C>(
            conn: &'c mut C,
        ) -> impl Future<Output = QueryResult<()>> + Send + use<'c, Self, C>
        where
            C: AsyncConnection<Backend = Self>;

        /// Rolls back after the body returned `Err`. `Err` is an error that explains the
        /// call better than the body's own: the rollback failed, or the transaction had
        /// already committed underneath the body.
        fn abandon<'c, C>(
            conn: &'c mut C,
        ) -> impl Future<Output = QueryResult<()>> + Send + use<'c, Self, C>
        where
            C: AsyncConnection<Backend = Self>;

        /// The lowest id and one past the highest, read at the primary key's two ends;
        /// `None` for an empty inbox.
        fn prune_bounds<C>(
            conn: &mut C,
        ) -> impl Future<Output = QueryResult<Option<PruneBounds>>> + Send
        where
            C: AsyncConnection<Backend = Self>;

        /// The marker with the lowest id at or above `id`, and whether it was processed
        /// before the `window` (measured back from the database's clock): one seek on
        /// the primary key.
        fn first_marker_from<C>(
            conn: &mut C,
            window_micros: i64,
            id: i64,
        ) -> impl Future<Output = QueryResult<Option<MarkerAge>>> + Send
        where
            C: AsyncConnection<Backend = Self>;

        /// Deletes the completed markers with ids in `from..to` that are older than the
        /// window (never a claim that is not completed), in one statement and so one
        /// short transaction. Concurrent pruners neither deadlock nor count a row twice.
        fn prune_batch<C>(
            conn: &mut C,
            window_micros: i64,
            from: i64,
            to: i64,
        ) -> impl Future<Output = QueryResult<usize>> + Send
        where
            C: AsyncConnection<Backend = Self>;

        /// Creates the inbox table and its unique index where they are missing.
        fn migrate<C>(conn: &mut C) -> impl Future<Output = QueryResult<()>> + Send
        where
            C: AsyncConnection<Backend = Self>;

        /// Replaces an older version's unique index by the current one, while handlers
        /// run: see [`upgrade_unique_index`](crate::upgrade_unique_index). SQLite's index
        /// has not changed.
        fn upgrade_unique_index<C>(
            conn: &mut C,
        ) -> impl Future<Output = QueryResult<crate::schema::IndexUpgrade>> + Send
        where
            C: AsyncConnection<Backend = Self>,
        {
            let _ = conn;
            async { Ok(crate::schema::IndexUpgrade::Current) }
        }

        /// Whether this backend stores `message_id`, an encoded key, byte for byte: a
        /// key it cannot store is refused before anything is written.
        fn check_storable(message_id: &str) -> Result<(), crate::InvalidKey> {
            let _ = message_id;
            Ok(())
        }

        /// What the session finds where the crate's unqualified statements look for the
        /// `inbox` table: the connection's database, or its `search_path`.
        fn inbox_seen<C>(conn: &mut C) -> impl Future<Output = QueryResult<InboxSeen>> + Send
        where
            C: AsyncConnection<Backend = Self>;
    }

    /// What a session finds under the name `inbox`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    #[cfg_attr(
        not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
        allow(dead_code, reason = "only a backend's query finds what a session sees")
    )]
    pub enum InboxSeen {
        /// No table.
        Missing,
        /// A table without the crate's unique index: another table of that name.
        Foreign,
        /// The crate's.
        Ours,
    }

    /// What [`inbox_seen!`] reads.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    #[derive(Debug, diesel::QueryableByName)]
    pub(crate) struct Tables {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        tables: i64,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        indexed: i64,
    }

    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    impl Tables {
        pub(crate) fn seen(&self) -> InboxSeen {
            match (self.tables, self.indexed) {
                (0, _) => InboxSeen::Missing,
                (_, 0) => InboxSeen::Foreign,
                _ => InboxSeen::Ours,
            }
        }
    }
}
