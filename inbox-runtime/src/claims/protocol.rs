//! The claim, the body and the completion, as `#[idempotent(…, claim)]` runs them.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use diesel::result::Error;
use diesel_async::AsyncConnection;
use tracing::Instrument as _;

use super::{Claim, micros};
use crate::backend::InboxBackend;
use crate::backend::claim_statements::{
    Attempt, ClaimKey, ClaimRow, ClaimStatements as _, NewClaim,
};
use crate::backend::sealed::Sealed as _;
use crate::body_scope::{DropScope, Scope};
use crate::classify::classify;
use crate::enclosing::enclosing_for_delivery;
use crate::error::{ClaimError, InboxError};
use crate::fingerprint::{self, Fingerprint};
use crate::handler::Handler;
use crate::key::InvalidKey;
use crate::outcome::Outcome;
use crate::report;
use crate::session_check;
use crate::step::{Begun, Ended, Step};
use crate::verdict::HandlerErrorType;

/// How long a claim is held when the handler sets no `lease`: five minutes.
///
/// The lease must outlast the body, external call and its retries included: a body
/// still running when its lease ends can be taken over, and the call then happens
/// twice at once (the downstream system must dedupe it by the idempotency key either
/// way). A lease too long only delays the redelivery after a crash, which is the
/// cheaper mistake. Five minutes covers an HTTP client's usual 30 s timeout several
/// times over, and is short beside brokers' redelivery windows (SQS retains messages
/// for days, JetStream redelivers until `MaxDeliver`).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(300);

/// Leases longer than this are rejected: a claim held for a week outlives every
/// broker's redelivery, so nothing would ever take it over.
const LONGEST_LEASE: Duration = Duration::from_secs(7 * 24 * 3600);

/// Takes after a takeover lost to another delivery, before giving up as in progress.
const ACQUIRE_ROUNDS: usize = 4;

/// Renewals of a claim whose statement took so long to commit that less than half its
/// lease was left, before giving it up as `ClaimError::LeaseUsedUp`.
const LEASE_RENEWALS: usize = 3;

/// A claim-mode handler's `lease`, `max_attempts` and `takeover`.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimPolicy {
    lease: Duration,
    max_attempts: Option<u32>,
    takeover: bool,
}

impl ClaimPolicy {
    #[doc(hidden)]
    pub const fn new(lease: Option<Duration>, max_attempts: Option<u32>, takeover: bool) -> Self {
        Self {
            lease: match lease {
                Some(lease) => lease,
                None => DEFAULT_LEASE,
            },
            max_attempts,
            takeover,
        }
    }
}

/// Why the body does not run for this delivery.
pub(crate) enum NotRun {
    Duplicate,
    InProgress(Option<Duration>),
    Database(Error),
}

impl From<Error> for NotRun {
    fn from(error: Error) -> Self {
        Self::Database(error)
    }
}

/// A claim this delivery holds, with the lease the body needs left on it.
pub(crate) struct Held {
    claim: Claim,
    key: ClaimKey,
}

/// Begins a delivery that runs its body under a claim on (`message_id`, `consumer`): at
/// most one delivery at a time, until one completes it. The `#[idempotent(…, claim)]`
/// expansion awaits this, then its body in [`Claimed::body`], then [`Claimed::close`];
/// [the module's documentation](crate::claims) describes the protocol.
///
/// As in the transactional mode, the steps are boxed and `Send`, so that the handler's
/// future is `Send` exactly when its body's is.
pub fn claim_delivery<'c, C>(
    conn: &'c mut C,
    handler: &'static Handler,
    message_id: Result<String, InvalidKey>,
    policy: ClaimPolicy,
    fingerprint: Option<Fingerprint>,
) -> Step<'c, Result<Claimed<C>, NotClaimed>>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let delivery = ClaimDelivery::start(handler, message_id.as_deref().ok());
    Step::new(async move {
        let consumer = handler.registration.consumer;
        let claimed = claim(conn, consumer, message_id, policy, fingerprint);
        match claimed.instrument(delivery.span.clone()).await {
            Ok(held) => {
                let scope = DropScope::new(Scope::claimed(held.claim.clone()), &delivery.span);
                let settling = Settling { delivery, held };
                Ok(Begun::new(settling, scope, settle_step::<C>))
            }
            Err(not_run) => Err(NotClaimed { delivery, not_run }),
        }
    })
}

