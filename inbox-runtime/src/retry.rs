//! Running a handler again, in a transaction of its own, while its delivery fails in a
//! way that a retry can fix.
//!
//! A retry inside a handler would retry a transaction the database has already rolled
//! back; the whole handler has to run again. [`retry`] does that at the pump, with an
//! exponential backoff and jitter from [backon](https://docs.rs/backon).

use std::fmt;
use std::future::Future;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

use crate::verdict::Classify;

/// How often, and how patiently, [`retry`] runs a handler again.
///
/// By default: up to 4 retries (5 attempts), the first after 10 ms, doubling up to 1 s,
/// each delay with random jitter so that the deliveries that deadlocked together do not
/// meet again.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    backoff: ExponentialBuilder,
    /// Also the longest wait an error's own `retry_after` gets here: a longer one is left
    /// to the broker.
    max_delay: Duration,
    /// The most all the waits may add up to, an error's own `retry_after` included
    /// (which the backoff's own total does not count).
    max_total_delay: Option<Duration>,
}

impl RetryPolicy {
    /// The default policy.
    pub const fn new() -> Self {
        const MAX_DELAY: Duration = Duration::from_secs(1);
        Self {
            backoff: ExponentialBuilder::new()
                .with_min_delay(Duration::from_millis(10))
                .with_max_delay(MAX_DELAY)
                .with_factor(2.0)
                .with_max_times(4)
                .with_jitter(),
            max_delay: MAX_DELAY,
            max_total_delay: None,
        }
    }

    /// At most `retries` runs after the first.
    pub const fn with_max_retries(self, retries: usize) -> Self {
        Self {
            backoff: self.backoff.with_max_times(retries),
            ..self
        }
    }

    /// The delay before the first retry; each later one doubles it.
    pub const fn with_min_delay(self, delay: Duration) -> Self {
        Self {
            backoff: self.backoff.with_min_delay(delay),
            ..self
        }
    }

    /// The longest delay between two runs. An error whose
    /// [`retry_after`](crate::Classify::retry_after) asks for a longer wait is returned
    /// at once, for the broker to redeliver after it.
    pub const fn with_max_delay(self, delay: Duration) -> Self {
        Self {
            backoff: self.backoff.with_max_delay(delay),
            max_delay: delay,
            ..self
        }
    }

    /// Stops retrying where the next wait would make the waits add up to more than
    /// `total`: a deadline for the waiting, whatever the count, and whatever an error's
    /// own [`retry_after`](crate::Classify::retry_after) asks.
    pub const fn with_max_total_delay(self, total: Duration) -> Self {
        Self {
            backoff: self.backoff.with_total_delay(Some(total)),
            max_total_delay: Some(total),
            ..self
        }
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs `attempt` until it returns a handler's result (an [`Outcome`](crate::Outcome),
/// or a batch handler's [`BatchOutcome`](crate::BatchOutcome)), an error that no retry
/// can fix, or the policy is spent; returns what the last run returned.
///
/// `attempt` returns a future that runs the whole handler, so each run has a
/// transaction of its own. It should also take its connection: with a pool
/// (`pool.get()` in each run), a connection that a run left unusable
/// ([`ErrorClass::ConnectionUnusable`]) goes back to the pool, which discards it, and
/// the next run gets another. A closure returning a future, rather than an async
/// closure, keeps `retry`'s future `Send` whenever a run's is, so a pump that retries
/// can be spawned (rustc cannot prove that for an async closure called more than once,
/// rust-lang/rust#100013).
///
/// Retried: errors whose [`Classify`] verdict is [`ErrorClass::Transient`] or
/// [`ErrorClass::ConnectionUnusable`] (a deadlock, a time-out, a lost connection, one
/// that could not be opened or taken from the pool, a read-only server, or an error of
/// your own marked retryable). A retry waits the policy's backoff, or the error's own
/// [`retry_after`](Classify::retry_after) if that is longer; an error that asks for a
/// longer wait than the policy's longest delay is returned at once, for the broker to
/// redeliver later. Each retry is reported as a `tracing` event at `WARN`.
///
/// [`ErrorClass::Transient`]: crate::ErrorClass::Transient
/// [`ErrorClass::ConnectionUnusable`]: crate::ErrorClass::ConnectionUnusable
///
/// ```no_run
/// # #[cfg(feature = "postgres")] mod example {
/// # use inbox_runtime as diesel_inbox;
/// # use diesel_async::AsyncPgConnection;
/// # type Error = Box<dyn std::error::Error + Send + Sync>;
/// # struct Pool;
/// # impl Pool { async fn get(&self) -> Result<AsyncPgConnection, Error> { unimplemented!() } }
/// # async fn credit(conn: &mut AsyncPgConnection, id: &str)
/// #     -> Result<diesel_inbox::Outcome<()>, diesel::result::Error> { unimplemented!() }
/// use diesel_inbox::{Outcome, RetryPolicy, retry};
///
/// async fn handle(pool: &Pool, message_id: &str) -> Result<Outcome<()>, Error> {
///     retry(&RetryPolicy::new(), || async {
///         // A connection per run: one that a run left unusable goes back to the pool.
///         let mut conn = pool.get().await?;
///         Ok::<_, Error>(credit(&mut conn, message_id).await?)
///     })
///     .await
/// }
/// # }
/// ```
pub async fn retry<T, E, Run>(
    policy: &RetryPolicy,
    mut attempt: impl FnMut() -> Run,
) -> Result<T, E>
where
    Run: Future<Output = Result<T, E>>,
    E: Classify + fmt::Display,
{
    let mut delays = policy.backoff.build();
    let mut run = 1_u32;
    let mut slept = Duration::ZERO;
    loop {
        let error = match attempt().await {
            Err(error) if error.class().is_retryable() => error,
            settled => return settled,
        };
        let asked = error.retry_after().unwrap_or_default();
        let Some(backoff) = delays.next().filter(|_| asked <= policy.max_delay) else {
            return Err(error);
        };
        let delay = backoff.max(asked);
        slept = slept.saturating_add(delay);
        if policy.max_total_delay.is_some_and(|total| slept > total) {
            return Err(error);
        }
        tracing::warn!(
            target: "diesel_inbox",
            { inbox.attempt = run, inbox.retry_in_ms = delay.as_millis() as u64, error = %error },
            "retrying a delivery that failed in a way a retry can fix"
        );
        tokio::time::sleep(delay).await;
        run += 1;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::Classified;

    /// The total bounds the waits an error asks for too: 60 ms asked each time, within
    /// 100 ms in all, is one wait, not as many as the backoff's own short delays allow.
    #[tokio::test]
    async fn the_total_delay_counts_what_errors_ask_for() {
        let policy = RetryPolicy::new()
            .with_max_retries(20)
            .with_max_total_delay(Duration::from_millis(100));
        let runs = AtomicU32::new(0);
        let result: Result<(), Classified> = retry(&policy, || async {
            runs.fetch_add(1, Ordering::Relaxed);
            Err(Classified::retry_after(
                "the provider asks for a pause",
                Duration::from_millis(60),
            ))
        })
        .await;
        assert!(result.is_err());
        assert_eq!(runs.into_inner(), 2);
    }
}
