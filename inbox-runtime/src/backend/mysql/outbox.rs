//! The outbox on MySQL and MariaDB: `NOW(6)` on the session's clock. The relay's
//! statements run in transactions of their own, which commit whatever the session's
//! autocommit setting; the one that takes due messages reads committed rows only, so
//! that it sets no gap lock for handlers' inserts to wait on.

use diesel::QueryResult;
use diesel::mysql::Mysql;
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel_async::{AsyncConnection, RunQueryDsl, TransactionManager};

use crate::backend::outbox_statements::{
    LastSeq, NewOutgoing, OUTGOING_COLUMNS, OutboxStatements, OutgoingRow, due,
};
use crate::backend::prepared::Prepared;
use crate::backend::roll_back_for;
use crate::enclosing::{Enclosing, enclosing_transaction};

/// A row's id, as the take reads it before updating.
#[derive(diesel::QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

impl OutboxStatements for Mysql {
    async fn migrate_outbox<C>(conn: &mut C) -> QueryResult<()>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // CREATE TABLE IF NOT EXISTS is atomic DDL, safe to race, and the indexes are
        // part of it: MySQL has no CREATE INDEX IF NOT EXISTS.
        conn.batch_execute(include_str!(
            "../../../migrations/mysql/2026-12-04-000000_outbox/up.sql"
        ))
        .await
    }

    async fn next_in_order<C>(conn: &mut C, ordering_key: String) -> QueryResult<i64>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // An exclusive lock on the key's row, held to the end of the transaction; the
        // read that follows sees this transaction's own update.
        Prepared(
            diesel::sql_query(
                "INSERT INTO inbox_outbox_keys (ordering_key, last_seq) VALUES (?, 1) \
                 ON DUPLICATE KEY UPDATE last_seq = last_seq + 1",
            )
            .bind::<Text, _>(ordering_key.clone()),
        )
        .execute(conn)
        .await?;
        let LastSeq { last_seq } = Prepared(
            diesel::sql_query("SELECT last_seq FROM inbox_outbox_keys WHERE ordering_key = ?")
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
            .bind::<diesel::sql_types::Binary, _>(message.headers)
            .bind::<diesel::sql_types::Binary, _>(message.payload),
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
        // Only for a transaction of its own: MySQL refuses it inside one.
        if matches!(enclosing_transaction(conn), Ok(Enclosing::Nothing)) {
            conn.batch_execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
                .await?;
        }
        C::TransactionManager::begin_transaction(conn).await?;
        let taken = take_in_transaction(conn, token, lease_micros, limit).await;
        ended(conn, taken).await
    }

    async fn mark_sent<C>(conn: &mut C, id: i64) -> QueryResult<()>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let sql = "UPDATE inbox_outbox SET sent_at = NOW(6), relay_token = NULL \
                   WHERE id = ? AND sent_at IS NULL";
        C::TransactionManager::begin_transaction(conn).await?;
        let marked = Prepared(diesel::sql_query(sql).bind::<BigInt, _>(id))
            .execute(conn)
            .await;
        ended(conn, marked).await.map(drop)
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
        let sql = "UPDATE inbox_outbox SET relay_token = NULL, \
                   due_at = NOW(6) + INTERVAL ? MICROSECOND, last_error = ? \
                   WHERE id = ? AND relay_token = ? AND sent_at IS NULL";
        C::TransactionManager::begin_transaction(conn).await?;
        let updated = Prepared(
            diesel::sql_query(sql)
                .bind::<BigInt, _>(delay_micros)
                .bind::<Text, _>(error)
                .bind::<BigInt, _>(id)
                .bind::<Text, _>(token),
        )
        .execute(conn)
        .await;
        Ok(ended(conn, updated).await? == 1)
    }

    async fn park<C>(conn: &mut C, id: i64, token: String, reason: String) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let sql = "UPDATE inbox_outbox SET relay_token = NULL, parked = TRUE, last_error = ? \
                   WHERE id = ? AND relay_token = ? AND sent_at IS NULL";
        C::TransactionManager::begin_transaction(conn).await?;
        let updated = Prepared(
            diesel::sql_query(sql)
                .bind::<Text, _>(reason)
                .bind::<BigInt, _>(id)
                .bind::<Text, _>(token),
        )
        .execute(conn)
        .await;
        Ok(ended(conn, updated).await? == 1)
    }

    async fn parked<C>(conn: &mut C, after_id: i64, limit: i64) -> QueryResult<Vec<OutgoingRow>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // In a transaction of its own, so that with autocommit off the read leaves no
        // transaction open.
        C::TransactionManager::begin_transaction(conn).await?;
        let parked = Prepared(
            diesel::sql_query(format!(
                "SELECT {OUTGOING_COLUMNS} FROM inbox_outbox \
                 WHERE parked AND sent_at IS NULL AND id > ? ORDER BY id LIMIT ?"
            ))
            .bind::<BigInt, _>(after_id)
            .bind::<BigInt, _>(limit),
        )
        .load(conn)
        .await;
        ended(conn, parked).await
    }

    async fn requeue<C>(conn: &mut C, id: i64) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let sql = "UPDATE inbox_outbox SET parked = FALSE, due_at = NOW(6) \
                   WHERE id = ? AND parked AND sent_at IS NULL";
        C::TransactionManager::begin_transaction(conn).await?;
        let updated = Prepared(diesel::sql_query(sql).bind::<BigInt, _>(id))
            .execute(conn)
            .await;
        Ok(ended(conn, updated).await? == 1)
    }

    async fn discard<C>(conn: &mut C, id: i64) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let sql = "DELETE FROM inbox_outbox WHERE id = ? AND parked AND sent_at IS NULL";
        C::TransactionManager::begin_transaction(conn).await?;
        let deleted = Prepared(diesel::sql_query(sql).bind::<BigInt, _>(id))
            .execute(conn)
            .await;
        Ok(ended(conn, deleted).await? == 1)
    }
}

