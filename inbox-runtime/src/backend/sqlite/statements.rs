//! SQLite: the inbox's statements, the transaction around them, and pruning.

use std::future::Future;

use diesel::QueryResult;
use diesel::dsl::{exists, not, select};
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error};
use diesel::sql_types::{BigInt, Text};
use diesel::sqlite::Sqlite;
use diesel_async::{AsyncConnection, RunQueryDsl};

use crate::backend::prepared::Prepared;
use crate::backend::queries::{
    InsertMarkers, MARKERS_PER_STATEMENT, chunks, fingerprinted_insert, marker_row, plain_insert,
};
use crate::backend::savepoint::{self, SavepointBackend, savepoint};
use crate::backend::sealed::{self, Marker, MarkerAge, PruneBounds};
use crate::backend::{end_unless_inserted, enter_transaction, processed_or_unfinished};
use crate::schema::inbox;

diesel::table! {
    /// The connection's `PRAGMA read_uncommitted`, as a table-valued function.
    pragma_read_uncommitted (read_uncommitted) {
        read_uncommitted -> Bool,
    }
}

impl sealed::Sealed for Sqlite {
    inbox_seen!(
        "SELECT COUNT(*) AS tables, \
         (SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'inbox' \
         AND name = 'ux_inbox_message_consumer') AS indexed \
         FROM sqlite_master WHERE type = 'table' AND name = 'inbox'"
    );

