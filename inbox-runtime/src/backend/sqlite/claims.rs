//! Claim mode on SQLite: times are UTC text, `YYYY-MM-DD HH:MM:SS.SSS`, which compares
//! in time order; SQLite's clock has millisecond precision. Writers take turns, so a
//! conditional update has no concurrent rival to wait for.

use diesel::QueryResult;
use diesel::sql_types::{Integer, Nullable, Text};
use diesel::sqlite::Sqlite;
use diesel_async::{AsyncConnection, RunQueryDsl};

use crate::backend::claim_statements::{
    Attempt, ClaimKey, ClaimRow, ClaimStatements, NewClaim, StaleRow, update_claim,
};
use crate::backend::prepared::Prepared;

/// Now, in the format leases are stored in.
macro_rules! now {
    () => {
        "strftime('%Y-%m-%d %H:%M:%f', 'now')"
    };
}

/// Microseconds between two times, from their Julian day numbers.
macro_rules! micros_between {
    ($from:expr, $to:expr) => {
        concat!(
            "CAST(ROUND((julianday(",
            $to,
            ") - julianday(",
            $from,
            ")) * 86400000000.0) AS INTEGER)"
        )
    };
}

/// A claim nobody holds: not completed, and released or past its lease.
const STALE: &str = concat!(
    "lease_ends_at IS NOT NULL AND (claim_token IS NULL OR lease_ends_at <= ",
    now!(),
    ")"
);

/// The claim a conditional update is about, by the placeholders after its `SET`.
const BY_KEY: &str = "WHERE message_id = ? AND consumer = ?";

/// Still held by the token in the next placeholder, even past its lease.
const HELD: &str = "claim_token = ? AND lease_ends_at IS NOT NULL";

/// A completed claim: a marker like a transactional handler's, its `processed_at` in
/// the format of the column's default, which `prune` compares against.
const COMPLETED: &str = "lease_ends_at = NULL, processed_at = datetime('now')";

/// A released claim: nobody holds it, and it may be taken over at once.
const RELEASED: &str = concat!("claim_token = NULL, lease_ends_at = ", now!());

/// The `strftime` modifier that moves a time `micros` ahead.
pub(super) fn ahead(micros: i64) -> String {
    format!("+{}.{:06} seconds", micros / 1_000_000, micros % 1_000_000)
}

impl ClaimStatements for Sqlite {
    async fn insert_claim<C>(conn: &mut C, claim: NewClaim) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let inserted = Prepared(
            diesel::sql_query(
                "INSERT INTO inbox (message_id, consumer, lease_ends_at, claim_token, attempts, \
             fingerprint) VALUES (?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now', ?), ?, 1, ?) \
             ON CONFLICT (message_id, consumer) DO NOTHING",
            )
            .bind::<Text, _>(claim.key.message_id)
            .bind::<Text, _>(claim.key.consumer)
            .bind::<Text, _>(ahead(claim.lease_micros))
            .bind::<Text, _>(claim.token)
            .bind::<Nullable<Text>, _>(claim.fingerprint),
        )
        .execute(conn)
        .await?;
        Ok(inserted == 1)
    }

    async fn read_marker<C>(conn: &mut C, key: ClaimKey) -> QueryResult<Option<ClaimRow>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let rows = Prepared(
            diesel::sql_query(concat!(
                "SELECT lease_ends_at IS NULL AS completed, \
             COALESCE(claim_token IS NOT NULL AND lease_ends_at > ",
                now!(),
                ", 0) AS live, \
             lease_ends_at IS NOT NULL AND claim_token IS NULL AS released, ",
                micros_between!(now!(), "lease_ends_at"),
                " AS lease_remaining_micros, attempts, fingerprint \
             FROM inbox WHERE message_id = ? AND consumer = ?"
            ))
            .bind::<Text, _>(key.message_id)
            .bind::<Text, _>(key.consumer),
        )
        .load::<ClaimRow>(conn)
        .await?;
        Ok(rows.into_iter().next())
    }

    async fn take_over<C>(conn: &mut C, claim: NewClaim, seen_attempts: i32) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let taken = Prepared(
            diesel::sql_query(format!(
                "UPDATE inbox SET claim_token = ?, \
             lease_ends_at = strftime('%Y-%m-%d %H:%M:%f', 'now', ?), attempts = attempts + 1 \
             {BY_KEY} AND attempts = ? AND {STALE}"
            ))
            .bind::<Text, _>(claim.token)
            .bind::<Text, _>(ahead(claim.lease_micros))
            .bind::<Text, _>(claim.key.message_id)
            .bind::<Text, _>(claim.key.consumer)
            .bind::<Integer, _>(seen_attempts),
        )
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
        let renewed = Prepared(
            diesel::sql_query(format!(
                "UPDATE inbox SET lease_ends_at = strftime('%Y-%m-%d %H:%M:%f', 'now', ?) \
             {BY_KEY} AND {HELD}"
            ))
            .bind::<Text, _>(ahead(claim.lease_micros))
            .bind::<Text, _>(claim.key.message_id)
            .bind::<Text, _>(claim.key.consumer)
            .bind::<Text, _>(claim.token),
        )
        .execute(conn)
        .await?;
        Ok(renewed == 1)
    }

    async fn release<C>(
        conn: &mut C,
        key: ClaimKey,
        token: String,
        attempt: Attempt,
    ) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let sql = format!(
            "UPDATE inbox SET {RELEASED}{} {BY_KEY} AND {HELD}",
            attempt.counted()
        );
        update_claim!(conn, &sql, key, token)
    }

    async fn list_stale<C>(conn: &mut C) -> QueryResult<Vec<StaleRow>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        Prepared(diesel::sql_query(format!(
            "SELECT message_id, consumer, attempts, claim_token IS NULL AS released, \
             {age} AS age_micros, {idle} AS idle_micros FROM inbox WHERE {STALE} ORDER BY id",
            age = micros_between!("processed_at", now!()),
            idle = micros_between!("lease_ends_at", now!()),
        )))
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
