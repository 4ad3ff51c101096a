//! The outbox on MySQL and MariaDB: times in UTC (`UTC_TIMESTAMP(6)`), whatever the
//! session's `time_zone`, as in claim mode (see `claims.rs`). The relay's statements run
//! in transactions of their own, which commit whatever the session's autocommit setting;
//! those that take due messages and prune sent ones read committed rows only, so that
//! they set no gap lock for handlers' inserts to wait on.

use diesel::QueryResult;
use diesel::mysql::Mysql;
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel_async::{AsyncConnection, RunQueryDsl, TransactionManager};

use super::EVERY_ROW;
use super::markers::bytes_of_placeholder;
use crate::backend::outbox_statements::{
    DeletedKey, LastSeq, NewOutgoing, OUTGOING_COLUMNS, OutboxStatements, OutgoingRow, due, id_list,
};
use crate::backend::prepared::Prepared;
use crate::backend::queries::hex_digits;
use crate::backend::{InFlight, enter_transaction, outside_a_transaction, roll_back_for};
use crate::enclosing::{Enclosing, enclosing_transaction};

/// A row's id, as the take reads it before updating.
#[derive(diesel::QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// A sent message's id and ordering key, as the prune reads them before deleting.
#[derive(diesel::QueryableByName)]
struct SentRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Nullable<diesel::sql_types::Binary>)]
    ordering_key: Option<Vec<u8>>,
}

