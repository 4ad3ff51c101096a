//! MySQL and MariaDB: the inbox's statements, the transaction around them, and pruning.

use std::future::Future;

use diesel::OptionalExtension as _;
use diesel::QueryDsl as _;
use diesel::QueryResult;
use diesel::mysql::Mysql;
use diesel::result::{DatabaseErrorKind, Error};
use diesel::sql_types::{BigInt, Bool, Text};
use diesel_async::{AsyncConnection, RunQueryDsl};

use crate::backend::prepared::Prepared;
use crate::backend::queries::{InsertMarkers, MARKERS_PER_STATEMENT, chunks, hex_digits};
use crate::backend::savepoint::{self, SavepointBackend, lost_marker, savepoint};
use crate::backend::sealed::{self, Marker, MarkerAge, PruneBounds};
use crate::backend::{
    InFlight, end_unless_inserted, enter_transaction, outside_a_transaction,
    processed_or_unfinished,
};
use crate::schema::INDEX_NAME;

use super::call::{Call, committed};
use super::ddl;
use super::markers::{self, bytes_of_placeholder};
use super::{CHECKED_INSERT, MARKER_INSERT, OWN_COLUMN};

/// Opens a call's transaction with the savepoint that the commit releases, ahead of
/// the marker insert, so that the savepoint can only name the marker's transaction.
/// On a Galera node another node's commit can abort the transaction from outside, and
/// an abort that lands inside a multi-statement batch on a statement that takes no
/// row locks is reported as a warning: the rest of the batch runs in a new
/// transaction. Set after the marker, the savepoint could name that new transaction,
/// which the body's writes would then join and the COMMIT commit without the marker;
/// measured on a three-node cluster, that credited a message twice. Set before it,
/// the savepoint is gone from every transaction that lacks the marker.
///
/// `START TRANSACTION` rather than `BEGIN`, which MariaDB's `sql_mode = ORACLE` reads
/// as the start of a PL/SQL block.
const BEGIN_WITH_SAVEPOINT: &str = concat!("START TRANSACTION; SAVEPOINT ", savepoint!());

/// [`BEGIN_WITH_SAVEPOINT`] for a batch of markers, with [`session_for_the_body!`] ahead
/// of the inserts (see [`Sealed::begin_with_markers`]).
const BEGIN_BATCH: &str = concat!(
    "START TRANSACTION; SAVEPOINT ",
    savepoint!(),
    "; SET ",
    session_for_the_body!()
);

/// Records the id of a batch's marker that the last insert to insert a row, which
/// succeeded, gave it.
const RECORD_MARKER_ID: &str = concat!("SET ", marker_id!(), " = LAST_INSERT_ID()");

/// Right after the marker insert, in its round trip: records the marker's id for the
/// check after the COMMIT and for [`SavepointBackend::own_marker_committed`], then
/// [`session_for_the_body!`].
const AFTER_MARKER_INSERT: &str = concat!(
    "SET ",
    marker_id!(),
    " = LAST_INSERT_ID(), ",
    session_for_the_body!()
);

impl sealed::Sealed for Mysql {
    inbox_seen!(format!(
        "SELECT CAST(COUNT(*) AS SIGNED) AS tables, CAST({} AS SIGNED) AS indexed \
         FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'inbox' \
         LIMIT 1",
        inbox_index_is_there()
    ));

