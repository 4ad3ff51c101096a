//! PostgreSQL: the inbox's statements, the transaction around them, and pruning.

use std::future::Future;

use diesel::OptionalExtension as _;
use diesel::QueryResult;
use diesel::result::{DatabaseErrorKind, Error};
use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncConnection, RunQueryDsl, TransactionManager};

use super::markers::{self, Behind};
use super::{MIGRATE_LOCK, is_aborted_transaction};
use super::{catalog, ddl};
use crate::backend::prepared::Prepared;
use crate::backend::sealed::{self, Marker, MarkerAge, PruneBounds};
use crate::backend::{
    end_unless_inserted, enter_transaction, leave_transaction, roll_back_for,
    rolled_back_underneath,
};

impl sealed::Sealed for diesel::pg::Pg {
    fn insert_marker<'c, C>(
        conn: &'c mut C,
        marker: &Marker,
    ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, C>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let marker = marker.clone();
        async move { markers::insert_marker(conn, markers::marker(&marker, Behind::Begun)).await }
    }

    inbox_seen!(
        "SELECT CAST(COUNT(to_regclass('inbox')) AS BIGINT) AS tables, \
         (SELECT COUNT(*) FROM pg_catalog.pg_index AS i \
         JOIN pg_catalog.pg_class AS c ON c.oid = i.indexrelid \
         WHERE i.indrelid = to_regclass('inbox') AND i.indisunique \
         AND c.relname = 'ux_inbox_message_consumer') AS indexed"
    );

    /// `text` holds no NUL: the server rejects it mid-statement, which in a batch
    /// would sink every message with no way to tell which one was at fault.
    fn check_storable(message_id: &str) -> Result<(), crate::InvalidKey> {
        match message_id.find('\0') {
            Some(at) => Err(crate::InvalidKey::Nul { at }),
            None => Ok(()),
        }
    }

    /// BEGIN, counted by the transaction manager before it is sent, then the insert.
    fn begin_with_marker<'c, C>(
        conn: &'c mut C,
        marker: &Marker,
    ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, C>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let marker = marker.clone();
        async move {
            begin(conn).await?;
            let inserted = Self::insert_marker(conn, &marker).await;
            end_unless_inserted(conn, inserted).await
        }
    }

    /// As [`Sealed::begin_with_marker`] opens it.
    async fn begin_with_markers<C>(
        conn: &mut C,
        consumer: &'static str,
        message_ids: Vec<String>,
    ) -> QueryResult<Vec<bool>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        begin(conn).await?;
        match Self::insert_markers(conn, consumer, message_ids).await {
            Ok(new) if new.contains(&true) => Ok(new),
            Ok(new) => C::TransactionManager::rollback_transaction(conn)
                .await
                .map(|()| new),
            Err(error) => Err(roll_back_for(conn, error).await),
        }
    }

    /// The key goes in as UTF-8 bytes, which no `client_encoding` converts, so that
    /// the read finds exactly the marker the transaction stores.
    fn already_processed<'c, C>(
        conn: &'c mut C,
        marker: &Marker,
    ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, C>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // PostgreSQL never reads uncommitted rows, at any isolation level.
        let marker = marker.clone();
        async move {
            let processed =
                markers::marker_processed(conn, &marker.message_id, marker.consumer).await?;
            Ok(processed == Some(true))
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
        let insert = markers::markers(consumer, &message_ids, Behind::Begun);
        markers::insert_markers(conn, insert, &message_ids).await
    }

    fn abandon<'c, C>(conn: &'c mut C) -> impl Future<Output = QueryResult<()>> + Send + use<'c, C>
    where
        C: AsyncConnection<Backend = Self>,
    {
        C::TransactionManager::rollback_transaction(conn)
    }

    async fn commit<C>(conn: &mut C) -> QueryResult<()>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // After an error the handler did not propagate, the transaction is aborted
        // and PostgreSQL answers COMMIT with a silent ROLLBACK. `SELECT 1` fails
        // there instead (25P02), and the rest of a simple query is then skipped.
        // Sent with COMMIT it costs no round trip of its own, which a separate
        // statement would: 8% of throughput (inbox-bench/BENCHMARKS.md).
        match conn.batch_execute("SELECT 1; COMMIT").await {
            Ok(()) => leave_transaction(conn),
            Err(error) if is_aborted(&error) => {
                Err(roll_back_for(conn, rolled_back_underneath()).await)
            }
            Err(error) => Err(roll_back_for(conn, error).await),
        }
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
                "SELECT id, processed_at < now() - $1 * INTERVAL '1 microsecond' AS old \
             FROM inbox WHERE id >= $2 ORDER BY id LIMIT 1",
            )
            .bind::<BigInt, _>(window_micros)
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
        // SKIP LOCKED: concurrent pruners take disjoint rows instead of waiting for
        // each other's, which they would then find deleted.
        Prepared(
            diesel::sql_query(
                "DELETE FROM inbox WHERE id IN (\
             SELECT id FROM inbox WHERE id >= $2 AND id < $3 \
             AND processed_at < now() - $1 * INTERVAL '1 microsecond' \
             AND lease_ends_at IS NULL FOR UPDATE SKIP LOCKED)",
            )
            .bind::<BigInt, _>(window_micros)
            .bind::<BigInt, _>(from)
            .bind::<BigInt, _>(to),
        )
        .execute(conn)
        .await
    }

    async fn upgrade_unique_index<C>(conn: &mut C) -> QueryResult<crate::schema::IndexUpgrade>
    where
        C: AsyncConnection<Backend = Self>,
    {
        super::upgrade::upgrade_unique_index(conn).await
    }

    async fn migrate<C>(conn: &mut C) -> QueryResult<()>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // An inbox that has it all gets no DDL at all (see `catalog.rs`).
        let present = [
            catalog::table("inbox"),
            catalog::index_on("inbox", crate::schema::INDEX_NAME),
            "(SELECT COUNT(*) FROM pg_catalog.pg_attribute \
             WHERE attrelid = pg_catalog.to_regclass('inbox') AND NOT attisdropped \
             AND attname IN ('lease_ends_at', 'claim_token', 'attempts', 'fingerprint')) = 4"
                .to_owned(),
            // Refused by the first migration, with why.
            "pg_catalog.current_setting('server_encoding') IN ('UTF8', 'SQL_ASCII')".to_owned(),
        ];
        if !catalog::holds(conn, &present.join(" AND ")).await? {
            // The migration creates the table and its index in one transaction: a table
            // without that index is another of that name.
            if Self::inbox_seen(conn).await? == sealed::InboxSeen::Foreign {
                return Err(crate::backend::foreign_inbox());
            }
            ddl::with_short_lock_waits(conn, Some(MIGRATE_LOCK), &migration()).await?;
        }
        super::upgrade::migrate_key_digest(conn).await?;
        warn_unless_known_language(conn).await
    }
}