/// A delivery that holds its claim: what the handler's future holds while its body runs.
/// Its `close` completes the claim when the body succeeded, and releases it otherwise so
/// that the next delivery runs at once.
pub type Claimed<C> = Begun<C, Settling, Settled>;

/// What the settle step needs.
#[doc(hidden)]
pub struct Settling {
    delivery: ClaimDelivery,
    held: Held,
}

fn settle_step<C>(conn: &mut C, settling: Settling, succeeded: bool) -> Step<'_, Settled>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let Settling { delivery, held } = settling;
    Step::new(async move {
        let settled = settle(conn, held, succeeded)
            .instrument(delivery.span.clone())
            .await;
        Settled { delivery, settled }
    })
}

/// A claim-mode delivery whose claim is settled, or failed to settle.
pub struct Settled {
    delivery: ClaimDelivery,
    settled: Result<(), Error>,
}

impl Ended for Settled {
    type Outcome<T> = Outcome<T>;

    /// The handler's result: the body's, unless the claim failed to settle, whose error
    /// then replaces it.
    fn finish<T, E>(
        self,
        result: Result<T, E>,
        error_type: &HandlerErrorType<E>,
    ) -> Result<Outcome<T>, E> {
        let Self { delivery, settled } = self;
        match (result, settled) {
            (Ok(value), Ok(())) => {
                delivery.finish("processed");
                Ok(Outcome::Processed(value))
            }
            (Err(error), Ok(())) => {
                report::handler_error(&delivery.span, (error_type.database_class)(&error));
                delivery.finish("handler_error");
                Err(error)
            }
            (_, Err(error)) => Err((error_type.from_diesel)(delivery.not_completed(error))),
        }
    }
}

/// A claim-mode delivery whose body does not run: a duplicate, in progress elsewhere,
/// or a database error.
pub struct NotClaimed {
    delivery: ClaimDelivery,
    not_run: NotRun,
}

impl NotClaimed {
    /// The handler's result.
    pub fn finish<T, E>(self, error_type: &HandlerErrorType<E>) -> Result<Outcome<T>, E> {
        match self.delivery.not_run(self.not_run) {
            Ok(outcome) => Ok(outcome.map(|never| match never {})),
            Err(error) => Err((error_type.from_diesel)(error)),
        }
    }
}

/// One claim-mode delivery's report: its span and its start.
struct ClaimDelivery {
    handler: &'static Handler,
    span: tracing::Span,
    started: Instant,
}

impl ClaimDelivery {
    fn start(handler: &'static Handler, message_id: Option<&str>) -> Self {
        Self {
            handler,
            span: report::delivery_span(handler.registration, message_id, "claim", false),
            started: Instant::now(),
        }
    }

    /// Reports a delivery whose body did not run: its outcome, or the database error
    /// that ended it.
    fn not_run(self, not_run: NotRun) -> Result<Outcome<Infallible>, Error> {
        match not_run {
            NotRun::Duplicate => {
                tracing::debug!(
                    target: "diesel_inbox",
                    parent: &self.span,
                    "already completed: the body did not run"
                );
                self.finish("duplicate");
                Ok(Outcome::Duplicate)
            }
            NotRun::InProgress(lease_remaining) => {
                tracing::debug!(
                    target: "diesel_inbox",
                    parent: &self.span,
                    { inbox.lease_remaining_ms = lease_remaining.map(|left| left.as_secs_f64() * 1e3) },
                    "claimed by another delivery: the body did not run"
                );
                self.finish("in_progress");
                Ok(Outcome::InProgress { lease_remaining })
            }
            NotRun::Database(error) => Err(self.not_completed(error)),
        }
    }

    /// Reports a database error that ended the delivery, and returns it.
    fn not_completed(self, error: Error) -> Error {
        not_completed(&self.span, &error);
        self.finish("database_error");
        error
    }

    fn finish(self, outcome: &'static str) {
        let elapsed = self.started.elapsed();
        report::finished(&self.span, self.handler.registration, outcome, elapsed);
    }
}

/// Records a database error that ended the delivery on its span.
fn not_completed(span: &tracing::Span, error: &Error) {
    span.record("error.type", tracing::field::debug(classify(error)));
    tracing::debug!(
        target: "diesel_inbox",
        parent: span,
        error = %error,
        "the claim was not completed"
    );
}