    fn already_processed<'c, C>(
        conn: &'c mut C,
        marker: &Marker,
    ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, C>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let marker = marker.clone();
        async move {
            let call = Call::start(conn)?;
            let read = markers::committed_marker(conn, &marker.message_id, marker.consumer).await;
            // With autocommit off the read opened a transaction, which would keep its
            // shared lock on the marker while the connection idles, holding up a prune.
            // (A BEGIN of the handler's would have committed it, as it commits whatever
            // such a session left open.)
            match read {
                Ok(read) if read.opened_transaction => {
                    call.committed(conn, Ok(read.processed == Some(true))).await
                }
                read => call.answered(conn, read.map(|read| read.processed == Some(true))),
            }
        }
    }

    /// [`BEGIN_WITH_SAVEPOINT`], the marker insert and [`AFTER_MARKER_INSERT`] as one
    /// text batch, so that a new message costs the round trips of a bare transaction.
    /// The key goes in as hex literals, which the `VARBINARY` columns store byte for
    /// byte, as they do a bound parameter. The server stops a batch at its first
    /// error: a duplicate's 1062 leaves the transaction open, autocommit untouched.
    fn begin_with_marker<'c, C>(
        conn: &'c mut C,
        marker: &Marker,
    ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, C>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let (columns, fingerprint) = match &marker.fingerprint {
            None => ("message_id, consumer", String::new()),
            Some(fingerprint) => (
                "message_id, consumer, fingerprint",
                format!(", X'{}'", hex_digits(fingerprint)),
            ),
        };
        let batch = format!(
            "{BEGIN_WITH_SAVEPOINT}; {CHECKED_INSERT} INTO inbox ({columns}, {OWN_COLUMN}) \
             VALUES (X'{}', X'{}'{fingerprint}, DEFAULT); {AFTER_MARKER_INSERT}",
            hex_digits(&marker.message_id),
            hex_digits(marker.consumer),
        );
        let (message_id, consumer) = (marker.message_id.clone(), marker.consumer);
        async move {
            enter_transaction(conn)?;
            match conn.batch_execute(&batch).await {
                Ok(()) => Ok(true),
                // Only the insert writes to a unique index, and the batch stops there.
                Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => {
                    let met = markers::confirm_duplicate(conn, &message_id, consumer)
                        .await
                        .and_then(processed_or_unfinished);
                    end_unless_inserted(conn, met.map(|()| false)).await
                }
                // A Galera abort can turn the last statement's success into 1213 after
                // it turned autocommit off: restoring is harmless where it did not.
                Err(error) => Err(savepoint::roll_back_and_restore(conn, error).await),
            }
        }
    }

    /// In a test transaction, after the call's savepoint: a prepared insert, and
    /// nothing more. Autocommit stays as it is: the test transaction never commits,
    /// and turning autocommit back on later would commit it.
    fn insert_marker<'c, C>(
        conn: &'c mut C,
        marker: &Marker,
    ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, C>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let message_id = marker.message_id.clone();
        let consumer = marker.consumer;
        let fingerprint = marker.fingerprint.clone();
        async move {
            let inserted = match fingerprint {
                None => {
                    InsertMarkers::hex(
                        std::slice::from_ref(&message_id),
                        consumer,
                        &MARKER_INSERT,
                        "",
                    )
                    .execute(&mut *conn)
                    .await
                }
                Some(fingerprint) => {
                    Prepared(
                        diesel::sql_query(concat!(
                            // `key_digest`, the `OWN_COLUMN`, with its `DEFAULT`.
                            checked_insert!(),
                            " INTO inbox (message_id, consumer, fingerprint, key_digest) \
                             VALUES (",
                            bytes_of_placeholder!(),
                            ", ",
                            bytes_of_placeholder!(),
                            ", ",
                            bytes_of_placeholder!(),
                            ", DEFAULT)"
                        ))
                        .bind::<Text, _>(hex_digits(&message_id))
                        .bind::<Text, _>(hex_digits(consumer))
                        .bind::<Text, _>(hex_digits(&fingerprint)),
                    )
                    .execute(&mut *conn)
                    .await
                }
            };
            markers::new_or_processed(conn, inserted, &message_id, consumer).await
        }
    }

    /// In a test transaction, as [`Sealed::insert_marker`] there: the inserts alone.
    async fn insert_markers<C>(
        conn: &mut C,
        consumer: &'static str,
        message_ids: Vec<String>,
    ) -> QueryResult<Vec<bool>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let (new, _own_id) = insert_batch_markers(conn, consumer, message_ids).await?;
        Ok(new)
    }

    /// [`BEGIN_BATCH`], then the inserts, then the id of one of this transaction's own
    /// markers (see [`insert_batch_markers`]).
    ///
    /// Autocommit goes off before the first insert, not after the last as for one marker:
    /// on a Galera node another node's commit can end the transaction between two of the
    /// inserts without an error reaching this call (seen on a three-node cluster: after
    /// a duplicate's 1062, the statements that followed ran outside any transaction).
    /// The statements after such an end open a new transaction, which never commits:
    /// its `RELEASE SAVEPOINT` fails.
    /// With autocommit on, each would have committed on its own, a marker insert
    /// included. And the id is that of a marker the call inserted, not read back by key:
    /// read back, it was another delivery's marker, committed on another node once this
    /// transaction had ended, which then passed for this call's committed marker.
    async fn begin_with_markers<C>(
        conn: &mut C,
        consumer: &'static str,
        message_ids: Vec<String>,
    ) -> QueryResult<Vec<bool>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        enter_transaction(conn)?;
        if let Err(error) = conn.batch_execute(BEGIN_BATCH).await {
            return Err(savepoint::roll_back_and_restore(conn, error).await);
        }
        let new = match insert_batch_markers(conn, consumer, message_ids).await {
            Ok((new, OwnId::InLastInsertId)) => {
                conn.batch_execute(RECORD_MARKER_ID).await.map(|()| new)
            }
            Ok((new, OwnId::Recorded | OwnId::None)) => Ok(new),
            Err(error) => Err(error),
        };
        match new {
            Ok(new) if new.contains(&true) => Ok(new),
            Ok(new) => savepoint::roll_back_with_restore(conn).await.map(|()| new),
            Err(error) => Err(savepoint::roll_back_and_restore(conn, error).await),
        }
    }

    fn commit<'c, C>(conn: &'c mut C) -> impl Future<Output = QueryResult<()>> + Send + use<'c, C>
    where
        C: AsyncConnection<Backend = Self>,
    {
        savepoint::commit(conn)
    }

    fn abandon<'c, C>(conn: &'c mut C) -> impl Future<Output = QueryResult<()>> + Send + use<'c, C>
    where
        C: AsyncConnection<Backend = Self>,
    {
        savepoint::abandon(conn)
    }

    async fn prune_bounds<C>(conn: &mut C) -> QueryResult<Option<PruneBounds>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // Each of a prune's statements commits what it opened where autocommit is off:
        // a DELETE's locks left held would stop every handler's marker insert, and a
        // read's hold on the table any change of it.
        let bounds = Prepared(diesel::sql_query(
            "SELECT MIN(id) AS start, MAX(id) + 1 AS end FROM inbox LIMIT 1",
        ))
        .get_result::<PruneBounds>(conn)
        .await
        .optional();
        committed(conn, bounds).await
    }

    async fn first_marker_from<C>(
        conn: &mut C,
        window_micros: i64,
        id: i64,
    ) -> QueryResult<Option<MarkerAge>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let first = Prepared(
            diesel::sql_query(
                "SELECT id, processed_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND AS old \
             FROM inbox WHERE id >= ? ORDER BY id LIMIT 1",
            )
            .bind::<BigInt, _>(window_micros)
            .bind::<BigInt, _>(id),
        )
        .get_result::<MarkerAge>(conn)
        .await
        .optional();
        committed(conn, first).await
    }

    async fn prune_batch<C>(
        conn: &mut C,
        window_micros: i64,
        from: i64,
        to: i64,
    ) -> QueryResult<usize>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // A range of the primary key: concurrent pruners lock it in the same order,
        // so one waits for another instead of deadlocking, then finds those rows gone.
        let deleted = Prepared(
            diesel::sql_query(
                "DELETE FROM inbox WHERE id >= ? AND id < ? \
             AND processed_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
             AND lease_ends_at IS NULL",
            )
            .bind::<BigInt, _>(from)
            .bind::<BigInt, _>(to)
            .bind::<BigInt, _>(window_micros),
        )
        .execute(&mut *conn)
        .await;
        committed(conn, deleted).await
    }

    async fn migrate<C>(conn: &mut C) -> QueryResult<()>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // Each statement its own transaction, the connection marked for the whole
        // call: one dropped midway leaves a statement's answer in flight, which the
        // connection's next statement would read as its own, or the session's
        // `lock_wait_timeout` at a second (`ddl::with_short_lock_waits`).
        outside_a_transaction(conn)?;
        let in_flight = InFlight::mark(conn)?;
        let migrated = migrate_marked(conn).await;
        in_flight.answered(conn);
        migrated
    }

    async fn upgrade_unique_index<C>(conn: &mut C) -> QueryResult<crate::schema::IndexUpgrade>
    where
        C: AsyncConnection<Backend = Self>,
    {
        super::upgrade::upgrade_unique_index(conn).await
    }
}

