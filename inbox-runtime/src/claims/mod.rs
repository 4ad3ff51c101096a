//! Claim mode, `#[idempotent(…, claim)]`: exactly-once intent for work that cannot roll
//! back with a transaction, such as sending an e-mail, charging a card or calling a
//! partner's API. The marker commits as a claim with a lease before the body runs, and
//! is completed after it; [the claim-mode guide](https://docs.rs/diesel-inbox/latest/diesel_inbox/guide/claim_mode/index.html) explains the
//! protocol, the lease and what the downstream system must do.
//!
//! Here: [`Claim`], which the body reads, and the operator's side for claims nobody will
//! finish by themselves: [`list_stale`], then [`complete_by_hand`] or
//! [`release_by_hand`] once a person has reconciled the message with the downstream
//! system.

mod operator;
pub(crate) mod protocol;

use std::time::Duration;

use diesel::QueryResult;
use diesel_async::AsyncConnection;

use crate::backend::InboxBackend;
use crate::backend::claim_statements::{ClaimKey, ClaimStatements as _, NewClaim};

pub use crate::error::ClaimError;
pub use operator::{StaleClaim, complete_by_hand, list_stale, release_by_hand};
pub use protocol::{ClaimPolicy, DEFAULT_LEASE, run_claimed};

/// The claim a claim-mode body runs under.
///
/// ```
/// # use inbox_runtime as diesel_inbox;
/// # async fn charge(_: uuid::Uuid) {}
/// # async fn body() {
/// // Inside `#[idempotent(…, claim)]`:
/// let claim = diesel_inbox::Claim::current();
/// // The same key on every attempt: the provider deduplicates a retried charge.
/// charge(claim.idempotency_key()).await;
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    message_id: String,
    consumer: &'static str,
    attempt: u32,
    token: uuid::Uuid,
    lease: Duration,
}

tokio::task_local! {
    /// The claim of the claim-mode body being run; `None` inside a transactional or
    /// batch handler's body, which is no claim's, even within a claim's body.
    static CURRENT: Option<Claim>;
}

/// Derives [`Claim::idempotency_key`]: a fixed namespace, so that the same (consumer,
/// key) gives the same UUID in every process and every version.
const IDEMPOTENCY_NAMESPACE: uuid::Uuid = uuid::uuid!("5d1b6c1e-7c3a-4f0e-9a43-6b1f0d2c8e71");

impl Claim {
    /// The claim of the claim-mode body being run.
    ///
    /// # Panics
    ///
    /// Outside a claim-mode handler's body, including in a task the body spawned (hand
    /// that task a clone instead); [`Claim::try_current`] returns `None` there.
    #[track_caller]
    pub fn current() -> Self {
        Self::try_current().expect(
            "`Claim::current()` is only available inside the body of an \
             `#[idempotent(…, claim)]` handler, on the body's own task",
        )
    }

    /// The claim of the claim-mode body being run, or `None` outside one. A
    /// transactional or batch handler called from a claim's body runs outside it: its
    /// body sees `None`, not the enclosing claim.
    pub fn try_current() -> Option<Self> {
        CURRENT.try_with(Clone::clone).ok().flatten()
    }

    /// The message's key, as stored in the inbox's `message_id` column.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// The handler's consumer name.
    pub fn consumer(&self) -> &'static str {
        self.consumer
    }

    /// Which attempt this is: 1 for the first delivery that claimed the message, one
    /// more for each takeover after a lease ended or a failed body released the claim.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// This attempt's token: it names the holder in the inbox, and changes with every
    /// attempt. Useful to correlate logs; hand the downstream system
    /// [`Claim::idempotency_key`] instead, which does not change.
    pub fn token(&self) -> uuid::Uuid {
        self.token
    }

    /// The key to deduplicate by downstream: a UUID (version 5) of the consumer and the
    /// message's key, the same on every attempt and in every process, so that a call
    /// repeated by a takeover is recognised as the same call. 36 characters as text,
    /// which every provider's idempotency-key header accepts.
    pub fn idempotency_key(&self) -> uuid::Uuid {
        let mut name = Vec::with_capacity(self.consumer.len() + self.message_id.len() + 8);
        // Length-prefixed, so that no two (consumer, key) pairs give the same name.
        name.extend_from_slice(&(self.consumer.len() as u64).to_be_bytes());
        name.extend_from_slice(self.consumer.as_bytes());
        name.extend_from_slice(self.message_id.as_bytes());
        uuid::Uuid::new_v5(&IDEMPOTENCY_NAMESPACE, &name)
    }

    /// Extends the claim: its lease ends the handler's `lease` from now, on the
    /// database's clock. A body that runs in steps longer than the lease calls it
    /// between them, on the connection it was given; past a failed renewal, the next
    /// step would repeat work that another delivery has taken over.
    ///
    /// # Errors
    ///
    /// [`ClaimError::Lost`] when another delivery has taken the claim over, or an
    /// operator has settled it; a database error.
    pub async fn renew<C>(&self, conn: &mut C) -> QueryResult<()>
    where
        C: AsyncConnection,
        C::Backend: InboxBackend,
    {
        // Renewed inside a transaction, the lease would move only if that commits.
        self.outside_a_transaction(conn)?;
        let claim = NewClaim {
            key: ClaimKey {
                message_id: self.message_id.clone(),
                consumer: self.consumer.to_owned(),
            },
            token: self.token.to_string(),
            lease_micros: micros(self.lease),
            fingerprint: None,
        };
        if C::Backend::renew(conn, claim).await? {
            Ok(())
        } else {
            Err(ClaimError::Lost {
                attempt: self.attempt,
            }
            .into())
        }
    }

    /// `Ok` when `conn` is in no transaction (or only in a test transaction, as the
    /// claim found it), where a claim statement takes effect at once;
    /// [`ClaimError::TransactionLeftOpen`] otherwise.
    pub(crate) fn outside_a_transaction<C: AsyncConnection>(
        &self,
        conn: &mut C,
    ) -> QueryResult<()> {
        match crate::enclosing::enclosing_transaction(conn) {
            Ok(_) => Ok(()),
            Err(_) => Err(ClaimError::TransactionLeftOpen {
                attempt: self.attempt,
            }
            .into()),
        }
    }

    pub(crate) async fn scope<F: Future>(self, body: F) -> F::Output {
        CURRENT.scope(Some(self), body).await
    }
}

/// Runs a transactional or batch handler outside any claim, so that one called from a
/// claim's body does not take the claim for its own. The `#[idempotent]` expansion
/// wraps such a handler's run in it.
#[doc(hidden)]
pub async fn outside_any_claim<F: Future>(body: F) -> F::Output {
    CURRENT.scope(None, body).await
}

/// A lease as the statements bind it, in microseconds, saturating far beyond any clock.
fn micros(lease: Duration) -> i64 {
    i64::try_from(lease.as_micros()).unwrap_or(i64::MAX)
}
