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

pub use crate::body_scope::Claim;
pub use crate::error::ClaimError;
pub use operator::{StaleClaim, complete_by_hand, list_stale, release_by_hand};
pub use protocol::{ClaimPolicy, DEFAULT_LEASE};

impl Claim {
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
}

/// A lease as the statements bind it, in microseconds, saturating far beyond any clock.
fn micros(lease: Duration) -> i64 {
    i64::try_from(lease.as_micros()).unwrap_or(i64::MAX)
}