/// [`Sealed::migrate`](sealed::Sealed::migrate), on a connection marked for its call.
async fn migrate_marked<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend = diesel::mysql::Mysql>,
{
    // CREATE TABLE IF NOT EXISTS is atomic DDL, safe to race; sent only where the
    // table is missing, since it needs the right to create even where the table is
    // there, which an application's user may lack.
    if !tables_exist(conn, &["inbox"]).await? {
        conn.batch_execute(include_str!(
            "../../../migrations/mysql/2026-11-30-000000_create_inbox/up.sql"
        ))
        .await?;
    }
    // The table comes with its index, in one atomic statement: a table without it is
    // another of that name.
    if !inbox_index_exists(conn).await? {
        return Err(crate::backend::foreign_inbox());
    }
    if !inbox_is_transactional(conn).await? {
        return Err(diesel::result::Error::QueryBuilderError(
            "the `inbox` table is not on InnoDB: its markers would commit on their own, \
             apart from the handlers' transactions, and the redelivery of a message whose \
             body failed would be acknowledged as a duplicate, unprocessed. Convert it \
             back: ALTER TABLE inbox ENGINE = InnoDB"
                .into(),
        ));
    }
    // The upgrade to 0.2's columns, where they are missing. One `ALTER TABLE`
    // adds all four or none; a concurrent upgrader's 1060 "Duplicate column
    // name" is success for us, so the columns are counted again.
    if !claim_columns_exist(conn).await? {
        let add_columns = include_str!("../../../migrations/mysql/2026-12-01-000000_claims/up.sql");
        match ddl::with_short_lock_waits(conn, add_columns).await {
            Err(_) if claim_columns_exist(conn).await? => {}
            result => result?,
        }
    }
    super::upgrade::migrate_key_digest(conn).await?;
    // Markers stamped in UTC, where the default is still the session's local time:
    // an `ALTER TABLE`, even one with nothing to do, waits for every open
    // transaction on the table. Two instances setting it at once set the same.
    if !stamped_in_utc(conn).await? {
        let stamp_in_utc =
            include_str!("../../../migrations/mysql/2026-12-07-000000_utc_clock/up.sql");
        ddl::with_short_lock_waits(conn, stamp_in_utc).await?;
    }
    Ok(())
}

