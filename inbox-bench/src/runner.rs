//! Running one measurement: consumers on their own connections pull delivery numbers from
//! a shared counter until the workload's fixed count is handed out.
//!
//! A fixed count rather than a fixed duration leaves every variant's inbox the same size
//! at the end, and makes the duplicate variants' share of redeliveries exact. The clock
//! starts once every consumer is connected and waiting, and stops when the last one is
//! done.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use diesel::connection::{Instrumentation, InstrumentationEvent};
use diesel_inbox::testing::TestDatabase;
use diesel_inbox::{Pruner, classify};
use indicatif::ProgressBar;
use tokio::sync::Barrier;

use crate::connection::{BenchConnection, connect};
use crate::handlers::{self, Handled};
use crate::variant::Variant;
use crate::workload::{Delivery, Workload};

/// Attempts of one delivery that fail with a transient error (a serialization failure,
/// a deadlock, `SQLITE_BUSY`) before the measurement is abandoned.
const MAX_ATTEMPTS: u32 = 100;

/// What the consumers did, summed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tally {
    pub processed: u64,
    pub duplicates: u64,
    /// Deliveries handled again after a transient error.
    pub retries: u64,
}

impl Tally {
    fn add(&mut self, other: Self) {
        self.processed += other.processed;
        self.duplicates += other.duplicates;
        self.retries += other.retries;
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Run {
    pub elapsed: Duration,
    pub tally: Tally,
    /// Statements the consumers sent, transaction control included: each is a round trip.
    pub statements: u64,
}

/// Counts the statements a connection sends.
struct StatementCounter(Arc<AtomicU64>);

impl Instrumentation for StatementCounter {
    fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
        if let InstrumentationEvent::StartQuery { .. } = event {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Runs `variant` over `workload` with one consumer per connection in `connections`,
/// and hands the connections back.
pub async fn drive<C: BenchConnection>(
    connections: Vec<C>,
    variant: Variant,
    workload: Workload,
    bar: &ProgressBar,
) -> anyhow::Result<(Run, Vec<C>)> {
    let next = Arc::new(AtomicU64::new(0));
    let statements = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(connections.len() + 1));
    let mut consumers = Vec::with_capacity(connections.len());
    for mut conn in connections {
        conn.set_instrumentation(StatementCounter(Arc::clone(&statements)));
        let (next, start, bar) = (Arc::clone(&next), Arc::clone(&start), bar.clone());
        consumers.push(tokio::spawn(async move {
            start.wait().await;
            let result = consume(&mut conn, variant, workload, &next, &bar).await;
            (conn, result)
        }));
    }
    start.wait().await;
    let clock = Instant::now();
    let mut tally = Tally::default();
    let mut failure = None;
    let mut connections = Vec::with_capacity(consumers.len());
    // Every consumer is awaited, even after one failed, so that none is still running
    // when the caller resets the tables.
    for consumer in consumers {
        let (conn, result) = consumer.await.context("a consumer panicked")?;
        connections.push(conn);
        match result {
            Ok(part) => tally.add(part),
            Err(error) => failure = failure.or(Some(error)),
        }
    }
    let elapsed = clock.elapsed();
    if let Some(error) = failure {
        return Err(error);
    }
    let run = Run {
        elapsed,
        tally,
        statements: statements.load(Ordering::Relaxed),
    };
    Ok((run, connections))
}

/// One consumer: takes the next delivery (a batch variant the next batch of them) until
/// none is left. A transient error is retried at once, as a broker's redelivery would
/// be; any other error ends the run.
async fn consume<C: BenchConnection>(
    conn: &mut C,
    variant: Variant,
    workload: Workload,
    next: &AtomicU64,
    bar: &ProgressBar,
) -> anyhow::Result<Tally> {
    let mut tally = Tally::default();
    let per_call = variant.messages_per_call();
    loop {
        let first = next.fetch_add(per_call, Ordering::Relaxed);
        if first >= workload.deliveries {
            return Ok(tally);
        }
        let numbers = first..(first + per_call).min(workload.deliveries);
        let deliveries: Vec<Delivery> = numbers.clone().map(|n| workload.delivery(n)).collect();
        let mut attempts = 0;
        loop {
            attempts += 1;
            match handlers::handle(variant, conn, &deliveries).await {
                Ok(Handled::Settled {
                    processed,
                    duplicates,
                }) => {
                    tally.processed += processed;
                    tally.duplicates += duplicates;
                }
                // Another delivery holds the claim: delivered again, as a broker would.
                Ok(Handled::InProgress) if attempts < MAX_ATTEMPTS => {
                    tally.retries += 1;
                    continue;
                }
                Ok(Handled::InProgress) => bail!(
                    "{} found deliveries {numbers:?} claimed elsewhere {attempts} times",
                    variant.label()
                ),
                Err(error) if classify(&error).is_retryable() && attempts < MAX_ATTEMPTS => {
                    tally.retries += 1;
                    continue;
                }
                Err(error) => bail!(
                    "{} failed on deliveries {numbers:?} ({:?}) after {attempts} attempt(s): {error}",
                    variant.label(),
                    deliveries.first()
                ),
            }
            break;
        }
        bar.inc(deliveries.len() as u64);
    }
}

/// How old the markers variant 8 prunes are, and the window it keeps: every marker the
/// consumers insert is inside it.
pub const PRUNED_MARKERS_AGE_DAYS: u32 = 2;
pub const PRUNE_WINDOW: Duration = Duration::from_secs(86_400);
/// How often variant 8's pruner runs: at once, and again as soon as a run has found
/// nothing left to delete.
const PRUNE_EVERY: Duration = Duration::from_millis(10);

/// What the pruner beside the consumers did.
#[derive(Debug, Clone, Copy)]
pub struct Pruned {
    /// Old markers it deleted.
    pub rows: u64,
    /// From the consumers' start until it stopped, after the batch under way when they
    /// were done.
    pub elapsed: Duration,
}

/// A `diesel_inbox::Pruner` at its default pace, on connections of its own, from the
/// moment the consumers start until they are done.
pub struct PruneTask {
    pruner: Pruner,
    started: Instant,
}

impl PruneTask {
    pub fn start<C: BenchConnection>(db: &TestDatabase<C>) -> Self {
        let db = db.clone();
        let connect = move || {
            let db = db.clone();
            async move { connect(&db).await }
        };
        Self {
            pruner: Pruner::spawn(connect, PRUNE_EVERY, PRUNE_WINDOW),
            started: Instant::now(),
        }
    }

    /// Shuts the pruner down, and says how long it ran.
    pub async fn stop(self) -> Duration {
        self.pruner.shut_down().await;
        self.started.elapsed()
    }
}