    /// The key goes in as SQL string literals, which SQLite stores in the database's
    /// encoding, UTF-8 or UTF-16, as it does bound text. (Hex literals cast to `TEXT`
    /// are read as bytes of that encoding: in a UTF-16 file, distinct keys were
    /// stored as one.) A key with a NUL, which no SQL text can carry, is bound
    /// instead, in round trips of its own.
    fn begin_with_marker<'c, C>(
        conn: &'c mut C,
        marker: &Marker,
    ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, C>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let literals = text_literal(&marker.message_id).zip(text_literal(marker.consumer));
        let batch = literals.map(|(message_id, consumer)| {
            let (columns, fingerprint) = match marker.fingerprint.as_deref() {
                None => ("message_id, consumer", String::new()),
                Some(fingerprint) => (
                    "message_id, consumer, fingerprint",
                    format!(", {}", text_literal(fingerprint).expect("hex digits")),
                ),
            };
            // Naming a claim column, which only the crate's inbox has: a plain INSERT
            // into another table called `inbox` without the unique index would insert
            // every time, every redelivery processed again.
            format!(
                "BEGIN; INSERT INTO inbox ({columns}, lease_ends_at) \
                 VALUES ({message_id}, {consumer}{fingerprint}, NULL); SAVEPOINT {}",
                savepoint!(),
            )
        });
        let marker = marker.clone();
        async move {
            enter_transaction(conn)?;
            let (message_id, consumer) = (marker.message_id.clone(), marker.consumer);
            let inserted = match batch {
                Some(batch) => conn.batch_execute(&batch).await.map(|()| true),
                None => insert_bound(conn, marker).await,
            };
            let inserted = match inserted {
                Ok(true) => Ok(true),
                // Only the insert writes to a unique index.
                Ok(false) | Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => {
                    met_processed(conn, vec![message_id], consumer)
                        .await
                        .map(|()| false)
                }
                Err(error) => Err(error),
            };
            end_unless_inserted(conn, inserted).await
        }
    }

    /// In a test transaction, after the call's savepoint.
    fn insert_marker<'c, C>(
        conn: &'c mut C,
        marker: &Marker,
    ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, C>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let marker = marker.clone();
        async move {
            let (message_id, consumer) = (marker.message_id.clone(), marker.consumer);
            let inserted = match marker.fingerprint {
                None => {
                    plain_insert(marker.message_id, consumer)
                        .on_conflict((inbox::message_id, inbox::consumer))
                        .do_nothing()
                        .execute(&mut *conn)
                        .await?
                }
                Some(fingerprint) => {
                    fingerprinted_insert(marker.message_id, consumer, fingerprint)
                        .on_conflict((inbox::message_id, inbox::consumer))
                        .do_nothing()
                        .execute(&mut *conn)
                        .await?
                }
            };
            if inserted == 0 {
                met_processed(conn, vec![message_id], consumer).await?;
                return Ok(false);
            }
            conn.batch_execute(concat!("SAVEPOINT ", savepoint!()))
                .await?;
            Ok(true)
        }
    }

    fn already_processed<'c, C>(
        conn: &'c mut C,
        marker: &Marker,
    ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, C>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // With a shared cache and `PRAGMA read_uncommitted = 1`, a read sees other
        // connections' uncommitted markers. Such a connection never trusts a read and
        // leaves the answer to the transaction.
        // A marker that is a claim claim mode has yet to complete is no duplicate (see
        // `met_processed`); a table of 0.1 has no claim columns, and holds no claims.
        let reads_uncommitted = || {
            pragma_read_uncommitted::table
                .filter(pragma_read_uncommitted::read_uncommitted.eq(true))
        };
        let (message_id, consumer) = (marker.message_id.clone(), marker.consumer);
        async move {
            let processed =
                marker_row(message_id.clone(), consumer).filter(inbox::lease_ends_at.is_null());
            let read = select(exists(processed).and(not(exists(reads_uncommitted()))))
                .get_result(&mut *conn)
                .await;
            match read {
                Err(error) if lacks_claim_columns(&error) => {
                    select(
                        exists(marker_row(message_id, consumer))
                            .and(not(exists(reads_uncommitted()))),
                    )
                    .get_result(conn)
                    .await
                }
                read => read,
            }
        }
    }

    async fn insert_markers<C>(
        conn: &mut C,
        consumer: &'static str,
        message_ids: Vec<String>,
    ) -> QueryResult<Vec<bool>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let mut new = Vec::with_capacity(message_ids.len());
        for chunk in chunks(message_ids, MARKERS_PER_STATEMENT) {
            let insert = InsertMarkers::new(
                chunk.clone(),
                consumer,
                " ON CONFLICT (message_id, consumer) DO NOTHING RETURNING message_id",
            );
            let inserted: Vec<String> = insert.load(&mut *conn).await?;
            let met: Vec<String> = chunk
                .iter()
                .filter(|id| !inserted.contains(id))
                .cloned()
                .collect();
            if !met.is_empty() {
                met_processed(conn, met, consumer).await?;
            }
            new.extend(chunk.iter().map(|id| inserted.contains(id)));
        }
        if new.contains(&true) {
            conn.batch_execute(concat!("SAVEPOINT ", savepoint!()))
                .await?;
        }
        Ok(new)
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
        Prepared(diesel::sql_query(
            "SELECT MIN(id) AS start, MAX(id) + 1 AS end FROM inbox",
        ))
        .get_result::<PruneBounds>(conn)
        .await
        .optional()
    }

    async fn first_marker_from<C>(
        conn: &mut C,
        window_micros: i64,
        id: i64,
    ) -> QueryResult<Option<MarkerAge>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        Prepared(
            diesel::sql_query(
                "SELECT id, processed_at < datetime('now', ?) AS old \
             FROM inbox WHERE id >= ? ORDER BY id LIMIT 1",
            )
            .bind::<Text, _>(seconds_ago(window_micros))
            .bind::<BigInt, _>(id),
        )
        .get_result::<MarkerAge>(conn)
        .await
        .optional()
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
        // SQLite has one writer at a time: concurrent pruners take turns.
        Prepared(
            diesel::sql_query(
                "DELETE FROM inbox WHERE id >= ? AND id < ? \
             AND processed_at < datetime('now', ?) AND lease_ends_at IS NULL",
            )
            .bind::<BigInt, _>(from)
            .bind::<BigInt, _>(to)
            .bind::<Text, _>(seconds_ago(window_micros)),
        )
        .execute(conn)
        .await
    }

    async fn migrate<C>(conn: &mut C) -> QueryResult<()>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // The upgrade below opens a transaction of its own, which SQLite cannot nest,
        // and its ROLLBACK would end the caller's: refused at once, as on MySQL.
        crate::backend::outside_a_transaction(conn)?;
        match Self::inbox_seen(conn).await? {
            sealed::InboxSeen::Foreign => return Err(crate::backend::foreign_inbox()),
            // The table and its index in one transaction, so that a concurrent migrate
            // never finds the table without its index, which it would take for another's.
            sealed::InboxSeen::Missing => {
                let create = include_str!(
                    "../../../migrations/sqlite/2026-11-30-000000_create_inbox/up.sql"
                );
                in_one_transaction(conn, create).await?;
            }
            sealed::InboxSeen::Ours => {}
        }
        // The upgrade to 0.2's columns, where they are missing: SQLite has no
        // `ADD COLUMN IF NOT EXISTS`, so all four go in one transaction, and a
        // concurrent upgrader's "duplicate column name" is success for us once the
        // columns are counted again.
        if claim_columns_exist(conn).await? {
            return Ok(());
        }
        let add_columns =
            include_str!("../../../migrations/sqlite/2026-12-01-000000_claims/up.sql");
        match in_one_transaction(conn, add_columns).await {
            Err(_) if claim_columns_exist(conn).await? => Ok(()),
            result => result,
        }
    }
}

/// `statements` in a transaction that takes the write lock at once.
async fn in_one_transaction<C>(conn: &mut C, statements: &str) -> QueryResult<()>
where
    C: AsyncConnection<Backend = Sqlite>,
{
    let result = conn
        .batch_execute(&format!("BEGIN IMMEDIATE; {statements} COMMIT;"))
        .await;
    if result.is_err() {
        // A failed statement leaves the batch's transaction open.
        let _none_left_open = conn.batch_execute("ROLLBACK").await;
    }
    result
}