/// The COMMIT went through, but preparing what follows it failed (the server's
/// `max_prepared_stmt_count` reached, say), so nothing confirmed that the COMMIT ended
/// this call's transaction. Transient: a redelivery finds out by the marker, and is a
/// duplicate where it did.
fn commit_unconfirmed(error: &Error) -> Error {
    Error::DatabaseError(
        DatabaseErrorKind::SerializationFailure,
        Box::new(format!(
            "the handler's COMMIT went through, but the statement after it failed \
             ({error}), so whether it committed this call's transaction is not \
             confirmed; a redelivery settles it by the marker"
        )),
    )
}

/// Whether this call's marker row, by the id its insert recorded, is visible.
macro_rules! own_marker_exists {
    () => {
        concat!("EXISTS (SELECT 1 FROM inbox WHERE id = ", marker_id!(), ")")
    };
}

/// Whether the server replicates through wsrep (a Galera node), where a transaction
/// can end without an error. MariaDB shows `wsrep_on` in `SYSTEM_VARIABLES` when it
/// was built with wsrep (its Windows builds are not) and runs the `/*M! */` comment;
/// every other server reads `TRUE`, so that MySQL with a wsrep patch (Percona XtraDB
/// Cluster) is checked too.
macro_rules! replicates_through_wsrep {
    () => {
        "/*M! (SELECT COUNT(*) FROM information_schema.SYSTEM_VARIABLES \
         WHERE VARIABLE_NAME = 'WSREP_ON' AND 'ON' IN (GLOBAL_VALUE, SESSION_VALUE)) > 0 \
         OR NOT */ TRUE"
    };
}