impl OutboxStatements for Mysql {
    async fn migrate_outbox<C>(conn: &mut C) -> QueryResult<()>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // Marked as the inbox's `migrate` is.
        outside_a_transaction(conn)?;
        let in_flight = InFlight::mark(conn)?;
        // CREATE TABLE IF NOT EXISTS is atomic DDL, safe to race, and the indexes are
        // part of it: MySQL has no CREATE INDEX IF NOT EXISTS. Sent only where a table
        // is missing, since it needs the right to create even where they are there.
        let tables = ["inbox_outbox", "inbox_outbox_keys"];
        let migrated = match super::statements::tables_exist(conn, &tables).await {
            Ok(false) => {
                conn.batch_execute(include_str!(
                    "../../../migrations/mysql/2026-12-04-000000_outbox/up.sql"
                ))
                .await
            }
            there => there.map(drop),
        };
        in_flight.answered(conn);
        migrated
    }

    async fn next_in_order<C>(conn: &mut C, ordering_key: String) -> QueryResult<i64>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // The key's unsent messages are read without a lock (a consistent read), and
        // the key's row is inserted or counted on: an exclusive lock on that row alone,
        // held to the end of the transaction, which the read after sees. A locking read
        // of the messages here locked ranges of the outbox's index (InnoDB's next-key
        // locks at REPEATABLE READ), and enqueues under different keys deadlocked on
        // them. The read only matters for a key without a row, whose row was deleted
        // with its last unsent message: then every unsent one of the key committed since
        // made the row again, which the insert meets and counts on. One text batch, the
        // values as hex literals: one round trip for the two.
        let key = hex_digits(&ordering_key);
        conn.batch_execute(&format!(
            "SELECT COALESCE(MAX(ordering_seq), 0) INTO @inbox_outbox_seq FROM inbox_outbox \
             WHERE ordering_key = X'{key}' AND sent_at IS NULL LIMIT 1; \
             INSERT INTO inbox_outbox_keys (ordering_key, last_seq) \
             VALUES (X'{key}', @inbox_outbox_seq + 1) \
             ON DUPLICATE KEY UPDATE last_seq = inbox_outbox_keys.last_seq + 1"
        ))
        .await?;
        let LastSeq { last_seq } = Prepared(
            diesel::sql_query(concat!(
                "SELECT last_seq FROM inbox_outbox_keys WHERE ordering_key = ",
                bytes_of_placeholder!(),
                " LIMIT 1"
            ))
            .bind::<Text, _>(key),
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
                // Every value as the hex digits of its bytes: the server converts a
                // text or binary parameter from the session's `character_set_client`
                // to its `character_set_connection`, which a session may set apart,
                // and would store other bytes (see `markers.rs`). Under MariaDB's
                // `sql_mode = EMPTY_STRING_IS_NULL` an empty parameter arrives as
                // NULL: these three may be empty, and never are NULL.
                concat!(
                    "INSERT INTO inbox_outbox (message_id, destination, routing_key, \
                     ordering_key, ordering_seq, headers, payload, enqueued_at, due_at) \
                     VALUES (",
                    bytes_of_placeholder!(),
                    ", ",
                    bytes_of_placeholder!(),
                    ", COALESCE(",
                    bytes_of_placeholder!(),
                    ", X''), ",
                    bytes_of_placeholder!(),
                    ", ?, COALESCE(",
                    bytes_of_placeholder!(),
                    ", X''), COALESCE(",
                    bytes_of_placeholder!(),
                    ", X''), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
                ),
            )
            .bind::<Text, _>(hex_digits(message.message_id))
            .bind::<Text, _>(hex_digits(message.destination))
            .bind::<Text, _>(hex_digits(message.routing_key))
            .bind::<Nullable<Text>, _>(ordering_key.map(hex_digits))
            .bind::<Nullable<BigInt>, _>(ordering_seq)
            .bind::<Text, _>(hex_digits(message.headers))
            .bind::<Text, _>(hex_digits(message.payload)),
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
        begin_reading_committed(conn).await?;
        let taken = take_in_transaction(conn, token, lease_micros, limit).await;
        ended(conn, taken).await
    }

    async fn mark_sent<C>(conn: &mut C, ids: Vec<i64>) -> QueryResult<()>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let ids = id_list(ids);
        let sql = format!(
            "UPDATE inbox_outbox SET sent_at = UTC_TIMESTAMP(6), relay_token = NULL \
             WHERE id IN ({ids}) AND sent_at IS NULL"
        );
        begin(conn).await?;
        let marked = diesel::sql_query(sql).execute(conn).await;
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
        let sql = concat!(
            "UPDATE inbox_outbox SET relay_token = NULL, \
             due_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, last_error = ? \
             WHERE id = ? AND sent_at IS NULL AND relay_token = ",
            bytes_of_placeholder!()
        );
        begin(conn).await?;
        let updated = Prepared(
            diesel::sql_query(sql)
                .bind::<BigInt, _>(delay_micros)
                .bind::<Text, _>(error)
                .bind::<BigInt, _>(id)
                .bind::<Text, _>(hex_digits(&token)),
        )
        .execute(conn)
        .await;
        Ok(ended(conn, updated).await? == 1)
    }

    async fn park<C>(conn: &mut C, id: i64, token: String, reason: String) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let sql = concat!(
            "UPDATE inbox_outbox SET relay_token = NULL, parked = TRUE, last_error = ? \
             WHERE id = ? AND sent_at IS NULL AND relay_token = ",
            bytes_of_placeholder!()
        );
        begin(conn).await?;
        let updated = Prepared(
            diesel::sql_query(sql)
                .bind::<Text, _>(reason)
                .bind::<BigInt, _>(id)
                .bind::<Text, _>(hex_digits(&token)),
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
        begin(conn).await?;
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
        let sql = "UPDATE inbox_outbox SET parked = FALSE, due_at = UTC_TIMESTAMP(6) \
                   WHERE id = ? AND parked AND sent_at IS NULL";
        begin(conn).await?;
        let updated = Prepared(diesel::sql_query(sql).bind::<BigInt, _>(id))
            .execute(conn)
            .await;
        Ok(ended(conn, updated).await? == 1)
    }

    async fn discard<C>(conn: &mut C, id: i64) -> QueryResult<Option<DeletedKey>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        begin(conn).await?;
        let deleted = discard_in_transaction(conn, id).await;
        ended(conn, deleted).await
    }

    async fn delete_sent<C>(
        conn: &mut C,
        window_micros: i64,
        limit: i64,
    ) -> QueryResult<Vec<DeletedKey>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        begin_reading_committed(conn).await?;
        let deleted = delete_sent_in_transaction(conn, window_micros, limit).await;
        ended(conn, deleted).await
    }

    async fn delete_idle_keys<C>(conn: &mut C, ordering_keys: Vec<Vec<u8>>) -> QueryResult<usize>
    where
        C: AsyncConnection<Backend = Self>,
    {
        if ordering_keys.is_empty() {
            return Ok(0);
        }
        begin_reading_committed(conn).await?;
        let deleted = delete_idle_keys_in_transaction(conn, ordering_keys).await;
        ended(conn, deleted).await
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
            due!("UTC_TIMESTAMP(6)"),
            " ORDER BY o.id LIMIT ? FOR UPDATE SKIP LOCKED"
        ))
        .bind::<BigInt, _>(limit),
    )
    .load(conn)
    .await?;
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let ids = id_list(ids.iter().map(|row| row.id));
    // Due again by the latest committed rows, which the update reads: on a Galera
    // cluster another node's relay may have taken a row since the select read it, and
    // its take reached this node without ending this one. Only what this update took
    // is this relay's.
    diesel::sql_query(format!(
        "UPDATE inbox_outbox SET relay_token = {token_bytes}, \
         due_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, attempts = attempts + 1 \
         WHERE id IN ({ids}) AND sent_at IS NULL AND NOT parked AND due_at <= UTC_TIMESTAMP(6)",
        token_bytes = bytes_of_placeholder!()
    ))
    .bind::<Text, _>(hex_digits(&token))
    .bind::<BigInt, _>(lease_micros)
    .execute(conn)
    .await?;
    diesel::sql_query(format!(
        "SELECT {OUTGOING_COLUMNS} FROM inbox_outbox WHERE id IN ({ids}) \
         AND relay_token = {token_bytes} ORDER BY id {EVERY_ROW}",
        token_bytes = bytes_of_placeholder!()
    ))
    .bind::<Text, _>(hex_digits(&token))
    .load(conn)
    .await
}

