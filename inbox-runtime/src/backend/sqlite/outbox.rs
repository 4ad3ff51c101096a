//! The outbox on SQLite: times are UTC text with milliseconds, which compares in time
//! order. Writers take turns, so a key's messages are numbered in commit order and a
//! take has no concurrent relay to skip.

use diesel::QueryResult;
use diesel::sql_types::{BigInt, Binary, Nullable, Text};
use diesel::sqlite::Sqlite;
use diesel_async::{AsyncConnection, RunQueryDsl};

use super::claims::ahead;
use crate::backend::outbox_statements::{
    DeletedKey, LastSeq, NewOutgoing, OUTGOING_COLUMNS, OutboxStatements, OutgoingRow, due, id_list,
};
use crate::backend::prepared::Prepared;

/// Now, in the format the outbox's times are stored in.
macro_rules! now {
    () => {
        "strftime('%Y-%m-%d %H:%M:%f', 'now')"
    };
}

/// Whether any message is due, as an idle relay's poll reads it.
#[derive(diesel::QueryableByName)]
struct AnyDue {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    due: bool,
}

/// The `strftime` modifier that moves a time `micros` back.
fn ago(micros: i64) -> String {
    format!("-{}.{:06} seconds", micros / 1_000_000, micros % 1_000_000)
}

impl OutboxStatements for Sqlite {
    async fn migrate_outbox<C>(conn: &mut C) -> QueryResult<()>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // Every statement is `IF NOT EXISTS`, and SQLite serialises writers.
        conn.batch_execute(include_str!(
            "../../../migrations/sqlite/2026-12-04-000000_outbox/up.sql"
        ))
        .await
    }

    async fn next_in_order<C>(conn: &mut C, ordering_key: String) -> QueryResult<i64>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let LastSeq { last_seq } = Prepared(
            diesel::sql_query(
                // A key whose row was pruned starts after its unsent messages.
                "INSERT INTO inbox_outbox_keys (ordering_key, last_seq) VALUES (?1, \
                 (SELECT COALESCE(MAX(ordering_seq), 0) + 1 FROM inbox_outbox \
                 WHERE ordering_key = ?1 AND sent_at IS NULL)) \
                 ON CONFLICT (ordering_key) DO UPDATE SET last_seq = last_seq + 1 \
                 RETURNING last_seq",
            )
            .bind::<Text, _>(ordering_key),
        )
        .get_result(conn)
        .await?;
        Ok(last_seq)
    }

    async fn insert_outgoing<C>(conn: &mut C, message: NewOutgoing) -> QueryResult<()>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let (ordering_key, ordering_seq) = message.ordering.unzip();
        Prepared(
            diesel::sql_query(
                "INSERT INTO inbox_outbox (message_id, destination, routing_key, ordering_key, \
                 ordering_seq, headers, payload) VALUES (?, ?, ?, ?, ?, ?, ?)",
            )
            .bind::<Text, _>(message.message_id)
            .bind::<Text, _>(message.destination)
            .bind::<Text, _>(message.routing_key)
            .bind::<Nullable<Text>, _>(ordering_key)
            .bind::<Nullable<BigInt>, _>(ordering_seq)
            .bind::<Binary, _>(message.headers)
            .bind::<Binary, _>(message.payload),
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
        // An UPDATE takes the database's one write lock even when it matches nothing:
        // an idle relay's polls only read, and never hold up a handler's commit.
        let AnyDue { due } = Prepared(diesel::sql_query(concat!(
            "SELECT EXISTS (SELECT 1 FROM inbox_outbox o WHERE ",
            due!(now!()),
            ") AS due"
        )))
        .get_result(conn)
        .await?;
        if !due {
            return Ok(Vec::new());
        }
        let sql = format!(
            "UPDATE inbox_outbox SET relay_token = ?, due_at = strftime('%Y-%m-%d %H:%M:%f', \
             'now', ?), attempts = attempts + 1 WHERE id IN (SELECT o.id FROM inbox_outbox o \
             WHERE {due} ORDER BY o.id LIMIT ?) RETURNING {OUTGOING_COLUMNS}",
            due = due!(now!()),
        );
        let mut taken: Vec<OutgoingRow> = Prepared(
            diesel::sql_query(sql)
                .bind::<Text, _>(token)
                .bind::<Text, _>(ahead(lease_micros))
                .bind::<BigInt, _>(limit),
        )
        .load(conn)
        .await?;
        // RETURNING gives the rows in no promised order.
        taken.sort_unstable_by_key(|row| row.id);
        Ok(taken)
    }

    async fn mark_sent<C>(conn: &mut C, ids: Vec<i64>) -> QueryResult<()>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let ids = id_list(ids);
        diesel::sql_query(format!(
            "UPDATE inbox_outbox SET sent_at = {now}, relay_token = NULL \
             WHERE id IN ({ids}) AND sent_at IS NULL",
            now = now!(),
        ))
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
                 due_at = strftime('%Y-%m-%d %H:%M:%f', 'now', ?), last_error = ? \
                 WHERE id = ? AND relay_token = ? AND sent_at IS NULL",
            )
            .bind::<Text, _>(ahead(delay_micros))
            .bind::<Text, _>(error)
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
                "UPDATE inbox_outbox SET relay_token = NULL, parked = TRUE, last_error = ? \
                 WHERE id = ? AND relay_token = ? AND sent_at IS NULL",
            )
            .bind::<Text, _>(reason)
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
            diesel::sql_query(format!(
                "SELECT {OUTGOING_COLUMNS} FROM inbox_outbox \
                 WHERE parked AND sent_at IS NULL AND id > ? ORDER BY id LIMIT ?"
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
            diesel::sql_query(concat!(
                "UPDATE inbox_outbox SET parked = FALSE, due_at = ",
                now!(),
                " WHERE id = ? AND parked AND sent_at IS NULL"
            ))
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
                "DELETE FROM inbox_outbox WHERE id = ? AND parked AND sent_at IS NULL \
                 RETURNING ordering_key",
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
                 WHERE sent_at IS NOT NULL AND sent_at < strftime('%Y-%m-%d %H:%M:%f', 'now', ?) \
                 ORDER BY sent_at LIMIT ?) RETURNING ordering_key",
            )
            .bind::<Text, _>(ago(window_micros))
            .bind::<BigInt, _>(limit),
        )
        .load(conn)
        .await
    }

    async fn delete_idle_keys<C>(conn: &mut C, ordering_keys: Vec<Vec<u8>>) -> QueryResult<usize>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // One statement a key: SQLite takes one writer at a time, and a prune deletes
        // few keys, those of the messages it deleted.
        let mut deleted = 0;
        for key in ordering_keys {
            deleted += Prepared(
                diesel::sql_query(
                    "DELETE FROM inbox_outbox_keys WHERE ordering_key = CAST(? AS TEXT) \
                     AND NOT EXISTS (SELECT 1 FROM inbox_outbox o WHERE \
                     o.ordering_key = inbox_outbox_keys.ordering_key AND o.sent_at IS NULL)",
                )
                .bind::<Binary, _>(key),
            )
            .execute(conn)
            .await?;
        }
        Ok(deleted)
    }
}