/// Prepares [`after_commit!`] for this connection, then runs it: where a transaction
/// can end without an error, a check that this call's marker row is committed, in
/// the statement that restores autocommit; elsewhere only the restore.
///
/// The check: the released savepoint proves that the transaction was this call's up
/// to the COMMIT, not that the COMMIT ended it. On a Galera node, an abort landing on
/// `RELEASE SAVEPOINT` is reported as a warning (see [`BEGIN_WITH_SAVEPOINT`]), and
/// the COMMIT after it ends an empty transaction. Set to itself, `sql_mode` is
/// unchanged; set to the text, it fails with 1231, whose message quotes the text in
/// every server language, and a SET that fails makes none of its assignments.
///
/// A prepared statement runs in the database that was current when it was prepared,
/// `inbox` and `DATABASE()` included, so the check compares that database with the
/// one the marker went into ([`session_for_the_body!`] records it); on a connection
/// that has changed databases since, it fails quoting [`after_commit!`], as a
/// statement not prepared yet does, and is prepared again.
const PREPARE_AND_RUN_AFTER_COMMIT: &str = concat!(
    "SET ",
    after_commit_text!(),
    " = IF(",
    replicates_through_wsrep!(),
    ", CONCAT('SET sql_mode = IF(",
    database!(),
    " <=> ', QUOTE(DATABASE()), ', IF(",
    own_marker_exists!(),
    ", @@sql_mode, ''",
    lost_marker!(),
    "''), ''",
    after_commit!(),
    "''), ",
    autocommit_restored!(),
    "'), '",
    restore_autocommit!(),
    "'); PREPARE ",
    after_commit_statement!(),
    " FROM ",
    after_commit_text!(),
    "; SET ",
    after_commit_text!(),
    " = NULL; EXECUTE ",
    after_commit_statement!()
);

impl SavepointBackend for Mysql {
    async fn release_and_commit<C>(conn: &mut C) -> QueryResult<()>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let batch = concat!(
            "RELEASE SAVEPOINT ",
            savepoint!(),
            "; COMMIT; EXECUTE ",
            after_commit_statement!()
        );
        match conn.batch_execute(batch).await {
            // Not prepared on this connection yet (its first commit, or the session was
            // reset), or for another database: the RELEASE and the COMMIT went through.
            Err(error) if savepoint::quotes(&error, after_commit!()) => {
                match conn.batch_execute(PREPARE_AND_RUN_AFTER_COMMIT).await {
                    Err(error) if !savepoint::quotes(&error, lost_marker!()) => {
                        Err(commit_unconfirmed(&error))
                    }
                    result => result,
                }
            }
            result => result,
        }
    }
    const RELEASE_AND_ROLLBACK: &'static str = concat!(
        "RELEASE SAVEPOINT ",
        savepoint!(),
        "; ROLLBACK; ",
        restore_autocommit!()
    );
    const ROLLBACK_AND_RESTORE: &'static str = concat!("ROLLBACK; ", restore_autocommit!());

    fn restore_session<'c, C>(
        conn: &'c mut C,
    ) -> impl Future<Output = QueryResult<()>> + Send + use<'c, C>
    where
        C: AsyncConnection<Backend = Self>,
    {
        conn.batch_execute(restore_autocommit!())
    }

    fn own_marker_committed<'c, C>(
        conn: &'c mut C,
    ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, C>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // Rare: only after the transaction ended underneath the body.
        diesel::select(diesel::dsl::sql::<Bool>(own_marker_exists!()))
            .limit(1)
            .get_result(conn)
    }
}