async fn delete_sent_in_transaction<C>(
    conn: &mut C,
    window_micros: i64,
    limit: i64,
) -> QueryResult<Vec<DeletedKey>>
where
    C: AsyncConnection<Backend = Mysql>,
{
    let rows: Vec<SentRow> = Prepared(
        diesel::sql_query(
            "SELECT id, ordering_key FROM inbox_outbox \
             WHERE sent_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
             ORDER BY sent_at LIMIT ? FOR UPDATE SKIP LOCKED",
        )
        .bind::<BigInt, _>(window_micros)
        .bind::<BigInt, _>(limit),
    )
    .load(conn)
    .await?;
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let ids = id_list(rows.iter().map(|row| row.id));
    diesel::sql_query(format!("DELETE FROM inbox_outbox WHERE id IN ({ids})"))
        .execute(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|row| DeletedKey {
            ordering_key: row.ordering_key,
        })
        .collect())
}

/// Locks parked message `id` and reads its ordering key, then deletes it: MySQL has no
/// `DELETE … RETURNING`.
async fn discard_in_transaction<C>(conn: &mut C, id: i64) -> QueryResult<Option<DeletedKey>>
where
    C: AsyncConnection<Backend = Mysql>,
{
    let parked: Vec<SentRow> = Prepared(
        diesel::sql_query(
            "SELECT id, ordering_key FROM inbox_outbox \
             WHERE id = ? AND parked AND sent_at IS NULL LIMIT 1 FOR UPDATE",
        )
        .bind::<BigInt, _>(id),
    )
    .load(conn)
    .await?;
    let Some(parked) = parked.into_iter().next() else {
        return Ok(None);
    };
    Prepared(diesel::sql_query("DELETE FROM inbox_outbox WHERE id = ?").bind::<BigInt, _>(id))
        .execute(conn)
        .await?;
    Ok(Some(DeletedKey {
        ordering_key: parked.ordering_key,
    }))
}

