//! The three connection types the harness drives, and the statements its handlers issue.
//!
//! Every statement is a typed diesel query, so it is prepared once per connection and
//! then costs one round trip, as the library's own statements do. The inbox statements
//! are written to render exactly the SQL that `#[idempotent]` issues; transaction control
//! is raw SQL, as the library's transaction manager sends it.

use std::fmt::Write as _;
use std::future::Future;

use anyhow::Context as _;
use diesel::QueryResult;
use diesel::dsl::{exists, insert_into, now, select, sql, update};
use diesel::expression::SqlLiteral;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error};
use diesel::sql_types::{Array, BigInt, Text, Timestamp};
use diesel::sqlite::SqliteConnection;
use diesel_async::methods::{ExecuteDsl, LoadQuery};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{
    AsyncConnection, AsyncMysqlConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection,
};
use diesel_inbox::testing::{TestConnection, TestDatabase};
use inbox_fixtures::credit::{CreditTables, credit_account, naive_inbox};

use crate::backend::Backend;

pub type SqliteConn = SyncConnectionWrapper<SqliteConnection>;

diesel::table! {
    /// The peer flow's inbox, modelled on MassTransit's `InboxState`: a row is received
    /// in one transaction and consumed in a later one, so `consumed_at` starts out null.
    peer_inbox (id) {
        id -> BigInt,
        message_id -> Text,
        consumer -> Text,
        received_at -> Timestamp,
        consumed_at -> Nullable<Timestamp>,
    }
}

/// (3)'s marker insert on PostgreSQL, the library's statement: the key bound as UTF-8
/// bytes, inserted only behind the BEGIN batch that sets the flag. A statement of its
/// own type, prepared once per connection as the library's is (a `sql_query` is
/// prepared again on every execution).
struct FlaggedMarkerInsert {
    message_id: String,
    consumer: &'static str,
}

impl diesel::query_builder::QueryId for FlaggedMarkerInsert {
    type QueryId = Self;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl diesel::query_builder::QueryFragment<diesel::pg::Pg> for FlaggedMarkerInsert {
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, diesel::pg::Pg>,
    ) -> QueryResult<()> {
        use diesel::sql_types::Bytea;

        out.push_sql("INSERT INTO inbox (message_id, consumer) SELECT convert_from(");
        out.push_bind_param::<Bytea, [u8]>(self.message_id.as_bytes())?;
        out.push_sql(", 'UTF8'), convert_from(");
        out.push_bind_param::<Bytea, [u8]>(self.consumer.as_bytes())?;
        out.push_sql(
            ", 'UTF8') WHERE current_setting('diesel_inbox.marker_transaction', true) = 'open' \
             ON CONFLICT DO NOTHING",
        );
        Ok(())
    }
}

diesel::define_sql_function! {
    /// PostgreSQL's current time, which unlike `now()` advances within a transaction.
    fn clock_timestamp() -> Timestamp;
}

#[diesel::dsl::auto_type]
fn peer_row(message_id: String, consumer: &'static str) -> _ {
    peer_inbox::table.filter(
        peer_inbox::message_id
            .eq(message_id)
            .and(peer_inbox::consumer.eq(consumer)),
    )
}

#[diesel::dsl::auto_type]
fn peer_insert(message_id: String, consumer: &'static str) -> _ {
    insert_into(peer_inbox::table).values((
        peer_inbox::message_id.eq(message_id),
        peer_inbox::consumer.eq(consumer),
    ))
}

#[diesel::dsl::auto_type]
fn naive_seen(message_id: String, consumer: &'static str) -> _ {
    select(exists(
        naive_inbox::table.filter(
            naive_inbox::message_id
                .eq(message_id)
                .and(naive_inbox::consumer.eq(consumer)),
        ),
    ))
}

#[diesel::dsl::auto_type]
fn naive_record(message_id: String, consumer: &'static str) -> _ {
    insert_into(naive_inbox::table).values((
        naive_inbox::message_id.eq(message_id),
        naive_inbox::consumer.eq(consumer),
    ))
}