/// Where the id of one of this transaction's own markers is, once an insert succeeded.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OwnId {
    /// No marker is new.
    None,
    /// `LAST_INSERT_ID()`, set by the last insert that inserted a row, which succeeded.
    InLastInsertId,
    /// [`marker_id!`], recorded before an insert that could overwrite `LAST_INSERT_ID()`.
    Recorded,
}

/// Inserts a batch's markers, returning for each whether it is new, and where the id of
/// a new one is.
///
/// MySQL has no `INSERT … RETURNING`, and `ON DUPLICATE KEY UPDATE` reports no row of
/// its own (see the module's docs). A plain multi-row INSERT either inserts every
/// marker of the statement or, on a duplicate, none: InnoDB undoes the statement and
/// the transaction goes on. Only a statement that met a duplicate is repeated, one
/// marker per statement, which tells each marker's fate. Each statement takes the keys
/// in ascending order, so overlapping batches wait for each other instead of
/// deadlocking.
///
/// `LAST_INSERT_ID()` is the first id a statement inserted, even when the statement
/// then met a duplicate and was undone (a one-row insert that fails inserts nothing and
/// leaves it as it was). So before a multi-row insert that follows a successful one,
/// the id of that success is recorded: one round trip more per 64 markers, in batches
/// longer than that.
async fn insert_batch_markers<C>(
    conn: &mut C,
    consumer: &'static str,
    message_ids: Vec<String>,
) -> QueryResult<(Vec<bool>, OwnId)>
where
    C: AsyncConnection<Backend = Mysql>,
{
    let mut new = Vec::with_capacity(message_ids.len());
    let mut own_id = OwnId::None;
    for chunk in chunks(message_ids, MARKERS_PER_STATEMENT) {
        if own_id == OwnId::InLastInsertId {
            conn.batch_execute(RECORD_MARKER_ID).await?;
            own_id = OwnId::Recorded;
        }
        let insert = InsertMarkers::hex(&chunk, consumer, &MARKER_INSERT, "");
        match insert.execute(&mut *conn).await {
            Ok(_) => {
                new.resize(new.len() + chunk.len(), true);
                own_id = OwnId::InLastInsertId;
                continue;
            }
            Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => {}
            Err(other) => return Err(other),
        }
        for message_id in chunk {
            let insert = InsertMarkers::hex(
                std::slice::from_ref(&message_id),
                consumer,
                &MARKER_INSERT,
                "",
            )
            .execute(&mut *conn)
            .await;
            let inserted = markers::new_or_processed(conn, insert, &message_id, consumer).await?;
            if inserted {
                own_id = OwnId::InLastInsertId;
            }
            new.push(inserted);
        }
    }
    Ok((new, own_id))
}

async fn claim_columns_exist<C>(conn: &mut C) -> QueryResult<bool>
where
    C: AsyncConnection<Backend = diesel::mysql::Mysql>,
{
    diesel::select(diesel::dsl::sql::<diesel::sql_types::Bool>(
        "(SELECT COUNT(*) FROM information_schema.columns \
         WHERE table_schema = DATABASE() AND table_name = 'inbox' \
         AND column_name IN ('lease_ends_at', 'claim_token', 'attempts', 'fingerprint')) = 4",
    ))
    .limit(1)
    .get_result(conn)
    .await
}