/// Everything before the body: the key and lease checked, the key claimed (or a claim
/// nobody holds taken over), and enough of the lease left for the body.
async fn claim<C>(
    conn: &mut C,
    consumer: &'static str,
    message_id: Result<String, InvalidKey>,
    policy: ClaimPolicy,
    fingerprint: Option<Fingerprint>,
) -> Result<Held, NotRun>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let message_id = message_id.map_err(Error::from)?;
    C::Backend::check_storable(&message_id).map_err(Error::from)?;
    let key = ClaimKey {
        message_id,
        consumer: consumer.to_owned(),
    };
    if policy.lease < Duration::from_millis(1) || policy.lease > LONGEST_LEASE {
        let invalid = ClaimError::InvalidLease {
            lease: policy.lease,
        };
        return Err(NotRun::Database(invalid.into()));
    }
    // Each claim statement must commit on its own, before the body's external call.
    enclosing_for_delivery(conn, consumer, [&key.message_id])?;
    let acquired = match acquire(conn, consumer, &key, policy, fingerprint).await {
        Ok(acquired) => acquired,
        // As in the other modes: a session that finds no inbox, or another table of that
        // name, is retried with what to change, not dead-lettered.
        Err(error) => return Err(session_check::explain(conn, error).await.into()),
    };
    let (claim, sent) = match acquired {
        Acquired::Held(claim, sent) => (claim, sent),
        Acquired::NotRun(not_run) => return Err(not_run),
    };
    if let Err(not_run) = keep_lease_for_the_body(conn, &claim, sent).await {
        // The body never started, so no outside call was made: released, the claim is
        // run again by the next delivery, where a lease that merely ran out would be
        // quarantined (`takeover = false`).
        if let NotRun::Database(_) = not_run {
            let token = claim.token.to_string();
            release(conn, key, token, Attempt::BodyNeverStarted).await;
        }
        return Err(not_run);
    }
    tracing::Span::current().record("inbox.attempt", claim.attempt);
    Ok(Held { claim, key })
}

/// Releases the claim `token` holds, for the next delivery to run it at once. Should
/// the release fail, the lease ends and the claim is taken over then, judged as one
/// whose body may have run; the error that ended this delivery says more.
async fn release<C>(conn: &mut C, key: ClaimKey, token: String, attempt: Attempt)
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    if let Err(release) = C::Backend::release(conn, key, token, attempt).await {
        let message = match attempt {
            Attempt::BodyFailed => "could not release the claim after the body failed",
            Attempt::BodyNeverStarted => "could not release a claim whose body never started",
        };
        tracing::warn!(target: "diesel_inbox", error = %release, "{message}");
    }
}

/// Everything after the body: completes the claim when the body `succeeded`, releases
/// it otherwise so that the next delivery runs at once. `Err` is a database error that
/// replaces the body's result.
async fn settle<C>(conn: &mut C, held: Held, succeeded: bool) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let Held { claim, key } = held;
    let token = claim.token.to_string();
    let attempt = claim.attempt;
    // A completion or release sent into a transaction the body left open would commit
    // only with that transaction.
    if let Err(left_open) = claim.outside_a_transaction(conn) {
        tracing::warn!(
            target: "diesel_inbox",
            { inbox.attempt = attempt, body_failed = !succeeded },
            "the body left its connection inside a transaction: the claim stays held \
             until its lease ends"
        );
        return Err(left_open);
    }
    if succeeded {
        return match C::Backend::complete(conn, key, token).await? {
            true => Ok(()),
            false => {
                tracing::warn!(
                    target: "diesel_inbox",
                    { inbox.attempt = attempt },
                    "the body outlived its claim's lease and the claim was taken over: \
                     not completed by this delivery"
                );
                Err(ClaimError::Lost { attempt }.into())
            }
        };
    }
    release(conn, key, token, Attempt::BodyFailed).await;
    Ok(())
}

/// What the claim step found.
enum Acquired {
    /// This delivery holds the claim and runs the body; the statement that claimed it
    /// was sent at the instant given, before its lease began.
    Held(Claim, Instant),
    /// It does not: a duplicate, or in progress elsewhere.
    NotRun(NotRun),
}