/// The first two migrations, for one transaction under the migration lock: the table
/// and its index where missing, then 0.2's columns where one is missing (an
/// `ALTER TABLE`, even one with nothing to add, waits for every open handler's
/// transaction and holds up the new ones behind it).
///
/// Sent as one simple query, which runs as one transaction, rather than through
/// `AsyncConnection::transaction`, whose future rustc cannot prove `Send` for a concrete
/// connection (rust-lang/rust#100013): `migrate` must be spawnable.
fn migration() -> String {
    format!(
        "{create} \
             DO $inbox_upgrade$ BEGIN \
             IF (SELECT COUNT(*) FROM pg_attribute WHERE attrelid = 'inbox'::regclass \
             AND attname IN ('lease_ends_at', 'claim_token', 'attempts', 'fingerprint') \
             AND NOT attisdropped) < 4 THEN {claims} END IF; \
             END $inbox_upgrade$;",
        create = include_str!("../../../migrations/postgres/2026-11-30-000000_create_inbox/up.sql"),
        claims = include_str!("../../../migrations/postgres/2026-12-01-000000_claims/up.sql"),
    )
}

/// Deadlocks, lock and statement time-outs reach the crate as their text alone, and
/// are recognised in English and in PostgreSQL 15's translations: in another language
/// they would be dead-lettered. Said once, at start-up, where `migrate` runs, with what
/// to change.
async fn warn_unless_known_language<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend = diesel::pg::Pg>,
{
    #[derive(diesel::QueryableByName)]
    struct Setting {
        #[diesel(sql_type = Text)]
        lc_messages: String,
    }
    let Setting { lc_messages } =
        diesel::sql_query("SELECT current_setting('lc_messages') AS lc_messages")
            .get_result(conn)
            .await?;
    if !super::speaks_a_known_language(&lc_messages) {
        tracing::warn!(
            target: "diesel_inbox",
            lc_messages,
            "PostgreSQL words its errors here in a language whose texts diesel-inbox does \
             not know, so it cannot tell a deadlock or a lock time-out from a permanent \
             failure, and would dead-letter messages a retry would process: set \
             `lc_messages` to `C`, English or one of PostgreSQL's translations (German, \
             Spanish, French, Italian, Japanese, Georgian, Korean, Russian, Swedish, \
             Ukrainian, Chinese) for the consumers' connections (in postgresql.conf, or \
             `ALTER ROLE … SET lc_messages = 'C'` as a superuser)"
        );
    }
    Ok(())
}

/// Begins the call's transaction, counted before BEGIN is sent (see
/// [`enter_transaction`]).
async fn begin<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend = diesel::pg::Pg>,
{
    enter_transaction(conn)?;
    if let Err(error) = conn.batch_execute("BEGIN").await {
        return Err(roll_back_for(conn, error).await);
    }
    Ok(())
}

/// 25P02, which diesel-async reports as `Unknown` with only the message text.
fn is_aborted(error: &Error) -> bool {
    matches!(
        error,
        Error::DatabaseError(DatabaseErrorKind::Unknown, info)
            if is_aborted_transaction(info.message())
    )
}
