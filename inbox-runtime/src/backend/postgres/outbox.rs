//! The outbox on PostgreSQL: `now()` is the transaction's start, and the relay's
//! statements are transactions of their own. Texts travel as UTF-8 bytes both ways, as
//! the inbox's keys do, whatever the session's `client_encoding`.

use diesel::QueryResult;
use diesel::pg::Pg;
use diesel::sql_types::{BigInt, Bytea, Nullable, Text};
use diesel_async::{AsyncConnection, RunQueryDsl};

use super::{catalog, ddl};
use crate::backend::outbox_statements::{
    DeletedKey, LastSeq, NewOutgoing, OutboxStatements, OutgoingRow, due,
};
use crate::backend::prepared::Prepared;

/// An [`OutgoingRow`]'s columns, its texts as UTF-8 bytes.
macro_rules! outgoing_columns {
    ($table:literal) => {
        concat!(
            $table,
            ".id, pg_catalog.convert_to(",
            $table,
            ".message_id, 'UTF8') AS message_id, ",
            "pg_catalog.convert_to(",
            $table,
            ".destination, 'UTF8') AS destination, ",
            "pg_catalog.convert_to(",
            $table,
            ".routing_key, 'UTF8') AS routing_key, ",
            "pg_catalog.convert_to(",
            $table,
            ".ordering_key, 'UTF8') AS ordering_key, ",
            $table,
            ".headers, ",
            $table,
            ".payload, ",
            $table,
            ".attempts, ",
            "pg_catalog.convert_to(",
            $table,
            ".last_error, 'UTF8') AS last_error"
        )
    };
}

/// Serialises `migrate_outbox` between instances, as the inbox's migration is.
const MIGRATE_LOCK: i64 = 0x6469_6573_656c_6f62;