/// Locks due messages that no other relay is taking, leases them to `token`, and reads
/// them back: MySQL has no `UPDATE … RETURNING`, and forbids a subquery on the table an
/// `UPDATE` changes.
async fn take_in_transaction<C>(
    conn: &mut C,
    token: String,
    lease_micros: i64,
    limit: i64,
) -> QueryResult<Vec<OutgoingRow>>
where
    C: AsyncConnection<Backend = Mysql>,
{
    let ids: Vec<Id> = Prepared(
        diesel::sql_query(concat!(
            "SELECT o.id FROM inbox_outbox o WHERE ",
            due!("NOW(6)"),
            " ORDER BY o.id LIMIT ? FOR UPDATE SKIP LOCKED"
        ))
        .bind::<BigInt, _>(limit),
    )
    .load(conn)
    .await?;
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    // Ids the database gave, written as numbers: nothing of a caller's reaches the text.
    let ids = ids
        .iter()
        .map(|row| row.id.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    diesel::sql_query(format!(
        "UPDATE inbox_outbox SET relay_token = ?, \
         due_at = NOW(6) + INTERVAL ? MICROSECOND, attempts = attempts + 1 WHERE id IN ({ids})"
    ))
    .bind::<Text, _>(token)
    .bind::<BigInt, _>(lease_micros)
    .execute(conn)
    .await?;
    diesel::sql_query(format!(
        "SELECT {OUTGOING_COLUMNS} FROM inbox_outbox WHERE id IN ({ids}) ORDER BY id"
    ))
    .load(conn)
    .await
}

/// Commits the relay's transaction after `result`, or rolls it back after an error.
async fn ended<C, T>(conn: &mut C, result: QueryResult<T>) -> QueryResult<T>
where
    C: AsyncConnection<Backend = Mysql>,
{
    match result {
        Ok(value) => {
            C::TransactionManager::commit_transaction(conn).await?;
            Ok(value)
        }
        Err(error) => Err(roll_back_for(conn, error).await),
    }
}
