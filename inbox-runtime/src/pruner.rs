//! Pruning in the background, on a schedule, until shut down (feature `pruner`).

use std::time::Duration;

use std::ops::ControlFlow;

use diesel::QueryResult;
use diesel_async::AsyncConnection;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::backend::InboxBackend;
use crate::background::{ConnectionSource, jittered, shutting_down};
use crate::prune::prune_in_batches;

/// How hard a prune works. After each batch of 1,000 ids it rests for a multiple of the
/// time the batch took, so that it deletes during at most a share of its run and leaves
/// the rest of the database's CPU and locks to the handlers. Deleting a million markers
/// flat out beside 8 consumers took a third to three quarters of their throughput on a
/// 2-core machine; [the costs guide](https://docs.rs/diesel-inbox/latest/diesel_inbox/guide/costs/index.html#a-large-inbox-and-pruning)
/// gives the paced figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    rest: u32,
}

impl Pace {
    /// No rest: as fast as the database deletes, as [`prune`](fn@crate::prune) does.
    pub const FLAT_OUT: Self = Self { rest: 0 };

    /// Rests `rest` times as long as each batch took, so that the prune deletes during at
    /// most `1 / (rest + 1)` of its run.
    pub const fn resting(rest: u32) -> Self {
        Self { rest }
    }

    /// The pause after a batch that took `batch`.
    fn after(self, batch: Duration) -> Duration {
        batch.saturating_mul(self.rest)
    }
}

/// [`Pruner`]'s pace: rests four times as long as each batch took, deleting during at most
/// a fifth of its run.
impl Default for Pace {
    fn default() -> Self {
        Self::resting(4)
    }
}

/// [`prune`](fn@crate::prune) at `pace`: the same batches and guarantees, with a rest after each. For a
/// prune run by a scheduler of your own; [`Pruner`] runs it on one.
///
/// # Errors
///
/// As [`prune`](fn@crate::prune).
pub async fn prune_paced<C>(conn: &mut C, older_than: Duration, pace: Pace) -> QueryResult<u64>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    prune_in_batches(conn, older_than, |batch| async move {
        tokio::time::sleep(pace.after(batch)).await;
        ControlFlow::Continue(())
    })
    .await
}

/// A task that prunes every `every`, give or take a tenth (so that instances started
/// together do not prune in step), at a [`Pace`], on a connection it takes from
/// `connect` for each run: an owned pool (`pool.clone()`), or a closure such as
/// `|| pool.get()` on a `&'static` pool.
///
/// Each run logs what it deleted at `INFO`, or why it failed at `WARN` (and the next run
/// tries again). [`Pruner::shut_down`] stops it between runs, while a run waits for its
/// connection (a pool whose connections the handlers hold), or between a run's batches:
/// no batch is cut off mid-statement.
///
/// ```no_run
/// # #[cfg(feature = "postgres")] mod example {
/// # use inbox_runtime as diesel_inbox;
/// # use std::time::Duration;
/// # type Error = Box<dyn std::error::Error + Send + Sync>;
/// # struct Pool;
/// # impl Pool { async fn get(&self) -> Result<diesel_async::AsyncPgConnection, Error> { unimplemented!() } }
/// use diesel_inbox::{Pruner, Retention};
///
/// async fn serve(pool: &'static Pool) {
///     let window = Retention::new(Duration::from_secs(30), 5).window();
///     let pruner = Pruner::spawn(|| pool.get(), Duration::from_secs(300), window);
///     // … consume until asked to stop …
///     pruner.shut_down().await;
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct Pruner {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Pruner {
    /// Starts pruning on the current tokio runtime at the default [`Pace`]: the first run
    /// after about `every`.
    pub fn spawn(connect: impl ConnectionSource, every: Duration, older_than: Duration) -> Self {
        Self::spawn_paced(connect, every, older_than, Pace::default())
    }

    /// [`Pruner::spawn`] at `pace`.
    pub fn spawn_paced(
        connect: impl ConnectionSource,
        every: Duration,
        older_than: Duration,
        pace: Pace,
    ) -> Self {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = shutting_down(stopped.clone()) => return,
                    () = tokio::time::sleep(jittered(every)) => {}
                }
                let started = std::time::Instant::now();
                // A pool may hold every connection for the handlers: shutting down must
                // not wait for one.
                let connection = tokio::select! {
                    () = shutting_down(stopped.clone()) => return,
                    connection = connect.connect() => {
                        connection.map_err(|error| format!("no connection: {error}"))
                    }
                };
                let deleted = match connection {
                    Ok(mut conn) => prune_in_batches(&mut conn, older_than, |batch| {
                        let stopped = stopped.clone();
                        async move {
                            tokio::select! {
                                () = shutting_down(stopped) => ControlFlow::Break(()),
                                () = tokio::time::sleep(pace.after(batch)) => {
                                    ControlFlow::Continue(())
                                }
                            }
                        }
                    })
                    .await
                    .map_err(|error| error.to_string()),
                    Err(error) => Err(error),
                };
                match deleted {
                    Ok(deleted) => {
                        tracing::info!(
                            target: "diesel_inbox",
                            {
                                inbox.pruned = deleted,
                                inbox.duration_ms = started.elapsed().as_secs_f64() * 1e3,
                            },
                            "pruned markers older than the retention window"
                        )
                    }
                    Err(error) => {
                        tracing::warn!(
                            target: "diesel_inbox",
                            error,
                            "pruning failed; the next run tries again"
                        )
                    }
                }
            }
        });
        Self { stop, task }
    }

    /// Stops pruning: waits for a batch under way to finish, then ends the task. A run
    /// still waiting for its connection gives up at once.
    pub async fn shut_down(self) {
        // The task may have ended already, if its runtime is shutting down.
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pace_rests_its_multiple_of_the_batch() {
        let batch = Duration::from_millis(30);
        assert_eq!(Pace::FLAT_OUT.after(batch), Duration::ZERO);
        assert_eq!(Pace::default().after(batch), Duration::from_millis(120));
        assert_eq!(Pace::resting(u32::MAX).after(Duration::MAX), Duration::MAX);
    }
}