impl OutboxStatements for Pg {
    async fn migrate_outbox<C>(conn: &mut C) -> QueryResult<()>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // An outbox that has it all gets no DDL at all (see `catalog.rs`).
        let present = [
            catalog::table("inbox_outbox"),
            catalog::table("inbox_outbox_keys"),
            catalog::index_on("inbox_outbox", "ix_inbox_outbox_unsent"),
            catalog::index_on("inbox_outbox", "ix_inbox_outbox_ordering"),
            catalog::index_on("inbox_outbox", "ix_inbox_outbox_sent"),
        ];
        if catalog::holds(conn, &present.join(" AND ")).await? {
            return Ok(());
        }
        // The advisory lock is held until the tables exist, so that concurrent
        // `CREATE … IF NOT EXISTS` never collide.
        ddl::with_short_lock_waits(
            conn,
            Some(MIGRATE_LOCK),
            include_str!("../../../migrations/postgres/2026-12-04-000000_outbox/up.sql"),
        )
        .await
    }

    async fn next_in_order<C>(conn: &mut C, ordering_key: String) -> QueryResult<i64>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // The update locks the key's row: a second transaction waits here until the
        // first ends, and then reads the number the first gave. A key whose row was
        // pruned starts after its unsent messages.
        let LastSeq { last_seq } = Prepared(
            diesel::sql_query(
                "INSERT INTO inbox_outbox_keys (ordering_key, last_seq) \
                 VALUES (pg_catalog.convert_from($1, 'UTF8'), (SELECT COALESCE(MAX(ordering_seq), 0) + 1 \
                 FROM inbox_outbox WHERE ordering_key = pg_catalog.convert_from($1, 'UTF8') \
                 AND sent_at IS NULL)) ON CONFLICT (ordering_key) \
                 DO UPDATE SET last_seq = inbox_outbox_keys.last_seq + 1 RETURNING last_seq",
            )
            .bind::<Bytea, _>(ordering_key.into_bytes()),
        )
        .get_result(conn)
        .await?;
        Ok(last_seq)
    }

    async fn insert_outgoing<C>(conn: &mut C, message: NewOutgoing) -> QueryResult<()>
    where
        C: AsyncConnection<Backend = Self>,
    {
        Prepared(
            diesel::sql_query(
                "INSERT INTO inbox_outbox (message_id, destination, routing_key, ordering_key, \
                 ordering_seq, headers, payload) VALUES (pg_catalog.convert_from($1, 'UTF8'), \
                 pg_catalog.convert_from($2, 'UTF8'), pg_catalog.convert_from($3, 'UTF8'), pg_catalog.convert_from($4, 'UTF8'), \
                 $5, $6, $7)",
            )
            .bind::<Bytea, _>(message.message_id.into_bytes())
            .bind::<Bytea, _>(message.destination.into_bytes())
            .bind::<Bytea, _>(message.routing_key.into_bytes())
            .bind::<Nullable<Bytea>, _>(
                message
                    .ordering
                    .as_ref()
                    .map(|(key, _)| key.as_bytes().to_vec()),
            )
            .bind::<Nullable<BigInt>, _>(message.ordering.map(|(_, seq)| seq))
            .bind::<Bytea, _>(message.headers)
            .bind::<Bytea, _>(message.payload),
        )
        .execute(conn)
        .await
        .map(drop)
    }

    async fn take_due<C>(
        conn: &mut C,
        token: String,
        lease_micros: i64,
        limit: i64,
    ) -> QueryResult<Vec<OutgoingRow>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        Prepared(
            diesel::sql_query(concat!(
                "WITH taken AS (SELECT o.id FROM inbox_outbox o WHERE ",
                due!("now()"),
                " ORDER BY o.id LIMIT $1 FOR UPDATE SKIP LOCKED) \
                 UPDATE inbox_outbox SET relay_token = $2, \
                 due_at = now() + $3 * INTERVAL '1 microsecond', attempts = attempts + 1 \
                 FROM taken WHERE inbox_outbox.id = taken.id RETURNING ",
                outgoing_columns!("inbox_outbox")
            ))
            .bind::<BigInt, _>(limit)
            .bind::<Text, _>(token)
            .bind::<BigInt, _>(lease_micros),
        )
        .load(conn)
        .await
    }

    async fn mark_sent<C>(conn: &mut C, ids: Vec<i64>) -> QueryResult<()>
    where
        C: AsyncConnection<Backend = Self>,
    {
        Prepared(
            diesel::sql_query(
                "UPDATE inbox_outbox SET sent_at = now(), relay_token = NULL \
                 WHERE id = ANY($1) AND sent_at IS NULL",
            )
            .bind::<diesel::sql_types::Array<BigInt>, _>(ids),
        )
        .execute(conn)
        .await
        .map(drop)
    }

    async fn retry_later<C>(
        conn: &mut C,
        id: i64,
        token: String,
        delay_micros: i64,
        error: String,
    ) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let updated = Prepared(
            diesel::sql_query(
                "UPDATE inbox_outbox SET relay_token = NULL, \
                 due_at = now() + $1 * INTERVAL '1 microsecond', \
                 last_error = pg_catalog.convert_from($2, 'UTF8') \
                 WHERE id = $3 AND relay_token = $4 AND sent_at IS NULL",
            )
            .bind::<BigInt, _>(delay_micros)
            .bind::<Bytea, _>(error.into_bytes())
            .bind::<BigInt, _>(id)
            .bind::<Text, _>(token),
        )
        .execute(conn)
        .await?;
        Ok(updated == 1)
    }

    async fn park<C>(conn: &mut C, id: i64, token: String, reason: String) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let updated = Prepared(
            diesel::sql_query(
                "UPDATE inbox_outbox SET relay_token = NULL, parked = true, \
                 last_error = pg_catalog.convert_from($1, 'UTF8') \
                 WHERE id = $2 AND relay_token = $3 AND sent_at IS NULL",
            )
            .bind::<Bytea, _>(reason.into_bytes())
            .bind::<BigInt, _>(id)
            .bind::<Text, _>(token),
        )
        .execute(conn)
        .await?;
        Ok(updated == 1)
    }

    async fn parked<C>(conn: &mut C, after_id: i64, limit: i64) -> QueryResult<Vec<OutgoingRow>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        Prepared(
            diesel::sql_query(concat!(
                "SELECT ",
                outgoing_columns!("o"),
                " FROM inbox_outbox o WHERE o.parked AND o.sent_at IS NULL AND o.id > $1 \
                 ORDER BY o.id LIMIT $2"
            ))
            .bind::<BigInt, _>(after_id)
            .bind::<BigInt, _>(limit),
        )
        .load(conn)
        .await
    }

    async fn requeue<C>(conn: &mut C, id: i64) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let updated = Prepared(
            diesel::sql_query(
                "UPDATE inbox_outbox SET parked = false, due_at = now() \
                 WHERE id = $1 AND parked AND sent_at IS NULL",
            )
            .bind::<BigInt, _>(id),
        )
        .execute(conn)
        .await?;
        Ok(updated == 1)
    }

    async fn discard<C>(conn: &mut C, id: i64) -> QueryResult<Option<DeletedKey>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let deleted: Vec<DeletedKey> = Prepared(
            diesel::sql_query(
                "DELETE FROM inbox_outbox WHERE id = $1 AND parked AND sent_at IS NULL \
                 RETURNING pg_catalog.convert_to(ordering_key, 'UTF8') AS ordering_key",
            )
            .bind::<BigInt, _>(id),
        )
        .load(conn)
        .await?;
        Ok(deleted.into_iter().next())
    }

    async fn delete_sent<C>(
        conn: &mut C,
        window_micros: i64,
        limit: i64,
    ) -> QueryResult<Vec<DeletedKey>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        Prepared(
            diesel::sql_query(
                "DELETE FROM inbox_outbox WHERE id IN (SELECT id FROM inbox_outbox \
                 WHERE sent_at < now() - $1 * INTERVAL '1 microsecond' \
                 ORDER BY sent_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
                 RETURNING pg_catalog.convert_to(ordering_key, 'UTF8') AS ordering_key",
            )
            .bind::<BigInt, _>(window_micros)
            .bind::<BigInt, _>(limit),
        )
        .load(conn)
        .await
    }

    async fn delete_idle_keys<C>(conn: &mut C, ordering_keys: Vec<Vec<u8>>) -> QueryResult<usize>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // Locked in the sub-select, skipping a key a transaction is enqueuing under, so
        // that neither waits nor two pruners deadlock.
        Prepared(
            diesel::sql_query(
                "DELETE FROM inbox_outbox_keys k WHERE k.ordering_key IN \
                 (SELECT ordering_key FROM inbox_outbox_keys WHERE ordering_key IN \
                 (SELECT pg_catalog.convert_from(key, 'UTF8') FROM pg_catalog.unnest($1) AS key) \
                 FOR UPDATE SKIP LOCKED) AND NOT EXISTS (SELECT 1 FROM inbox_outbox o \
                 WHERE o.ordering_key = k.ordering_key AND o.sent_at IS NULL)",
            )
            .bind::<diesel::sql_types::Array<Bytea>, _>(ordering_keys),
        )
        .execute(conn)
        .await
    }
}
