//! The relay: a background task that publishes the outbox's committed messages
//! (feature `relay`).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use diesel_async::AsyncConnection;
use futures_util::FutureExt as _;
use futures_util::future::join_all;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tracing::Instrument as _;

use super::pruning::{BATCH, prune_sent_batch};
use super::{PublishError, Publisher, Taken, sent_all, take};
use crate::backend::InboxBackend;
use crate::background::{ConnectionSource, jittered, shutting_down};

/// How a [`Relay`] takes, publishes, retries and prunes.
///
/// By default: up to 64 messages a round, each leased for 60 s and published within
/// 20 s; the outbox polled every 100 ms while it is empty; a failed publish retried
/// after 1 s, doubling up to 5 minutes, with jitter; messages sent more than a day ago
/// pruned about every 5 minutes.
#[derive(Debug, Clone, Copy)]
pub struct RelaySettings {
    batch: usize,
    lease: Duration,
    publish_timeout: Duration,
    poll_interval: Duration,
    backoff: ExponentialBuilder,
    sent_retention: Option<Duration>,
}

/// How often a relay looks for sent messages to prune, give or take a tenth.
const PRUNE_EVERY: Duration = Duration::from_secs(300);

impl RelaySettings {
    /// The default settings.
    pub const fn new() -> Self {
        Self {
            batch: 64,
            lease: Duration::from_secs(60),
            publish_timeout: Duration::from_secs(20),
            poll_interval: Duration::from_millis(100),
            backoff: ExponentialBuilder::new()
                .with_min_delay(Duration::from_secs(1))
                .with_max_delay(Duration::from_secs(300))
                .with_factor(2.0)
                .without_max_times()
                .with_jitter(),
            sent_retention: Some(Duration::from_secs(24 * 3600)),
        }
    }

    /// Takes and publishes up to `batch` messages a round (at least one).
    pub const fn with_batch(self, batch: usize) -> Self {
        Self {
            batch: if batch == 0 { 1 } else { batch },
            ..self
        }
    }

    /// Leases the messages it takes for `lease`, and gives each publish at most a third
    /// of it: a relay that dies leaves its messages to another one after `lease`.
    pub const fn with_lease(self, lease: Duration) -> Self {
        Self {
            lease,
            publish_timeout: match lease.checked_div(3) {
                Some(third) => third,
                None => lease,
            },
            ..self
        }
    }

    /// Looks for due messages every `interval` while the outbox has none.
    pub const fn with_poll_interval(self, interval: Duration) -> Self {
        Self {
            poll_interval: interval,
            ..self
        }
    }

    /// Retries a failed publish after `min`, doubling up to `max`, with jitter.
    pub const fn with_backoff(self, min: Duration, max: Duration) -> Self {
        Self {
            backoff: self.backoff.with_min_delay(min).with_max_delay(max),
            ..self
        }
    }

    /// Prunes messages sent more than `retention` ago ([`prune_sent`](super::prune_sent)),
    /// a batch between two rounds, about every 5 minutes.
    pub const fn with_sent_retention(self, retention: Duration) -> Self {
        Self {
            sent_retention: Some(retention),
            ..self
        }
    }

    /// Keeps sent messages, for a prune of your own.
    pub const fn without_pruning(self) -> Self {
        Self {
            sent_retention: None,
            ..self
        }
    }

    /// The delay before attempt `attempts + 1`, after `attempts` failed ones: the
    /// backoff's, or longer if the error asks for it.
    fn retry_delay(&self, attempts: u32, error: &PublishError) -> Duration {
        // The doubling reaches any maximum long before 64 steps.
        let steps = attempts.clamp(1, 64) as usize;
        let backoff = self.backoff.build().nth(steps - 1).unwrap_or_default();
        error.delay().map_or(backoff, |asked| asked.max(backoff))
    }
}

impl Default for RelaySettings {
    fn default() -> Self {
        Self::new()
    }
}

/// A task that publishes the outbox's committed messages through a [`Publisher`], on
/// connections from `connect` (an owned pool, or a closure such as `|| pool.get()`),
/// until shut down.
///
/// Each round it [takes](super::take) up to a batch of due messages, publishes them
/// at once (at most one of each ordering key), and marks those the broker confirmed
/// [sent](super::sent_all), in one statement. A failure that may pass is
/// retried with backoff; an [unpublishable](PublishError::unpublishable) message is
/// [parked](super::Taken::park). A database error drops the connection and the round:
/// what the round took is taken again once its lease ends, and a message published
/// but not yet marked goes out twice, which its receiver's inbox drops.
///
/// Run one on every instance: relays on one outbox share its messages.
/// [`Relay::shut_down`] stops it between rounds: a round under way publishes and
/// settles what it took first. Between polls, [`Relay::waker`] lets the instance that
/// commits a message have it published at once.
///
/// ```no_run
/// # #[cfg(feature = "postgres")] mod example {
/// # use inbox_runtime as diesel_inbox;
/// # type Error = Box<dyn std::error::Error + Send + Sync>;
/// # struct Pool;
/// # impl Pool { async fn get(&self) -> Result<diesel_async::AsyncPgConnection, Error> { unimplemented!() } }
/// use diesel_inbox::outbox::{Outgoing, PublishError, Publisher, Relay, RelaySettings};
///
/// struct Broker;
///
/// impl Publisher for Broker {
///     async fn publish(&self, message: &Outgoing) -> Result<(), PublishError> {
///         // … publish, and wait for the broker's confirmation …
///         Ok(())
///     }
/// }
///
/// async fn serve(pool: &'static Pool) {
///     let relay = Relay::spawn(|| pool.get(), Broker, RelaySettings::default());
///     // … serve until asked to stop …
///     relay.shut_down().await;
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct Relay {
    stop: watch::Sender<bool>,
    wake: RelayWaker,
    task: JoinHandle<()>,
}

