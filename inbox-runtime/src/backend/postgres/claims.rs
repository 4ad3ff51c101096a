//! Claim mode on PostgreSQL: every statement here is a transaction of its own, and
//! its time is `statement_timestamp()`, the statement's start. (`now()`, the
//! transaction's start, is the same there, but stood still inside a test transaction:
//! a lease never ended in a test.)

use diesel::QueryResult;
use diesel::pg::Pg;
use diesel::sql_types::{BigInt, Bytea, Integer, Nullable, Text};
use diesel_async::{AsyncConnection, RunQueryDsl};

use crate::backend::claim_statements::{
    Attempt, ClaimKey, ClaimRow, ClaimStatements, NewClaim, StaleRow,
};
use crate::backend::prepared::Prepared;

// The claim a statement is about, by its placeholders `$1` and `$2`: the key and the
// consumer as UTF-8 bytes, which no `client_encoding` converts on their way in (bound as
// text, LATIN1 would store "é" as "Ã©", and another session's key could meet it).
use super::markers::BY_KEY;

/// A conditional update of the claim [`BY_KEY`] names, still held by `token` where given;
/// whether it updated the row.
macro_rules! update_claim_by_bytes {
    ($conn:expr, $sql:expr, $key:expr $(, $token:expr)?) => {{
        let query = Prepared(diesel::sql_query($sql)
            .bind::<Bytea, _>($key.message_id.into_bytes())
            .bind::<Bytea, _>($key.consumer.into_bytes())
            $(.bind::<Text, _>($token))?);
        let updated = query.execute($conn).await?;
        Ok(updated == 1)
    }};
}

/// A claim nobody holds: not completed, and released or past its lease.
const STALE: &str = "lease_ends_at IS NOT NULL AND (claim_token IS NULL OR lease_ends_at <= pg_catalog.statement_timestamp())";

/// Still held by the token `$3`, even past its lease.
const HELD: &str = "claim_token = $3 AND lease_ends_at IS NOT NULL";

/// A completed claim: a marker like a transactional handler's.
const COMPLETED: &str = "lease_ends_at = NULL, processed_at = pg_catalog.statement_timestamp()";

/// A released claim: nobody holds it, and it may be taken over at once.
const RELEASED: &str = "claim_token = NULL, lease_ends_at = pg_catalog.statement_timestamp()";

impl ClaimStatements for Pg {
    async fn insert_claim<C>(conn: &mut C, claim: NewClaim) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // ON CONFLICT DO NOTHING waits for a concurrent insert of the same key, like
        // the transactional handlers' marker insert, and raises no error to log.
        let (message_id, consumer) = (claim.key.message_id.clone(), claim.key.consumer.clone());
        let inserted = Prepared(diesel::sql_query(
            "INSERT INTO inbox (message_id, consumer, lease_ends_at, claim_token, attempts, \
             fingerprint) VALUES (pg_catalog.convert_from($1, 'UTF8'), pg_catalog.convert_from($2, 'UTF8'), pg_catalog.statement_timestamp() + $3 * INTERVAL '1 microsecond', $4, 1, $5) \
             ON CONFLICT DO NOTHING",
        )
        .bind::<Bytea, _>(claim.key.message_id.into_bytes())
        .bind::<Bytea, _>(claim.key.consumer.into_bytes())
        .bind::<BigInt, _>(claim.lease_micros)
        .bind::<Text, _>(claim.token)
        .bind::<Nullable<Text>, _>(claim.fingerprint))
        .execute(conn)
        .await?;
        if inserted == 1 {
            return Ok(true);
        }
        // Processed or not, the claim protocol reads the marker and judges it.
        super::markers::confirm_duplicate(conn, &message_id, &consumer).await?;
        Ok(false)
    }

    async fn read_marker<C>(conn: &mut C, key: ClaimKey) -> QueryResult<Option<ClaimRow>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let rows = Prepared(
            diesel::sql_query(format!(
                "SELECT lease_ends_at IS NULL AS completed, \
             COALESCE(claim_token IS NOT NULL AND lease_ends_at > pg_catalog.statement_timestamp(), false) AS live, \
             lease_ends_at IS NOT NULL AND claim_token IS NULL AS released, \
             CAST(EXTRACT(EPOCH FROM lease_ends_at - pg_catalog.statement_timestamp()) * 1000000 AS bigint) \
             AS lease_remaining_micros, attempts, fingerprint \
             FROM inbox {BY_KEY}"
            ))
            .bind::<Bytea, _>(key.message_id.into_bytes())
            .bind::<Bytea, _>(key.consumer.into_bytes()),
        )
        .load::<ClaimRow>(conn)
        .await?;
        Ok(rows.into_iter().next())
    }

    async fn take_over<C>(conn: &mut C, claim: NewClaim, seen_attempts: i32) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // A second taker waits for the first one's row lock, then finds the attempt
        // count moved on: READ COMMITTED re-checks the condition on the new row.
        let taken = Prepared(
            diesel::sql_query(format!(
                "UPDATE inbox SET claim_token = $3, \
             lease_ends_at = pg_catalog.statement_timestamp() + $4 * INTERVAL '1 microsecond', attempts = attempts + 1 \
             {BY_KEY} AND attempts = $5 AND {STALE}"
            ))
            .bind::<Bytea, _>(claim.key.message_id.into_bytes())
            .bind::<Bytea, _>(claim.key.consumer.into_bytes())
            .bind::<Text, _>(claim.token)
            .bind::<BigInt, _>(claim.lease_micros)
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
        update_claim_by_bytes!(conn, &sql, key, token)
    }

    async fn renew<C>(conn: &mut C, claim: NewClaim) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let renewed = Prepared(
            diesel::sql_query(format!(
                "UPDATE inbox SET lease_ends_at = pg_catalog.statement_timestamp() + $4 * INTERVAL '1 microsecond' \
             {BY_KEY} AND {HELD}"
            ))
            .bind::<Bytea, _>(claim.key.message_id.into_bytes())
            .bind::<Bytea, _>(claim.key.consumer.into_bytes())
            .bind::<Text, _>(claim.token)
            .bind::<BigInt, _>(claim.lease_micros),
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
        update_claim_by_bytes!(conn, &sql, key, token)
    }

    async fn list_stale<C>(conn: &mut C) -> QueryResult<Vec<StaleRow>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        Prepared(diesel::sql_query(format!(
            "SELECT message_id, consumer, attempts, claim_token IS NULL AS released, \
             CAST(EXTRACT(EPOCH FROM pg_catalog.statement_timestamp() - processed_at) * 1000000 AS bigint) AS age_micros, \
             CAST(EXTRACT(EPOCH FROM pg_catalog.statement_timestamp() - lease_ends_at) * 1000000 AS bigint) AS idle_micros \
             FROM inbox WHERE {STALE} ORDER BY id"
        )))
        .load(conn)
        .await
    }

    async fn complete_stale<C>(conn: &mut C, key: ClaimKey) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let sql = format!("UPDATE inbox SET {COMPLETED} {BY_KEY} AND {STALE}");
        update_claim_by_bytes!(conn, &sql, key)
    }

    async fn release_stale<C>(conn: &mut C, key: ClaimKey) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let sql = format!("UPDATE inbox SET {RELEASED}, attempts = 0 {BY_KEY} AND {STALE}");
        update_claim_by_bytes!(conn, &sql, key)
    }
}
