//! Claim mode on MySQL and MariaDB: `NOW(6)` on the session's clock, and every statement
//! in autocommit, a transaction of its own.

#![cfg(feature = "mysql")]

use std::future::Future;

use diesel::QueryResult;
use diesel::mysql::Mysql;
use diesel::result::{DatabaseErrorKind, Error};
use diesel::sql_types::{BigInt, Integer, Text};
use diesel_async::{AsyncConnection, RunQueryDsl};

use crate::backend::claim_statements::{
    ClaimKey, ClaimRow, ClaimStatements, NewClaim, StaleRow, update_claim,
};
use crate::backend::queries::hex_digits;

/// A claim nobody holds: not completed, and released or past its lease.
const STALE: &str =
    "lease_ends_at IS NOT NULL AND (claim_token IS NULL OR lease_ends_at <= NOW(6))";

/// The claim a conditional update is about, by the placeholders after its `SET`.
const BY_KEY: &str = "WHERE message_id = ? AND consumer = ?";

/// Still held by the token in the next placeholder, even past its lease.
const HELD: &str = "claim_token = ? AND lease_ends_at IS NOT NULL";

/// A completed claim: a marker like a transactional handler's.
const COMPLETED: &str = "lease_ends_at = NULL, processed_at = NOW(6)";

/// A released claim: nobody holds it, and it may be taken over at once.
const RELEASED: &str = "claim_token = NULL, lease_ends_at = NOW(6)";

impl ClaimStatements for Mysql {
    /// Turns autocommit on for the delivery, in the insert's round trip: a session
    /// with autocommit off (a server's `autocommit = 0`, an `init_connect`) would hold
    /// the claim, and later its completion, in a transaction that nobody commits.
    /// [`end_claim_session`](ClaimStatements::end_claim_session) puts it back. The
    /// setting is kept apart from a transactional handler's, which the claim's body may
    /// call on the same connection.
    async fn insert_claim<C>(conn: &mut C, claim: NewClaim) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // The values go in as literals, so that one text batch carries both statements:
        // the key as hex, as the transactional marker insert sends it; the token is a
        // UUID and the fingerprint hex digits, but go in as hex all the same.
        let fingerprint = match claim.fingerprint {
            Some(fingerprint) => format!("X'{}'", hex_digits(&fingerprint)),
            None => "NULL".to_owned(),
        };
        let batch = format!(
            "SET @diesel_inbox_claim_autocommit = \
             COALESCE(@diesel_inbox_claim_autocommit, @@autocommit), autocommit = 1; \
             INSERT INTO inbox (message_id, consumer, lease_ends_at, claim_token, attempts, \
             fingerprint) VALUES (X'{}', X'{}', NOW(6) + INTERVAL {} MICROSECOND, X'{}', 1, \
             {fingerprint})",
            hex_digits(&claim.key.message_id),
            hex_digits(&claim.key.consumer),
            claim.lease_micros,
            hex_digits(&claim.token),
        );
        // A plain INSERT, as for the transactional marker: a duplicate waits for a
        // concurrent insert of the key, then fails with 1062 on our own table, whose
        // only other unique key is the auto-increment id.
        match conn.batch_execute(&batch).await {
            Ok(()) => Ok(true),
            Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(false),
            Err(other) => Err(other),
        }
    }

    fn end_claim_session<C>(conn: &mut C) -> impl Future<Output = QueryResult<()>> + Send
    where
        C: AsyncConnection<Backend = Self>,
    {
        conn.batch_execute(
            "SET autocommit = COALESCE(@diesel_inbox_claim_autocommit, @@autocommit), \
             @diesel_inbox_claim_autocommit = NULL",
        )
    }

    async fn read_marker<C>(conn: &mut C, key: ClaimKey) -> QueryResult<Option<ClaimRow>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let rows = diesel::sql_query(
            "SELECT lease_ends_at IS NULL AS completed, \
             COALESCE(claim_token IS NOT NULL AND lease_ends_at > NOW(6), FALSE) AS live, \
             lease_ends_at IS NOT NULL AND claim_token IS NULL AS released, \
             TIMESTAMPDIFF(MICROSECOND, NOW(6), lease_ends_at) AS lease_remaining_micros, \
             attempts, fingerprint FROM inbox WHERE message_id = ? AND consumer = ?",
        )
        .bind::<Text, _>(key.message_id)
        .bind::<Text, _>(key.consumer)
        .load::<ClaimRow>(conn)
        .await?;
        Ok(rows.into_iter().next())
    }

    async fn take_over<C>(conn: &mut C, claim: NewClaim, seen_attempts: i32) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // An UPDATE reads the latest committed row under its lock: a second taker waits
        // for the first, then finds the attempt count moved on. Affected rows count
        // matched rows here (CLIENT_FOUND_ROWS), and a match always changes the row.
        let taken = diesel::sql_query(format!(
            "UPDATE inbox SET claim_token = ?, \
             lease_ends_at = NOW(6) + INTERVAL ? MICROSECOND, attempts = attempts + 1 \
             {BY_KEY} AND attempts = ? AND {STALE}"
        ))
        .bind::<Text, _>(claim.token)
        .bind::<BigInt, _>(claim.lease_micros)
        .bind::<Text, _>(claim.key.message_id)
        .bind::<Text, _>(claim.key.consumer)
        .bind::<Integer, _>(seen_attempts)
        .execute(conn)
        .await?;
        Ok(taken == 1)
    }

    async fn complete<C>(conn: &mut C, key: ClaimKey, token: String) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let sql = format!("UPDATE inbox SET {COMPLETED} {BY_KEY} AND {HELD}");
        update_claim!(conn, &sql, key, token)
    }

    async fn renew<C>(conn: &mut C, claim: NewClaim) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let renewed = diesel::sql_query(format!(
            "UPDATE inbox SET lease_ends_at = NOW(6) + INTERVAL ? MICROSECOND {BY_KEY} AND {HELD}"
        ))
        .bind::<BigInt, _>(claim.lease_micros)
        .bind::<Text, _>(claim.key.message_id)
        .bind::<Text, _>(claim.key.consumer)
        .bind::<Text, _>(claim.token)
        .execute(conn)
        .await?;
        Ok(renewed == 1)
    }

    async fn release<C>(conn: &mut C, key: ClaimKey, token: String) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let sql = format!("UPDATE inbox SET {RELEASED} {BY_KEY} AND {HELD}");
        update_claim!(conn, &sql, key, token)
    }

    async fn list_stale<C>(conn: &mut C) -> QueryResult<Vec<StaleRow>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        diesel::sql_query(format!(
            "SELECT message_id, consumer, attempts, claim_token IS NULL AS released, \
             TIMESTAMPDIFF(MICROSECOND, processed_at, NOW(6)) AS age_micros, \
             TIMESTAMPDIFF(MICROSECOND, lease_ends_at, NOW(6)) AS idle_micros \
             FROM inbox WHERE {STALE} ORDER BY id"
        ))
        .load(conn)
        .await
    }

    async fn complete_stale<C>(conn: &mut C, key: ClaimKey) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let sql = format!("UPDATE inbox SET {COMPLETED} {BY_KEY} AND {STALE}");
        update_claim!(conn, &sql, key)
    }

    async fn release_stale<C>(conn: &mut C, key: ClaimKey) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let sql = format!("UPDATE inbox SET {RELEASED}, attempts = 0 {BY_KEY} AND {STALE}");
        update_claim!(conn, &sql, key)
    }
}
