//! Claim mode on MySQL and MariaDB: times in UTC (`UTC_TIMESTAMP(6)`), whatever the
//! session's `time_zone`, and each statement followed by a `COMMIT` of its own, so that
//! it commits whatever the session's autocommit setting, which claim mode never changes.
//!
//! `DATETIME` holds no zone, and `NOW(6)` is the session's local time: a lease written
//! by a session at `+00:00` and judged by one at `+13:00` had ended 13 hours early, and
//! was taken over while its body ran.

use diesel::QueryResult;
use diesel::mysql::Mysql;
use diesel::result::{DatabaseErrorKind, Error};
use diesel::sql_types::{BigInt, Integer, Text};
use diesel_async::{AsyncConnection, RunQueryDsl};

use crate::backend::claim_statements::{
    Attempt, ClaimKey, ClaimRow, ClaimStatements, NewClaim, StaleRow,
};
use crate::backend::prepared::Prepared;
use crate::backend::queries::hex_digits;

use super::EVERY_ROW;
use super::call::Call;

/// A claim nobody holds: not completed, and released or past its lease.
const STALE: &str =
    "lease_ends_at IS NOT NULL AND (claim_token IS NULL OR lease_ends_at <= UTC_TIMESTAMP(6))";

// The claim a conditional update is about, by the four placeholders after its `SET`.
use super::markers::{BY_KEY, bind_key, bytes_of_placeholder};

/// A conditional update of the claim [`BY_KEY`] names, still held by `token` where given;
/// whether it updated the row.
macro_rules! update_claim_by_key {
    ($conn:expr, $sql:expr, $key:expr $(, $token:expr)?) => {{
        let query = Prepared(
            bind_key!(diesel::sql_query($sql), $key.message_id, $key.consumer)
                $(.bind::<Text, _>(hex_digits(&$token)))?
        );
        query.execute($conn).await.map(|updated| updated == 1)
    }};
}

/// Still held by the token in the next placeholder (as [`hex_digits`], as keys are:
/// a text parameter is converted into the session's connection character set, which a
/// binary column compares byte for byte), even past its lease.
const HELD: &str = concat!(
    "claim_token = ",
    bytes_of_placeholder!(),
    " AND lease_ends_at IS NOT NULL"
);

/// A completed claim: a marker like a transactional handler's.
const COMPLETED: &str = "lease_ends_at = NULL, processed_at = UTC_TIMESTAMP(6)";

/// A released claim: nobody holds it, and it may be taken over at once.
const RELEASED: &str = "claim_token = NULL, lease_ends_at = UTC_TIMESTAMP(6)";

