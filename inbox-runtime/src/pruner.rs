//! Pruning in the background, on a schedule, until shut down (feature `pruner`).

use std::fmt;
use std::future::Future;
use std::time::Duration;

use diesel_async::AsyncConnection;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::backend::InboxBackend;
use crate::prune::prune;

/// A task that calls [`prune`] every `every`, give or take a tenth (so that instances
/// started together do not prune in step), on a connection it takes from `connect` for
/// each run, such as `|| pool.get()`.
///
/// Each run logs what it deleted at `INFO`, or why it failed at `WARN` (and the next run
/// tries again). [`Pruner::shut_down`] stops it between runs: a run under way finishes
/// first, so no batch is cut off mid-statement.
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
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Pruner {
    /// Starts pruning on the current tokio runtime: the first run after about `every`.
    pub fn spawn<C, E, Connect, Connecting>(
        connect: Connect,
        every: Duration,
        older_than: Duration,
    ) -> Self
    where
        Connect: Fn() -> Connecting + Send + 'static,
        Connecting: Future<Output = Result<C, E>> + Send,
        C: AsyncConnection + 'static,
        C::Backend: InboxBackend,
        E: fmt::Display,
    {
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut stopped => return,
                    () = tokio::time::sleep(jittered(every)) => {}
                }
                let started = std::time::Instant::now();
                let connection = connect()
                    .await
                    .map_err(|error| format!("no connection: {error}"));
                let deleted = match connection {
                    Ok(mut conn) => prune(&mut conn, older_than)
                        .await
                        .map_err(|error| error.to_string()),
                    Err(error) => Err(error),
                };
                match deleted {
                    Ok(deleted) => tracing::info!(
                        inbox.pruned = deleted,
                        inbox.duration_ms = started.elapsed().as_secs_f64() * 1e3,
                        "pruned markers older than the retention window"
                    ),
                    Err(error) => tracing::warn!(error, "pruning failed; the next run tries again"),
                }
            }
        });
        Self { stop, task }
    }

    /// Stops pruning: waits for a run under way to finish, then ends the task.
    pub async fn shut_down(self) {
        // The task may have ended already, if its runtime is shutting down.
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// `every`, moved by up to a tenth either way.
fn jittered(every: Duration) -> Duration {
    every.mul_f64(0.9 + 0.2 * fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_a_tenth() {
        let every = Duration::from_secs(100);
        for _ in 0..1_000 {
            let delay = jittered(every);
            assert!((Duration::from_secs(90)..=Duration::from_secs(110)).contains(&delay));
        }
    }
}
