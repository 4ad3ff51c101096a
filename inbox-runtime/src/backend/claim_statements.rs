//! The statements of claim mode, which each backend writes in its own SQL (in
//! `crate::claims`): leases are set and compared on the database's clock, whose
//! arithmetic differs.
//!
//! Every statement runs on its own, outside a transaction, and commits by itself,
//! whatever the session's settings: a claim must be visible to every other delivery
//! before the body makes its external call, and must outlive a crash during it. None
//! changes the session, so that nothing needs putting back however the delivery ends.

use std::future::Future;

use diesel::QueryResult;
use diesel::sql_types::{BigInt, Bool, Integer, Nullable, Text};
use diesel_async::AsyncConnection;

/// What became of the attempt whose claim is released: the attempt count says how
/// many times the body was started, which `max_attempts` bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// The body ran, and failed: the attempt counts.
    BodyFailed,
    /// The body never started: the attempt is taken back.
    BodyNeverStarted,
}

impl Attempt {
    /// What a release's `SET` clause adds, after the backend's own.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    pub(crate) fn counted(self) -> &'static str {
        match self {
            Self::BodyFailed => "",
            Self::BodyNeverStarted => ", attempts = attempts - 1",
        }
    }
}

/// The (message, consumer) a claim statement is about.
#[derive(Debug, Clone)]
pub struct ClaimKey {
    pub message_id: String,
    pub consumer: String,
}

/// A claim to insert, or to take over with.
#[derive(Debug, Clone)]
pub struct NewClaim {
    pub key: ClaimKey,
    pub token: String,
    pub lease_micros: i64,
    pub fingerprint: Option<String>,
}

/// A marker as a claim-mode delivery, or a duplicate with a fingerprint, reads it.
#[derive(Debug, diesel::QueryableByName)]
pub struct ClaimRow {
    /// Completed: a transactional marker, or a claim whose body finished.
    #[diesel(sql_type = Bool)]
    pub completed: bool,
    /// Held by a holder whose lease has not ended.
    #[diesel(sql_type = Bool)]
    pub live: bool,
    /// Released by a failed body: no holder, takeable at once.
    #[diesel(sql_type = Bool)]
    pub released: bool,
    /// Until the lease ends; negative once it has.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub lease_remaining_micros: Option<i64>,
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    #[diesel(sql_type = Nullable<Text>)]
    pub fingerprint: Option<String>,
}

/// A claim nobody holds, as the operator's listing reads it.
#[derive(Debug, diesel::QueryableByName)]
pub struct StaleRow {
    #[diesel(sql_type = Text)]
    pub message_id: String,
    #[diesel(sql_type = Text)]
    pub consumer: String,
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    #[diesel(sql_type = Bool)]
    pub released: bool,
    #[diesel(sql_type = BigInt)]
    pub age_micros: i64,
    #[diesel(sql_type = BigInt)]
    pub idle_micros: i64,
}

/// What claim mode needs of a backend, out of reach of other crates.
pub trait ClaimStatements: diesel::backend::Backend + Sized {
    /// Inserts the marker as a claim held by `claim.token`, attempt 1; `Ok(false)` when
    /// a marker with this key is already there.
    fn insert_claim<C>(
        conn: &mut C,
        claim: NewClaim,
    ) -> impl Future<Output = QueryResult<bool>> + Send
    where
        C: AsyncConnection<Backend = Self>;

    /// The committed marker with this key, if any, claim or not.
    fn read_marker<C>(
        conn: &mut C,
        key: ClaimKey,
    ) -> impl Future<Output = QueryResult<Option<ClaimRow>>> + Send
    where
        C: AsyncConnection<Backend = Self>;

    /// [`read_marker`](Self::read_marker) from the database's latest commits, where a
    /// read may lag behind them (a Galera node that has not yet applied another's
    /// writes): for a refusal that no later write corrects.
    fn read_latest_marker<C>(
        conn: &mut C,
        key: ClaimKey,
    ) -> impl Future<Output = QueryResult<Option<ClaimRow>>> + Send
    where
        C: AsyncConnection<Backend = Self>,
    {
        Self::read_marker(conn, key)
    }

