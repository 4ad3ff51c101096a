//! The three connection types the harness drives, and the statements its handlers issue.
//!
//! Every statement is a typed diesel query, so it is prepared once per connection and
//! then costs one round trip, as the library's own statements do. The inbox statements
//! are written to render exactly the SQL that `#[idempotent]` issues.

use std::future::Future;

use anyhow::Context as _;
use diesel::QueryResult;
use diesel::dsl::{exists, insert_into, now, select, sql, update};
use diesel::expression::SqlLiteral;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error};
use diesel::sql_types::{BigInt, Text, Timestamp};
use diesel::sqlite::SqliteConnection;
use diesel_async::methods::{ExecuteDsl, LoadQuery};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{
    AsyncConnection, AsyncMysqlConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection,
};
use diesel_inbox::schema::inbox;
use diesel_inbox::{ErrorClass, InboxBackend, classify};

use crate::cli::Backend;
use crate::target::Target;

pub type SqliteConn = SyncConnectionWrapper<SqliteConnection>;

diesel::table! {
    /// The credit handler's business table.
    accounts (id) {
        id -> BigInt,
        balance -> BigInt,
    }
}

diesel::table! {
    /// The naive handler's record of seen messages. The database has no unique index on
    /// it, by design: that is the naive handler's mistake. (diesel needs a key to name.)
    naive_inbox (message_id, consumer) {
        message_id -> Text,
        consumer -> Text,
    }
}

diesel::define_sql_function! {
    /// PostgreSQL's current time, which unlike `now()` advances within a transaction.
    fn clock_timestamp() -> Timestamp;
}

#[diesel::dsl::auto_type]
fn credit_account(account: i64, amount: i64) -> _ {
    update(accounts::table.find(account)).set(accounts::balance.eq(accounts::balance + amount))
}

#[diesel::dsl::auto_type]
fn marker_row(message_id: String, consumer: &'static str) -> _ {
    inbox::table.filter(
        inbox::message_id
            .eq(message_id)
            .and(inbox::consumer.eq(consumer)),
    )
}

#[diesel::dsl::auto_type]
fn marker_exists(message_id: String, consumer: &'static str) -> _ {
    let row: marker_row = marker_row(message_id, consumer);
    select(exists(row))
}

#[diesel::dsl::auto_type]
fn plain_insert(message_id: String, consumer: &'static str) -> _ {
    insert_into(inbox::table).values((
        inbox::message_id.eq(message_id),
        inbox::consumer.eq(consumer),
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

    /// The fast path's read: is the marker committed?
    fn marker_exists(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// `INSERT INTO inbox (message_id, consumer) VALUES ($1, $2)`.
    fn plain_insert(
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
    marker_exists: LoadQuery<'static, C, bool> + Send + 'static,
    plain_insert: ExecuteDsl<C> + Send + 'static,
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

    fn marker_exists(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<bool>> + Send {
        marker_exists(message_id, consumer).get_result(self)
    }

    fn plain_insert(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        plain_insert(message_id, consumer).execute(self)
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
pub trait BenchConnection:
    Statements + SimpleAsyncConnection + AsyncConnection<Backend: InboxBackend> + Send + 'static
{
    const BACKEND: Backend;

    /// Opens a serializable transaction that holds the write lock from its first
    /// statement on, for the peer flow's second transaction.
    const BEGIN_SERIALIZABLE: &'static str;

    /// Inserts the marker as the library does on this backend; `Ok(false)` when a
    /// marker for the key is already committed.
    fn insert_marker(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Sets `processed_at` with the clock the library uses on this backend; returns the
    /// rows matched.
    fn stamp_processed(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// `SELECT processed_at IS NOT NULL … FOR UPDATE`: whether the marker is consumed,
    /// `None` when there is no marker.
    fn lock_marker(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<Option<bool>>> + Send;
}

impl BenchConnection for AsyncPgConnection {
    const BACKEND: Backend = Backend::Postgres;
    const BEGIN_SERIALIZABLE: &'static str = "BEGIN ISOLATION LEVEL SERIALIZABLE";

    async fn insert_marker(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> QueryResult<bool> {
        let inserted = plain_insert(message_id, consumer)
            .on_conflict((inbox::message_id, inbox::consumer))
            .do_nothing()
            .execute(self)
            .await?;
        Ok(inserted == 1)
    }

    fn stamp_processed(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        update(marker_row(message_id, consumer))
            .set(inbox::processed_at.eq(clock_timestamp().nullable()))
            .execute(self)
    }

    async fn lock_marker(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> QueryResult<Option<bool>> {
        marker_row(message_id, consumer)
            .select(inbox::processed_at.is_not_null())
            .for_update()
            .get_result(self)
            .await
            .optional()
    }
}

impl BenchConnection for AsyncMysqlConnection {
    const BACKEND: Backend = Backend::Mysql;
    // One round trip: the SET applies to the next transaction only.
    const BEGIN_SERIALIZABLE: &'static str =
        "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; START TRANSACTION";

    /// A plain insert whose duplicate-key error names the inbox's index, as the library
    /// does: MySQL's `ON DUPLICATE KEY` cannot tell a new row from a duplicate.
    async fn insert_marker(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> QueryResult<bool> {
        match self.plain_insert(message_id, consumer).await {
            Ok(_) => Ok(true),
            Err(error @ Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _))
                if classify(&error) == ErrorClass::InboxDuplicate =>
            {
                Ok(false)
            }
            Err(other) => Err(other),
        }
    }

    fn stamp_processed(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        update(marker_row(message_id, consumer))
            .set(inbox::processed_at.eq(sql::<Timestamp>("CURRENT_TIMESTAMP(6)").nullable()))
            .execute(self)
    }

    async fn lock_marker(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> QueryResult<Option<bool>> {
        marker_row(message_id, consumer)
            .select(inbox::processed_at.is_not_null())
            .for_update()
            .get_result(self)
            .await
            .optional()
    }
}

impl BenchConnection for SqliteConn {
    const BACKEND: Backend = Backend::Sqlite;
    // SQLite transactions are serializable; IMMEDIATE takes the write lock up front, so a
    // second writer waits in the busy handler instead of failing with SQLITE_BUSY.
    const BEGIN_SERIALIZABLE: &'static str = "BEGIN IMMEDIATE";

    async fn insert_marker(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> QueryResult<bool> {
        let inserted = plain_insert(message_id, consumer)
            .on_conflict((inbox::message_id, inbox::consumer))
            .do_nothing()
            .execute(self)
            .await?;
        Ok(inserted == 1)
    }

    /// SQLite has no `FOR UPDATE`: `BEGIN IMMEDIATE` already holds the database's
    /// write lock.
    fn stamp_processed(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        update(marker_row(message_id, consumer))
            .set(inbox::processed_at.eq(now.nullable()))
            .execute(self)
    }

    async fn lock_marker(
        &mut self,
        message_id: String,
        consumer: &'static str,
    ) -> QueryResult<Option<bool>> {
        marker_row(message_id, consumer)
            .select(inbox::processed_at.is_not_null())
            .get_result(self)
            .await
            .optional()
    }
}

/// Opens a connection to the target's own schema, database or file.
pub async fn connect<C: BenchConnection>(target: &Target) -> anyhow::Result<C> {
    let (url, session) = target.connection();
    let mut conn = C::establish(&url)
        .await
        .with_context(|| format!("connect to {}", target.describe()))?;
    if !session.is_empty() {
        conn.batch_execute(&session).await?;
    }
    Ok(conn)
}