/// Wakes a [`Relay`] waiting for its next poll, so that it looks for due messages at
/// once: call [`wake`](Self::wake) once a transaction that enqueued has committed
/// (after a handler returns `Processed`, say). Cheap, and cloned freely.
///
/// Only the relay of this process wakes; the others still find the message at their
/// next poll. A wake while the relay is busy makes it look again as soon as it is done,
/// so none is lost; several wakes before it looks count as one.
#[derive(Debug, Clone, Default)]
pub struct RelayWaker(Arc<Notify>);

impl RelayWaker {
    /// Has the relay look for due messages now rather than at its next poll.
    pub fn wake(&self) {
        self.0.notify_one();
    }
}

impl Relay {
    /// Starts relaying on the current tokio runtime.
    pub fn spawn<S, P>(connect: S, publisher: P, settings: RelaySettings) -> Self
    where
        S: ConnectionSource,
        S::Connection: Send,
        P: Publisher,
    {
        let (stop, stopped) = watch::channel(false);
        let wake = RelayWaker::default();
        let woken = Arc::clone(&wake.0);
        let task = tokio::spawn(relay(connect, publisher, settings, stopped, woken));
        Self { stop, wake, task }
    }

    /// A handle that wakes this relay between polls.
    pub fn waker(&self) -> RelayWaker {
        self.wake.clone()
    }