impl ClaimStatements for Mysql {
    /// The insert and its [`COMMIT`](Call::committed) in one round trip.
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
        let call = Call::start(conn)?;
        let batch = format!(
            "INSERT INTO inbox (message_id, consumer, lease_ends_at, claim_token, attempts, \
             fingerprint) VALUES (X'{}', X'{}', UTC_TIMESTAMP(6) + INTERVAL {} MICROSECOND, \
             X'{}', 1, {fingerprint}){commit}",
            hex_digits(&claim.key.message_id),
            hex_digits(&claim.key.consumer),
            claim.lease_micros,
            hex_digits(&claim.token),
            commit = if call.commits { "; COMMIT" } else { "" },
        );
        // A plain INSERT, as for the transactional marker: a duplicate waits for a
        // concurrent insert of the key, then fails with 1062 on our own table, whose
        // only other unique key is the auto-increment id. The batch stops there, before
        // its COMMIT: with autocommit off, the transaction that the failed insert opened
        // holds a lock on the row found until [`read_marker`](Self::read_marker),
        // which always comes next, commits.
        let inserted = match conn.batch_execute(&batch).await {
            Ok(()) => Ok(true),
            Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => {
                let ClaimKey {
                    message_id,
                    consumer,
                } = &claim.key;
                // Processed or not, the claim protocol reads the marker and judges it.
                super::markers::confirm_duplicate(conn, message_id, consumer)
                    .await
                    .map(|_| false)
            }
            Err(other) => Err(other),
        };
        call.answered(conn, inserted)
    }

    async fn read_marker<C>(conn: &mut C, key: ClaimKey) -> QueryResult<Option<ClaimRow>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        read_claim_row(conn, key, READ_MARKER).await
    }

    /// On a Galera node, with `wsrep_sync_wait` for the statement: the node first applies
    /// everything the cluster committed before it. MariaDB alone runs the `/*M! */`
    /// comment; a build without wsrep, which lacks the variable, reads as it is.
    async fn read_latest_marker<C>(conn: &mut C, key: ClaimKey) -> QueryResult<Option<ClaimRow>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let synced = format!("/*M! SET STATEMENT wsrep_sync_wait = 1 FOR */ {READ_MARKER}");
        match read_claim_row(conn, key.clone(), &synced).await {
            Err(Error::DatabaseError(_, info)) if info.message().contains("wsrep_sync_wait") => {
                read_claim_row(conn, key, READ_MARKER).await
            }
            read => read,
        }
    }

    async fn take_over<C>(conn: &mut C, claim: NewClaim, seen_attempts: i32) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        // An UPDATE reads the latest committed row under its lock: a second taker waits
        // for the first, then finds the attempt count moved on. Affected rows count
        // matched rows here (CLIENT_FOUND_ROWS), and a match always changes the row.
        let call = Call::start(conn)?;
        let taken = Prepared(
            bind_key!(
                diesel::sql_query(format!(
                    "UPDATE inbox SET claim_token = {token}, \
             lease_ends_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, attempts = attempts + 1 \
             {BY_KEY} AND attempts = ? AND {STALE}",
                    token = bytes_of_placeholder!()
                ))
                .bind::<Text, _>(hex_digits(&claim.token))
                .bind::<BigInt, _>(claim.lease_micros),
                claim.key.message_id,
                claim.key.consumer
            )
            .bind::<Integer, _>(seen_attempts),
        )
        .execute(&mut *conn)
        .await;
        call.committed(conn, taken.map(|rows| rows == 1)).await
    }

    async fn complete<C>(conn: &mut C, key: ClaimKey, token: String) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let sql = format!("UPDATE inbox SET {COMPLETED} {BY_KEY} AND {HELD}");
        let call = Call::start(conn)?;
        let updated = update_claim_by_key!(&mut *conn, &sql, key, token);
        call.committed(conn, updated).await
    }

    async fn renew<C>(conn: &mut C, claim: NewClaim) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let call = Call::start(conn)?;
        let renewed = Prepared(
            bind_key!(
                diesel::sql_query(format!(
                    "UPDATE inbox SET lease_ends_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
                     {BY_KEY} AND {HELD}"
                ))
                .bind::<BigInt, _>(claim.lease_micros),
                claim.key.message_id,
                claim.key.consumer
            )
            .bind::<Text, _>(hex_digits(&claim.token)),
        )
        .execute(&mut *conn)
        .await;
        call.committed(conn, renewed.map(|rows| rows == 1)).await
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
        let call = Call::start(conn)?;
        let updated = update_claim_by_key!(&mut *conn, &sql, key, token);
        call.committed(conn, updated).await
    }

    async fn list_stale<C>(conn: &mut C) -> QueryResult<Vec<StaleRow>>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let call = Call::start(conn)?;
        let stale = Prepared(diesel::sql_query(format!(
            "SELECT message_id, consumer, attempts, claim_token IS NULL AS released, \
             TIMESTAMPDIFF(MICROSECOND, processed_at, UTC_TIMESTAMP(6)) AS age_micros, \
             TIMESTAMPDIFF(MICROSECOND, lease_ends_at, UTC_TIMESTAMP(6)) AS idle_micros \
             FROM inbox WHERE {STALE} ORDER BY id {EVERY_ROW}"
        )))
        .load(&mut *conn)
        .await;
        call.answered(conn, stale)
    }

    async fn complete_stale<C>(conn: &mut C, key: ClaimKey) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let sql = format!("UPDATE inbox SET {COMPLETED} {BY_KEY} AND {STALE}");
        let call = Call::start(conn)?;
        let updated = update_claim_by_key!(&mut *conn, &sql, key);
        call.committed(conn, updated).await
    }

    async fn release_stale<C>(conn: &mut C, key: ClaimKey) -> QueryResult<bool>
    where
        C: AsyncConnection<Backend = Self>,
    {
        let sql = format!("UPDATE inbox SET {RELEASED}, attempts = 0 {BY_KEY} AND {STALE}");
        let call = Call::start(conn)?;
        let updated = update_claim_by_key!(&mut *conn, &sql, key);
        call.committed(conn, updated).await
    }
}

/// The claim as [`ClaimStatements::read_marker`] reads it, [`BY_KEY`]'s placeholders last.
const READ_MARKER: &str = "SELECT lease_ends_at IS NULL AS completed, \
     COALESCE(claim_token IS NOT NULL AND lease_ends_at > UTC_TIMESTAMP(6), FALSE) AS live, \
     lease_ends_at IS NOT NULL AND claim_token IS NULL AS released, \
     TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), lease_ends_at) AS lease_remaining_micros, \
     attempts, fingerprint FROM inbox ";

/// Runs `sql`, [`READ_MARKER`] or a form of it, then commits.
async fn read_claim_row<C>(conn: &mut C, key: ClaimKey, sql: &str) -> QueryResult<Option<ClaimRow>>
where
    C: AsyncConnection<Backend = Mysql>,
{
    let call = Call::start(conn)?;
    let rows = Prepared(bind_key!(
        diesel::sql_query(format!("{sql}{BY_KEY} LIMIT 1")),
        key.message_id,
        key.consumer
    ))
    .load::<ClaimRow>(&mut *conn)
    .await;
    call.committed(conn, rows.map(|rows| rows.into_iter().next()))
        .await
}