/// `text` as an SQL string literal; `None` for a text with a NUL, which no SQL text
/// can carry.
fn text_literal(text: &str) -> Option<String> {
    (!text.contains('\0')).then(|| format!("'{}'", text.replace('\'', "''")))
}

/// `BEGIN`, the marker insert with its text bound, and the savepoint, each a round
/// trip of its own: for a key that no SQL text can carry.
/// Checks that the markers that inserts of `message_ids` met are processed: one that is
/// a claim claim mode has yet to complete is
/// [`ClaimError::Unfinished`](crate::ClaimError::Unfinished) (see
/// `processed_or_unfinished`).
async fn met_processed<C>(
    conn: &mut C,
    message_ids: Vec<String>,
    consumer: &'static str,
) -> QueryResult<()>
where
    C: AsyncConnection<Backend = Sqlite>,
{
    let unfinished = inbox::table
        .filter(inbox::consumer.eq(consumer))
        .filter(inbox::message_id.eq_any(message_ids))
        .filter(inbox::lease_ends_at.is_not_null())
        .count()
        .get_result::<i64>(conn)
        .await;
    match unfinished {
        Ok(0) => Ok(()),
        Ok(_) => processed_or_unfinished(false),
        // A table of 0.1, which `migrate` has not reached, holds no claims.
        Err(error) if lacks_claim_columns(&error) => Ok(()),
        Err(error) => Err(error),
    }
}

/// Whether `error` says the inbox has no claim columns: a table of 0.1, which `migrate`
/// has not reached yet while handlers of this version run against it.
fn lacks_claim_columns(error: &Error) -> bool {
    matches!(error, Error::DatabaseError(_, info) if super::lacks_claim_columns(info.message()))
}

/// The insert of a key that no SQL text can carry, bound: whether the marker is new. Its
/// conflict target is the crate's unique index, which another table called `inbox`
/// lacks.
async fn insert_bound<C>(conn: &mut C, marker: Marker) -> QueryResult<bool>
where
    C: AsyncConnection<Backend = Sqlite>,
{
    conn.batch_execute("BEGIN").await?;
    let inserted = match marker.fingerprint {
        None => {
            plain_insert(marker.message_id, marker.consumer)
                .on_conflict((inbox::message_id, inbox::consumer))
                .do_nothing()
                .execute(&mut *conn)
                .await?
        }
        Some(fingerprint) => {
            fingerprinted_insert(marker.message_id, marker.consumer, fingerprint)
                .on_conflict((inbox::message_id, inbox::consumer))
                .do_nothing()
                .execute(&mut *conn)
                .await?
        }
    };
    if inserted == 0 {
        return Ok(false);
    }
    conn.batch_execute(concat!("SAVEPOINT ", savepoint!()))
        .await
        .map(|()| true)
}

impl SavepointBackend for Sqlite {
    fn release_and_commit<'c, C>(
        conn: &'c mut C,
    ) -> impl Future<Output = QueryResult<()>> + Send + use<'c, C>
    where
        C: AsyncConnection<Backend = Self>,
    {
        conn.batch_execute(concat!("RELEASE SAVEPOINT ", savepoint!(), "; COMMIT"))
    }

    const RELEASE_AND_ROLLBACK: &'static str =
        concat!("RELEASE SAVEPOINT ", savepoint!(), "; ROLLBACK");
    const ROLLBACK_AND_RESTORE: &'static str = "ROLLBACK";

    /// The marker insert changes nothing in the session.
    fn restore_session<'c, C>(
        _conn: &'c mut C,
    ) -> impl Future<Output = QueryResult<()>> + Send + use<'c, C>
    where
        C: AsyncConnection<Backend = Self>,
    {
        std::future::ready(Ok(()))
    }

    fn own_marker_committed<'c, C>(
        _conn: &'c mut C,
    ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, C>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // SQLite commits only when told to: no statement commits implicitly, so a
        // transaction that ended underneath the body was rolled back.
        std::future::ready(Ok(false))
    }
}

async fn claim_columns_exist<C>(conn: &mut C) -> QueryResult<bool>
where
    C: AsyncConnection<Backend = Sqlite>,
{
    diesel::select(diesel::dsl::sql::<diesel::sql_types::Bool>(
        "(SELECT COUNT(*) FROM pragma_table_info('inbox') \
         WHERE name IN ('lease_ends_at', 'claim_token', 'attempts', 'fingerprint')) = 4",
    ))
    .get_result(conn)
    .await
}

/// The `datetime()` modifier that goes back `micros`. SQLite's `processed_at` holds
/// whole seconds, so the window is compared to the second.
fn seconds_ago(micros: i64) -> String {
    format!("-{}.{:06} seconds", micros / 1_000_000, micros % 1_000_000)
}