/// Claims the key, or takes over a claim nobody holds, or says why the body must not
/// run.
async fn acquire<C>(
    conn: &mut C,
    consumer: &'static str,
    key: &ClaimKey,
    policy: ClaimPolicy,
    fingerprint: Option<Fingerprint>,
) -> Result<Acquired, Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let lease_micros = micros(policy.lease);
    for _ in 0..ACQUIRE_ROUNDS {
        let token = uuid::Uuid::new_v4();
        let held = |attempt: i32, sent: Instant| {
            let claim = Claim {
                message_id: key.message_id.clone(),
                consumer,
                attempt: u32::try_from(attempt).unwrap_or(u32::MAX),
                token,
                lease: policy.lease,
            };
            Acquired::Held(claim, sent)
        };
        let claim = NewClaim {
            key: key.clone(),
            token: token.to_string(),
            lease_micros,
            fingerprint: fingerprint.clone().map(Fingerprint::into_string),
        };
        let sent = Instant::now();
        if C::Backend::insert_claim(conn, claim.clone()).await? {
            return Ok(held(1, sent));
        }
        // Gone since the insert found it: pruned, or settled by hand. Claim it anew.
        let Some(mut found) = C::Backend::read_marker(conn, key.clone()).await? else {
            continue;
        };
        fingerprint::check(
            &key.message_id,
            consumer,
            found.fingerprint.take(),
            fingerprint.as_ref(),
        )?;
        let mut judged = judge(&found, policy);
        if let Judged::Refused(_) = judged {
            // A refusal dead-letters the message, and no later write corrects it: it
            // must not come from a node's lagging view of an operator's release.
            let Some(latest) = C::Backend::read_latest_marker(conn, key.clone()).await? else {
                continue;
            };
            found = latest;
            judged = judge(&found, policy);
        }
        match judged {
            Judged::NotRun(not_run) => return Ok(Acquired::NotRun(not_run)),
            Judged::Refused(refusal) => return Err(refusal.into()),
            Judged::Takeable => {}
        }
        let sent = Instant::now();
        if C::Backend::take_over(conn, claim, found.attempts).await? {
            tracing::info!(
                target: "diesel_inbox",
                { inbox.attempt = found.attempts + 1, inbox.released = found.released },
                "took over a claim nobody held"
            );
            return Ok(held(found.attempts + 1, sent));
        }
        // Another delivery took it over first: read it again.
    }
    Ok(Acquired::NotRun(NotRun::InProgress(None)))
}

/// What a claim another delivery made means for this one.
enum Judged {
    /// Completed, or live: the body does not run here.
    NotRun(NotRun),
    /// The body must not run again without a person.
    Refused(ClaimError),
    /// Nobody holds it: take it over.
    Takeable,
}

fn judge(found: &ClaimRow, policy: ClaimPolicy) -> Judged {
    if found.completed {
        return Judged::NotRun(NotRun::Duplicate);
    }
    if found.live {
        let remaining = found
            .lease_remaining_micros
            .and_then(|micros| u64::try_from(micros).ok())
            .map(Duration::from_micros);
        return Judged::NotRun(NotRun::InProgress(remaining));
    }
    let attempts = u32::try_from(found.attempts).unwrap_or(0);
    if policy.max_attempts.is_some_and(|max| attempts >= max) {
        return Judged::Refused(ClaimError::AttemptsExhausted { attempts });
    }
    // A released claim failed cleanly and may run again; one whose lease ended may have
    // made its external call.
    if !found.released && !policy.takeover {
        return Judged::Refused(ClaimError::Quarantined { attempts });
    }
    Judged::Takeable
}

/// Makes sure the body starts with at least half its lease left. The lease began when
/// the claiming statement ran, no earlier than it was `sent`, so what is left is at
/// least the lease less the time since; a commit that stalled (a Galera node waiting
/// out a dead peer) can use it up, and another delivery could then take the claim over
/// while the body runs. Such a claim is renewed, until a renewal itself commits in
/// time; one taken over meanwhile is in progress elsewhere.
async fn keep_lease_for_the_body<C>(
    conn: &mut C,
    claim: &Claim,
    mut sent: Instant,
) -> Result<(), NotRun>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let mut renewals = 0;
    loop {
        let used = sent.elapsed();
        if used < claim.lease / 2 {
            return Ok(());
        }
        if renewals == LEASE_RENEWALS {
            let used_up = ClaimError::LeaseUsedUp {
                attempt: claim.attempt,
            };
            return Err(NotRun::Database(used_up.into()));
        }
        tracing::warn!(
            target: "diesel_inbox",
            { inbox.attempt = claim.attempt, used_ms = used.as_secs_f64() * 1e3 },
            "the claim took most of its lease to commit: renewing it before the body runs"
        );
        sent = Instant::now();
        if let Err(error) = claim.renew(conn).await {
            return Err(match InboxError::find(&error) {
                Some(InboxError::Claim(ClaimError::Lost { .. })) => NotRun::InProgress(None),
                _ => NotRun::Database(error),
            });
        }
        renewals += 1;
    }
}