    /// Stops relaying: waits for a round under way to publish and settle what it took,
    /// then ends the task. A relay waiting for a connection or for due messages stops
    /// at once.
    pub async fn shut_down(self) {
        // The task may have ended already, if its runtime is shutting down.
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn relay<S, P>(
    connect: S,
    publisher: P,
    settings: RelaySettings,
    stopped: watch::Receiver<bool>,
    woken: Arc<Notify>,
) where
    S: ConnectionSource,
    S::Connection: Send,
    P: Publisher,
{
    let mut connection = None;
    let mut next_prune = Instant::now() + jittered(PRUNE_EVERY);
    loop {
        if *stopped.borrow() {
            return;
        }
        let conn = match &mut connection {
            Some(conn) => conn,
            None => {
                // A pool may hold every connection for the handlers: shutting down must
                // not wait for one.
                let connected = tokio::select! {
                    () = shutting_down(stopped.clone()) => return,
                    connected = connect.connect() => connected.map_err(|error| error.to_string()),
                };
                match connected {
                    Ok(conn) => connection.insert(conn),
                    Err(error) => {
                        tracing::warn!(target: "diesel_inbox", error, "the relay has no connection; trying again");
                        pause(&stopped, settings.poll_interval).await;
                        continue;
                    }
                }
            }
        };
        if let Some(retention) = settings
            .sent_retention
            .filter(|_| Instant::now() >= next_prune)
        {
            // One batch between two rounds, until a batch finds less than a batch's worth.
            match prune_sent_batch(conn, retention).await {
                Ok(BATCH) => {}
                Ok(_) => next_prune = Instant::now() + jittered(PRUNE_EVERY),
                Err(error) => {
                    tracing::warn!(target: "diesel_inbox", %error, "pruning sent outbox messages failed; the next run tries again");
                    next_prune = Instant::now() + jittered(PRUNE_EVERY);
                }
            }
        }
        let span = tracing::debug_span!(
            target: "diesel_inbox",
            "outbox.round",
            outbox.taken = tracing::field::Empty,
            outbox.sent = tracing::field::Empty,
            outbox.retried = tracing::field::Empty,
            outbox.parked = tracing::field::Empty,
        );
        match round(conn, &publisher, &settings)
            .instrument(span.clone())
            .await
        {
            Ok(settled) => {
                settled.report(&span);
                if settled.taken < settings.batch {
                    tokio::select! {
                        () = pause(&stopped, settings.poll_interval) => {}
                        () = woken.notified() => {}
                    }
                }
            }
            Err(error) => {
                tracing::warn!(
                    target: "diesel_inbox",
                    %error,
                    "the relay lost its round; what it took is taken again once its lease ends"
                );
                connection = None;
                pause(&stopped, settings.poll_interval).await;
            }
        }
    }
}

/// What one round did with the messages it took.
#[derive(Debug, Clone, Copy, Default)]
struct Settled {
    taken: usize,
    sent: usize,
    retried: usize,
    parked: usize,
}

impl Settled {
    /// On the round's span, and as an event for subscribers that show no span closes;
    /// an empty poll says nothing.
    fn report(self, span: &tracing::Span) {
        span.record("outbox.taken", self.taken);
        span.record("outbox.sent", self.sent);
        span.record("outbox.retried", self.retried);
        span.record("outbox.parked", self.parked);
        if self.taken > 0 {
            tracing::debug!(
                target: "diesel_inbox",
                parent: span,
                {
                    outbox.taken = self.taken,
                    outbox.sent = self.sent,
                    outbox.retried = self.retried,
                    outbox.parked = self.parked,
                },
                "relayed a round of outbox messages"
            );
        }
    }
}

/// Takes, publishes and settles one batch.
async fn round<C, P>(
    conn: &mut C,
    publisher: &P,
    settings: &RelaySettings,
) -> diesel::QueryResult<Settled>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    P: Publisher,
{
    let taken = take(conn, settings.lease, settings.batch).await?;
    let mut settled = Settled {
        taken: taken.len(),
        ..Settled::default()
    };
    let published = join_all(taken.iter().map(|taken| async {
        let started = Instant::now();
        // A publisher that panics fails its publish, rather than end the relay's task
        // with the round's messages leased.
        let publish = AssertUnwindSafe(publisher.publish(taken.message())).catch_unwind();
        let published = tokio::time::timeout(settings.publish_timeout, publish).await;
        let (published, outcome) = match published {
            Ok(Ok(Ok(()))) => (Ok(()), "confirmed"),
            Ok(Ok(Err(error))) => (Err(error), "failed"),
            Ok(Err(panic)) => (Err(PublishError::retryable(panicked(&*panic))), "failed"),
            Err(elapsed) => (Err(PublishError::retryable(elapsed)), "timed_out"),
        };
        (published, (outcome, started.elapsed()))
    }))
    .await;
    let (published, durations): (Vec<_>, Vec<_>) = published.into_iter().unzip();
    let mut sent = Vec::with_capacity(settled.taken);
    for (taken, published) in taken.into_iter().zip(published) {
        match published {
            Ok(()) => sent.push(taken),
            Err(error) => {
                if settle_failure(conn, taken, error, settings).await? {
                    settled.parked += 1;
                } else {
                    settled.retried += 1;
                }
            }
        }
    }
    settled.sent = sent.len();
    sent_all(conn, sent).await?;
    #[cfg(feature = "metrics")]
    crate::metrics::record_round(
        [
            ("sent", settled.sent),
            ("retried", settled.retried),
            ("parked", settled.parked),
        ],
        durations.into_iter(),
    );
    #[cfg(not(feature = "metrics"))]
    let _ = durations;
    Ok(settled)
}

/// The error of a publish whose publisher panicked, with the panic's message.
fn panicked(panic: &(dyn std::any::Any + Send)) -> String {
    let message = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message");
    format!("the publisher panicked: {message}")
}

/// Parks a message that cannot be published (`true`), or schedules it again.
async fn settle_failure<C>(
    conn: &mut C,
    taken: Taken,
    error: PublishError,
    settings: &RelaySettings,
) -> diesel::QueryResult<bool>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    if error.is_unpublishable() {
        tracing::error!(
            target: "diesel_inbox",
            { outbox.message_id = taken.message().message_id(), error = %error },
            "parked an outbox message that cannot be published"
        );
        return taken.park(conn, &error).await.map(|_| true);
    }
    let delay = settings.retry_delay(taken.message().attempts(), &error);
    tracing::warn!(
        target: "diesel_inbox",
        {
            outbox.message_id = taken.message().message_id(),
            outbox.attempts = taken.message().attempts(),
            outbox.retry_in_ms = delay.as_secs_f64() * 1e3,
            error = %error,
        },
        "an outbox message's publish failed; retrying later"
    );
    taken.retry_later(conn, delay, &error).await.map(|_| false)
}

/// Waits `delay`, or less if the relay is shut down meanwhile.
async fn pause(stopped: &watch::Receiver<bool>, delay: Duration) {
    tokio::select! {
        () = shutting_down(stopped.clone()) => {}
        () = tokio::time::sleep(delay) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_maximum() {
        let settings =
            RelaySettings::new().with_backoff(Duration::from_secs(1), Duration::from_secs(8));
        let error = PublishError::retryable("down");
        let delays: Vec<Duration> = (1..=6).map(|n| settings.retry_delay(n, &error)).collect();
        for (delay, least) in delays.iter().zip([1, 2, 4, 8, 8, 8]) {
            // Jitter adds up to the delay itself.
            let least = Duration::from_secs(least);
            assert!((least..=least * 2).contains(delay), "{delays:?}");
        }
        assert!(settings.retry_delay(u32::MAX, &error) <= Duration::from_secs(16));
    }

    #[test]
    fn an_error_can_ask_for_a_longer_delay() {
        let settings = RelaySettings::new();
        let error = PublishError::retryable("rate limited").retry_after(Duration::from_secs(600));
        assert_eq!(settings.retry_delay(1, &error), Duration::from_secs(600));
    }
}