/// The statements that read the same on every backend. The blanket impl states
/// diesel's bounds once; they hold for all three connection types.
pub trait Statements: AsyncConnection {
    /// `UPDATE accounts SET balance = balance + $1 WHERE id = $2`: the business write.
    fn credit(
        &mut self,
        account: i64,
        amount: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// `INSERT INTO peer_inbox (message_id, consumer) VALUES ($1, $2)`.
    fn peer_insert(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    fn naive_seen(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    fn naive_record(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// The integers a raw `SELECT` returns: setup and server counters.
    fn query_i64s(&mut self, query: String) -> impl Future<Output = QueryResult<Vec<i64>>> + Send;

    /// The texts a raw `SELECT` returns.
    fn query_texts(
        &mut self,
        query: String,
    ) -> impl Future<Output = QueryResult<Vec<String>>> + Send;
}

impl<C> Statements for C
where
    C: AsyncConnection + 'static,
    credit_account: ExecuteDsl<C> + Send + 'static,
    peer_insert: ExecuteDsl<C> + Send + 'static,
    naive_seen: LoadQuery<'static, C, bool> + Send + 'static,
    naive_record: ExecuteDsl<C> + Send + 'static,
    for<'q> SqlLiteral<BigInt>: LoadQuery<'q, C, i64>,
    for<'q> SqlLiteral<Text>: LoadQuery<'q, C, String>,
{
    fn credit(
        &mut self,
        account: i64,
        amount: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        credit_account(account, amount).execute(self)
    }

    fn peer_insert(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        peer_insert(message_id, consumer).execute(self)
    }

    fn naive_seen(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<bool>> + Send {
        naive_seen(message_id, consumer).get_result(self)
    }

    fn naive_record(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        naive_record(message_id, consumer).execute(self)
    }

    async fn query_i64s(&mut self, query: String) -> QueryResult<Vec<i64>> {
        sql::<BigInt>(&query).load(self).await
    }

    async fn query_texts(&mut self, query: String) -> QueryResult<Vec<String>> {
        sql::<Text>(&query).load(self).await
    }
}

/// A connection the harness can run every variant on: the shared statements plus what
/// each backend spells differently.
pub trait BenchConnection: Statements + CreditTables + TestConnection + 'static {
    const BACKEND: Backend;

    /// Opens a serializable transaction that holds the write lock from its first
    /// statement on, for the peer flow's second transaction.
    const BEGIN_SERIALIZABLE: &'static str;

    /// Ends (3)'s transaction after an error, putting back what its
    /// [`BenchConnection::begin_with_marker`] changed in the session.
    const ROLLBACK: &'static str = "ROLLBACK";

    /// Begins the transaction and inserts the marker as the library does on this
    /// backend; `Ok(false)` when a marker for the key is already committed. Whatever it
    /// returns, the caller ends the transaction.
    fn begin_with_marker(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Commits the handler's transaction as the library does on this backend, proving
    /// first that it is still the one the marker was inserted in. On `Err` the caller
    /// rolls back.
    fn commit_checked(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// `SELECT consumed_at IS NOT NULL FROM peer_inbox … FOR UPDATE`: whether the peer
    /// flow's row is consumed, `None` when there is no row.
    fn lock_peer_row(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<Option<bool>>> + Send;

    /// `UPDATE peer_inbox SET consumed_at = <clock> …` with this backend's clock at the
    /// column's precision.
    fn consume_peer_row(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// A batch's business write: adds each `(account, amount)` of `credits`, whose
    /// accounts are distinct and ascending, in one statement that walks the accounts'
    /// primary key in that order, so that two batches sharing accounts lock them in the
    /// same order and wait for each other rather than deadlock.
    fn credit_batch(
        &mut self,
        credits: &[(i64, i64)],
    ) -> impl Future<Output = QueryResult<()>> + Send;
}

impl BenchConnection for AsyncPgConnection {
    const BACKEND: Backend = Backend::Postgres;
    const BEGIN_SERIALIZABLE: &'static str = "BEGIN ISOLATION LEVEL SERIALIZABLE";

    /// Pipelined, as for a handler that names `AsyncPgConnection`: the insert goes out
    /// behind the BEGIN batch, and inserts only where that batch set its flag.
    async fn begin_with_marker(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> QueryResult<bool> {
        let insert = FlaggedMarkerInsert {
            message_id,
            consumer,
        };
        let shared: &AsyncPgConnection = self;
        let (mut for_begin, mut for_insert) = (shared, shared);
        let (begun, inserted) = tokio::join!(
            for_begin.batch_execute("BEGIN; SET LOCAL diesel_inbox.marker_transaction = 'open'"),
            insert.execute(&mut for_insert),
        );
        begun?;
        Ok(inserted? == 1)
    }

    /// One simple query: in a transaction aborted by an error the handler swallowed,
    /// `SELECT 1` fails and the COMMIT after it is skipped, where a lone COMMIT would
    /// silently roll back.
    fn commit_checked(
        &mut self,
        _message_id: String,
        _consumer: &'static str,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        self.batch_execute("SELECT 1; COMMIT")
    }

    async fn lock_peer_row(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> QueryResult<Option<bool>> {
        peer_row(message_id, consumer)
            .select(peer_inbox::consumed_at.is_not_null())
            .for_update()
            .get_result(self)
            .await
            .optional()
    }

    /// `now()` would be the transaction's start, before the handler ran.
    fn consume_peer_row(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        update(peer_row(message_id, consumer))
            .set(peer_inbox::consumed_at.eq(clock_timestamp().nullable()))
            .execute(self)
    }

    /// The accounts and amounts bound as two arrays: one statement text whatever the
    /// batch's size. The `= ANY` condition makes the accounts an index scan of their
    /// primary key in ascending order, which drives the join; without it the planner
    /// hash-joins a batch of 100 against a sequential scan, whose order changes as rows
    /// move, and batches deadlock (a second's `deadlock_timeout` each).
    async fn credit_batch(&mut self, credits: &[(i64, i64)]) -> QueryResult<()> {
        let (accounts, amounts): (Vec<i64>, Vec<i64>) = credits.iter().copied().unzip();
        diesel::sql_query(
            "UPDATE accounts SET balance = balance + credit.amount \
             FROM unnest($1::bigint[], $2::bigint[]) AS credit (id, amount) \
             WHERE accounts.id = credit.id AND accounts.id = ANY ($1)",
        )
        .bind::<Array<BigInt>, _>(accounts)
        .bind::<Array<BigInt>, _>(amounts)
        .execute(self)
        .await?;
        Ok(())
    }
}

impl BenchConnection for AsyncMysqlConnection {
    const BACKEND: Backend = Backend::Mysql;
    // One round trip: the SET applies to the next transaction only.
    const BEGIN_SERIALIZABLE: &'static str =
        "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; START TRANSACTION";
    const ROLLBACK: &'static str = "ROLLBACK; \
        SET autocommit = COALESCE(@`diesel_inbox.autocommit`, @@autocommit), \
        @`diesel_inbox.autocommit` = NULL";

    /// One batch, as the library sends it: START TRANSACTION and the savepoint the commit
    /// releases, a plain insert of hex literals (a duplicate-key error meaning a
    /// duplicate: MySQL's `ON DUPLICATE KEY` cannot tell a new row from a duplicate), then
    /// the marker's id and autocommit off.
    async fn begin_with_marker(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> QueryResult<bool> {
        let batch = format!(
            "START TRANSACTION; SAVEPOINT diesel_inbox_marker; \
             INSERT INTO inbox (message_id, consumer) VALUES (X'{}', X'{}'); \
             SET @`diesel_inbox.marker_id` = LAST_INSERT_ID(), \
             @`diesel_inbox.database` = DATABASE(), \
             @`diesel_inbox.autocommit` = @@autocommit, autocommit = 0",
            hex_digits(&message_id),
            hex_digits(consumer),
        );
        match self.batch_execute(&batch).await {
            Ok(()) => Ok(true),
            Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(false),
            Err(other) => Err(other),
        }
    }

    /// Then the statement each connection prepares on its first commit: on a Galera node
    /// (and any server that is not MariaDB) a check that the marker row is committed,
    /// and everywhere the restore of autocommit, in the same round trip.
    async fn commit_checked(
        &mut self,
        _message_id: String,
        _consumer: &'static str,
    ) -> QueryResult<()> {
        const AFTER_COMMIT: &str = "diesel_inbox.after_commit";
        match self
            .batch_execute(
                "RELEASE SAVEPOINT diesel_inbox_marker; COMMIT; EXECUTE `diesel_inbox.after_commit`",
            )
            .await
        {
            Err(error) if error.to_string().contains(AFTER_COMMIT) => {
                self.batch_execute(
                    "SET @`diesel_inbox.after_commit` = IF(/*M! (SELECT COUNT(*) \
                     FROM information_schema.SYSTEM_VARIABLES WHERE VARIABLE_NAME = 'WSREP_ON' \
                     AND 'ON' IN (GLOBAL_VALUE, SESSION_VALUE)) > 0 OR NOT */ TRUE, \
                     CONCAT('SET sql_mode = IF(@`diesel_inbox.database` <=> ', QUOTE(DATABASE()), \
                     ', IF(EXISTS (SELECT 1 FROM inbox WHERE id = @`diesel_inbox.marker_id`), \
                     @@sql_mode, ''diesel_inbox_lost_marker''), ''diesel_inbox.after_commit''), \
                     autocommit = COALESCE(@`diesel_inbox.autocommit`, @@autocommit), \
                     @`diesel_inbox.autocommit` = NULL'), \
                     'SET autocommit = COALESCE(@`diesel_inbox.autocommit`, @@autocommit), \
                     @`diesel_inbox.autocommit` = NULL'); \
                     PREPARE `diesel_inbox.after_commit` FROM @`diesel_inbox.after_commit`; \
                     SET @`diesel_inbox.after_commit` = NULL; EXECUTE `diesel_inbox.after_commit`",
                )
                .await
            }
            result => result,
        }
    }

    async fn lock_peer_row(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> QueryResult<Option<bool>> {
        peer_row(message_id, consumer)
            .select(peer_inbox::consumed_at.is_not_null())
            .for_update()
            .get_result(self)
            .await
            .optional()
    }

    /// Plain `CURRENT_TIMESTAMP` would drop the microseconds the column keeps; the
    /// precision must be a literal.
    fn consume_peer_row(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        update(peer_row(message_id, consumer))
            .set(peer_inbox::consumed_at.eq(sql::<Timestamp>("CURRENT_TIMESTAMP(6)").nullable()))
            .execute(self)
    }

    async fn credit_batch(&mut self, credits: &[(i64, i64)]) -> QueryResult<()> {
        self.batch_execute(&credit_by_case(credits)).await
    }
}

impl BenchConnection for SqliteConn {
    const BACKEND: Backend = Backend::Sqlite;
    // SQLite transactions are serializable; IMMEDIATE takes the write lock up front, so a
    // second writer waits in the busy handler instead of failing with SQLITE_BUSY.
    const BEGIN_SERIALIZABLE: &'static str = "BEGIN IMMEDIATE";

    /// One batch, as the library sends it: BEGIN, a plain insert of hex literals cast to
    /// text (a unique violation meaning a duplicate), and the savepoint.
    async fn begin_with_marker(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> QueryResult<bool> {
        let batch = format!(
            "BEGIN; INSERT INTO inbox (message_id, consumer) \
             VALUES (CAST(X'{}' AS TEXT), CAST(X'{}' AS TEXT)); \
             SAVEPOINT diesel_inbox_marker",
            hex_digits(&message_id),
            hex_digits(consumer),
        );
        match self.batch_execute(&batch).await {
            Ok(()) => Ok(true),
            Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(false),
            Err(other) => Err(other),
        }
    }

    fn commit_checked(
        &mut self,
        _message_id: String,
        _consumer: &'static str,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        self.batch_execute(RELEASE_AND_COMMIT)
    }

    /// SQLite has no `FOR UPDATE`: `BEGIN IMMEDIATE` already holds the database's
    /// write lock.
    async fn lock_peer_row(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> QueryResult<Option<bool>> {
        peer_row(message_id, consumer)
            .select(peer_inbox::consumed_at.is_not_null())
            .get_result(self)
            .await
            .optional()
    }

    fn consume_peer_row(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        update(peer_row(message_id, consumer))
            .set(peer_inbox::consumed_at.eq(now.nullable()))
            .execute(self)
    }

    async fn credit_batch(&mut self, credits: &[(i64, i64)]) -> QueryResult<()> {
        self.batch_execute(&credit_by_case(credits)).await
    }
}

/// `UPDATE accounts SET balance = balance + CASE id WHEN … END WHERE id IN (…)` for
/// MySQL and SQLite, which have no arrays to bind: a text statement of integer literals,
/// sent in one round trip and not kept prepared (its text differs from batch to batch).
/// The `IN` list makes it a range scan of the primary key, in ascending order.
fn credit_by_case(credits: &[(i64, i64)]) -> String {
    let mut cases = String::new();
    let mut accounts = Vec::with_capacity(credits.len());
    for (account, amount) in credits {
        let _ = write!(cases, " WHEN {account} THEN {amount}");
        accounts.push(account.to_string());
    }
    format!(
        "UPDATE accounts SET balance = balance + CASE id{cases} END WHERE id IN ({})",
        accounts.join(", ")
    )
}

/// The library's commit on MySQL and SQLite: the savepoint set after the marker insert
/// is still there only in the transaction that inserted the marker, and the server skips
/// the COMMIT when the RELEASE fails.
const RELEASE_AND_COMMIT: &str = "RELEASE SAVEPOINT diesel_inbox_marker; COMMIT";

/// `text`'s bytes as hex digits, for a literal `X'…'`.
fn hex_digits(text: &str) -> String {
    text.bytes().map(|byte| format!("{byte:02X}")).collect()
}

/// Opens a connection to the run's own schema, database or file.
pub async fn connect<C: BenchConnection>(db: &TestDatabase<C>) -> anyhow::Result<C> {
    db.connect()
        .await
        .with_context(|| format!("connect to {}, {}", C::BACKEND.name(), db.name()))
}