/// Whether the database holds each of `tables`.
pub(super) async fn tables_exist<C>(conn: &mut C, tables: &[&str]) -> QueryResult<bool>
where
    C: AsyncConnection<Backend = diesel::mysql::Mysql>,
{
    let names = tables
        .iter()
        .map(|table| format!("'{table}'"))
        .collect::<Vec<_>>()
        .join(", ");
    diesel::select(diesel::dsl::sql::<diesel::sql_types::Bool>(&format!(
        "(SELECT COUNT(*) FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND table_name IN ({names})) = {}",
        tables.len()
    )))
    .limit(1)
    .get_result(conn)
    .await
}

/// Whether the inbox is on InnoDB, whose rows commit with the transaction that wrote
/// them: a DBA may have converted it (to MyISAM, say), which commits each row at once.
async fn inbox_is_transactional<C>(conn: &mut C) -> QueryResult<bool>
where
    C: AsyncConnection<Backend = diesel::mysql::Mysql>,
{
    diesel::select(diesel::dsl::sql::<diesel::sql_types::Bool>(
        "(SELECT UPPER(engine) = 'INNODB' FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND table_name = 'inbox')",
    ))
    .limit(1)
    .get_result(conn)
    .await
}

/// Whether the inbox stamps a marker's `processed_at` in UTC by default.
async fn stamped_in_utc<C>(conn: &mut C) -> QueryResult<bool>
where
    C: AsyncConnection<Backend = diesel::mysql::Mysql>,
{
    // MariaDB shows the default as `utc_timestamp(6)`, MySQL as `utc_timestamp(6)`
    // too, marked DEFAULT_GENERATED.
    diesel::select(diesel::dsl::sql::<diesel::sql_types::Bool>(
        "EXISTS (SELECT 1 FROM information_schema.columns \
         WHERE table_schema = DATABASE() AND table_name = 'inbox' \
         AND column_name = 'processed_at' \
         AND LOWER(column_default) LIKE 'utc_timestamp%')",
    ))
    .limit(1)
    .get_result(conn)
    .await
}

async fn inbox_index_exists<C>(conn: &mut C) -> QueryResult<bool>
where
    C: AsyncConnection<Backend = diesel::mysql::Mysql>,
{
    let query = inbox_index_is_there();
    diesel::select(diesel::dsl::sql::<diesel::sql_types::Bool>(&query))
        .limit(1)
        .get_result(conn)
        .await
}

/// Whether the database's `inbox` has the crate's unique index, as an SQL condition.
fn inbox_index_is_there() -> String {
    format!(
        "EXISTS (SELECT 1 FROM information_schema.statistics \
         WHERE table_schema = DATABASE() AND table_name = 'inbox' \
         AND index_name = '{INDEX_NAME}' AND non_unique = 0)"
    )
}

#[cfg(test)]
mod tests {
    use diesel::result::Error;

    use crate::backend::savepoint::{lost_marker, savepoint};

    /// Its text alone says to retry, where a wrapper hides the diesel error.
    #[test]
    fn an_unconfirmed_commit_is_retried_by_its_text_too() {
        let said = super::commit_unconfirmed(&Error::NotFound).to_string();
        assert_eq!(
            crate::classify::classify_text(&said),
            Some(crate::ErrorClass::Transient),
            "{said}"
        );
    }

    /// A missing prepared statement is told by the name its error quotes, so that
    /// name and the texts of the other errors hold none of each other.
    #[test]
    fn the_after_commit_statement_is_not_taken_for_another_error() {
        for other in [savepoint!(), lost_marker!()] {
            assert!(!after_commit!().contains(other));
            assert!(!other.contains(after_commit!()));
        }
    }
}
