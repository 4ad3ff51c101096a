//! Claim mode on MySQL and MariaDB: `NOW(6)` on the session's clock, and every statement
//! in autocommit, a transaction of its own.

#![cfg(feature = "mysql")]

use diesel::QueryResult;
use diesel::mysql::Mysql;
use diesel::result::{DatabaseErrorKind, Error};
use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use diesel_async::{AsyncConnection, RunQueryDsl};

use crate::backend::claim_statements::{ClaimKey, ClaimRow, ClaimStatements, NewClaim, StaleRow};

/// A claim nobody holds: not completed, and released or past its lease.
const STALE: &str =
    "lease_ends_at IS NOT NULL AND (claim_token IS NULL OR lease_ends_at <= NOW(6))";

impl ClaimStatements for Mysql {
    async fn insert_claim<C>(conn: &mut C, claim: NewClaim) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // A plain INSERT, as for the transactional marker: a duplicate waits for a
        // concurrent insert of the key, then fails with 1062 on our own table, whose
        // only other unique key is the auto-increment id.
        let insert = diesel::sql_query(
            "INSERT INTO inbox (message_id, consumer, lease_ends_at, claim_token, attempts, \
             fingerprint) VALUES (?, ?, NOW(6) + INTERVAL ? MICROSECOND, ?, 1, ?)",
        )
        .bind::<Text, _>(claim.key.message_id)
        .bind::<Text, _>(claim.key.consumer)
        .bind::<BigInt, _>(claim.lease_micros)
        .bind::<Text, _>(claim.token)
        .bind::<Nullable<Text>, _>(claim.fingerprint)
        .execute(conn)
        .await;
        match insert {
            Ok(_) => Ok(true),
            Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(false),
            Err(other) => Err(other),
        }
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
             WHERE message_id = ? AND consumer = ? AND attempts = ? AND {STALE}"
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
        let completed = diesel::sql_query(
            "UPDATE inbox SET lease_ends_at = NULL, processed_at = NOW(6) \
             WHERE message_id = ? AND consumer = ? AND claim_token = ? \
             AND lease_ends_at IS NOT NULL",
        )
        .bind::<Text, _>(key.message_id)
        .bind::<Text, _>(key.consumer)
        .bind::<Text, _>(token)
        .execute(conn)
        .await?;
        Ok(completed == 1)
    }

    async fn renew<C>(conn: &mut C, claim: NewClaim) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let renewed = diesel::sql_query(
            "UPDATE inbox SET lease_ends_at = NOW(6) + INTERVAL ? MICROSECOND \
             WHERE message_id = ? AND consumer = ? AND claim_token = ? \
             AND lease_ends_at IS NOT NULL",
        )
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
        let released = diesel::sql_query(
            "UPDATE inbox SET claim_token = NULL, lease_ends_at = NOW(6) \
             WHERE message_id = ? AND consumer = ? AND claim_token = ? \
             AND lease_ends_at IS NOT NULL",
        )
        .bind::<Text, _>(key.message_id)
        .bind::<Text, _>(key.consumer)
        .bind::<Text, _>(token)
        .execute(conn)
        .await?;
        Ok(released == 1)
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
        let completed = diesel::sql_query(format!(
            "UPDATE inbox SET lease_ends_at = NULL, processed_at = NOW(6) \
             WHERE message_id = ? AND consumer = ? AND {STALE}"
        ))
        .bind::<Text, _>(key.message_id)
        .bind::<Text, _>(key.consumer)
        .execute(conn)
        .await?;
        Ok(completed == 1)
    }

    async fn release_stale<C>(conn: &mut C, key: ClaimKey) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let released = diesel::sql_query(format!(
            "UPDATE inbox SET claim_token = NULL, lease_ends_at = NOW(6), attempts = 0 \
             WHERE message_id = ? AND consumer = ? AND {STALE}"
        ))
        .bind::<Text, _>(key.message_id)
        .bind::<Text, _>(key.consumer)
        .execute(conn)
        .await?;
        Ok(released == 1)
    }
}