    /// Takes over a claim that nobody holds (its lease has ended, or a failed body
    /// released it) and that is still at `seen_attempts`: of any number of deliveries
    /// that saw the same attempt, exactly one gets `Ok(true)`. The winner holds it as
    /// attempt `seen_attempts + 1`.
    ///
    /// Two conditions guard it, and each covers the other: the attempt count still
    /// `seen_attempts` (a second taker finds it moved on) and the claim still nobody's
    /// (a second taker finds a live lease). Either alone passes every test; keep both,
    /// so that a mistake in one, say a clock skew in the lease, is not a double call.
    /// Without both, `many_takers` fails.
    fn take_over<C>(
        conn: &mut C,
        claim: NewClaim,
        seen_attempts: i32,
    ) -> impl Future<Output = QueryResult<bool>> + Send
    where
        C: AsyncConnection<Backend = Self>;

    /// Completes the claim if `token` still holds it, even past its lease: nobody else
    /// has run the body since.
    fn complete<C>(
        conn: &mut C,
        key: ClaimKey,
        token: String,
    ) -> impl Future<Output = QueryResult<bool>> + Send
    where
        C: AsyncConnection<Backend = Self>;

    /// Moves the lease's end to `lease_micros` from now, if `token` still holds the claim.
    fn renew<C>(conn: &mut C, claim: NewClaim) -> impl Future<Output = QueryResult<bool>> + Send
    where
        C: AsyncConnection<Backend = Self>;

    /// Releases the claim if `token` still holds it: it ends the lease now and clears
    /// the holder, keeping the attempt count, or taking the attempt back where its body
    /// never started.
    fn release<C>(
        conn: &mut C,
        key: ClaimKey,
        token: String,
        attempt: Attempt,
    ) -> impl Future<Output = QueryResult<bool>> + Send
    where
        C: AsyncConnection<Backend = Self>;

    /// Every claim nobody holds, oldest first.
    fn list_stale<C>(conn: &mut C) -> impl Future<Output = QueryResult<Vec<StaleRow>>> + Send
    where
        C: AsyncConnection<Backend = Self>;

    /// Completes a claim nobody holds, as a person decided.
    fn complete_stale<C>(
        conn: &mut C,
        key: ClaimKey,
    ) -> impl Future<Output = QueryResult<bool>> + Send
    where
        C: AsyncConnection<Backend = Self>;

    /// Releases a claim nobody holds with its attempts reset, as a person decided: the
    /// next delivery runs the body as attempt 1.
    fn release_stale<C>(
        conn: &mut C,
        key: ClaimKey,
    ) -> impl Future<Output = QueryResult<bool>> + Send
    where
        C: AsyncConnection<Backend = Self>;
}

/// Runs `$sql`, a conditional `UPDATE` of one claim whose placeholders are the message
/// id, the consumer and, where given, the holder's token, in that order: `Ok(true)` when
/// it matched the row. A macro rather than a generic function: diesel names neither the
/// bound query's type nor the backend trait that such a function's bounds would need.
/// (PostgreSQL binds the key as bytes, and MySQL with its digest, with macros of their own.)
#[cfg(feature = "sqlite")]
macro_rules! update_claim {
    ($conn:expr, $sql:expr, $key:expr $(, $token:expr)?) => {{
        let query = $crate::backend::prepared::Prepared(::diesel::sql_query($sql)
            .bind::<::diesel::sql_types::Text, _>($key.message_id)
            .bind::<::diesel::sql_types::Text, _>($key.consumer)
            $(.bind::<::diesel::sql_types::Text, _>($token))?);
        let updated = ::diesel_async::RunQueryDsl::execute(query, $conn).await?;
        Ok(updated == 1)
    }};
}
#[cfg(feature = "sqlite")]
pub(crate) use update_claim;