async fn delete_idle_keys_in_transaction<C>(
    conn: &mut C,
    ordering_keys: Vec<Vec<u8>>,
) -> QueryResult<usize>
where
    C: AsyncConnection<Backend = Mysql>,
{
    // The keys as hex digits, as everywhere: a binary parameter is converted into the
    // session's connection character set too.
    let placeholders = vec![bytes_of_placeholder!(); ordering_keys.len()].join(", ");
    // Locked first, in key order, skipping a key a transaction is enqueuing under: the
    // delete then neither waits for a handler nor deadlocks with another pruner.
    let mut locking = diesel::sql_query(format!(
        "SELECT ordering_key FROM inbox_outbox_keys WHERE ordering_key IN ({placeholders}) \
         ORDER BY ordering_key {EVERY_ROW} FOR UPDATE SKIP LOCKED"
    ))
    .into_boxed();
    for key in &ordering_keys {
        locking = locking.bind::<Text, _>(hex_digits(key));
    }
    let locked: Vec<DeletedKey> = locking.load(conn).await?;
    let locked: Vec<Vec<u8>> = locked
        .into_iter()
        .filter_map(|row| row.ordering_key)
        .collect();
    if locked.is_empty() {
        return Ok(0);
    }
    let placeholders = vec![bytes_of_placeholder!(); locked.len()].join(", ");
    let mut deleting = diesel::sql_query(format!(
        "DELETE FROM inbox_outbox_keys WHERE ordering_key IN ({placeholders}) \
         AND NOT EXISTS (SELECT 1 FROM inbox_outbox o WHERE \
         o.ordering_key = inbox_outbox_keys.ordering_key AND o.sent_at IS NULL)"
    ))
    .into_boxed();
    for key in locked {
        deleting = deleting.bind::<Text, _>(hex_digits(key));
    }
    deleting.execute(conn).await
}

/// Begins a transaction of the relay's, the pruner's or an operator's call.
async fn begin<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend = Mysql>,
{
    begin_with(conn, "COMMIT AND NO CHAIN; START TRANSACTION").await
}

/// Begins a transaction of the relay's or the pruner's that reads committed rows only,
/// so that its locking reads set no gap lock for handlers' inserts to wait on.
async fn begin_reading_committed<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend = Mysql>,
{
    begin_with(
        conn,
        "COMMIT AND NO CHAIN; SET TRANSACTION ISOLATION LEVEL READ COMMITTED; \
         START TRANSACTION",
    )
    .await
}

/// Begins a transaction with `statements`, in one round trip; inside a test
/// transaction, a savepoint instead. A connection inside any other transaction is
/// refused: one of the relay's own calls dropped midway leaves its transaction open, and
/// a savepoint there would read that call's answers for its own.
///
/// The `COMMIT` first ends what `START TRANSACTION` would end anyway: a transaction the
/// session opened without diesel knowing, by a read with autocommit off or by a `COMMIT`
/// under `completion_type = CHAIN`. Inside one, MySQL refuses to set the next
/// transaction's isolation. `START TRANSACTION` rather than diesel's `BEGIN`, which
/// MariaDB's `sql_mode = ORACLE` reads as the start of a PL/SQL block.
async fn begin_with<C>(conn: &mut C, statements: &str) -> QueryResult<()>
where
    C: AsyncConnection<Backend = Mysql>,
{
    if let Enclosing::TestTransaction = enclosing_transaction(conn)? {
        return C::TransactionManager::begin_transaction(conn).await;
    }
    enter_transaction(conn)?;
    match conn.batch_execute(statements).await {
        Ok(()) => Ok(()),
        Err(error) => Err(roll_back_for(conn, error).await),
    }
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
