//! What the background tasks (features `pruner`, `relay`) share: where they take their
//! connections, and how they are told to stop.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use diesel_async::AsyncConnection;
use tokio::sync::watch;

use crate::backend::InboxBackend;

/// Where a background task ([`Pruner`](crate::Pruner), [`Relay`](crate::outbox::Relay))
/// takes its connections: an owned diesel-async pool (deadpool's or bb8's, with
/// diesel-inbox's feature of that name, `deadpool` or `bb8`: without it a pool is not a
/// source, and the compiler asks for a closure instead), or a closure that returns a
/// future of one, such as `|| pool.get()` on a `&'static` pool.
pub trait ConnectionSource: Send + 'static {
    /// The connection it gives.
    type Connection: AsyncConnection<Backend: InboxBackend> + 'static;
    /// Why it gave none, logged at `WARN`.
    type Error: fmt::Display;

    /// A connection for one run.
    fn connect(&self) -> impl Future<Output = Result<Self::Connection, Self::Error>> + Send + '_;
}

impl<F, Connecting, C, E> ConnectionSource for F
where
    F: Fn() -> Connecting + Send + 'static,
    Connecting: Future<Output = Result<C, E>> + Send + 'static,
    C: AsyncConnection<Backend: InboxBackend> + 'static,
    E: fmt::Display,
{
    type Connection = C;
    type Error = E;

    fn connect(&self) -> impl Future<Output = Result<C, E>> + Send + '_ {
        self()
    }
}

#[cfg(feature = "deadpool")]
impl<C> ConnectionSource for diesel_async::pooled_connection::deadpool::Pool<C>
where
    C: diesel_async::pooled_connection::PoolableConnection<Backend: InboxBackend> + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    type Connection = diesel_async::pooled_connection::deadpool::Object<C>;
    type Error = diesel_async::pooled_connection::deadpool::PoolError;

    fn connect(&self) -> impl Future<Output = Result<Self::Connection, Self::Error>> + Send + '_ {
        self.get()
    }
}

#[cfg(feature = "bb8")]
impl<C> ConnectionSource for diesel_async::pooled_connection::bb8::Pool<C>
where
    C: diesel_async::pooled_connection::PoolableConnection<Backend: InboxBackend> + 'static,
    for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
        diesel_async::methods::LoadQuery<'a, C, i32>,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    type Connection = diesel_async::pooled_connection::bb8::PooledConnection<'static, C>;
    type Error = diesel_async::pooled_connection::bb8::RunError;

    fn connect(&self) -> impl Future<Output = Result<Self::Connection, Self::Error>> + Send + '_ {
        self.get_owned()
    }
}

/// Once the task's owner asks it to stop (sends `true`), or drops the sender.
pub(crate) async fn shutting_down(mut stopped: watch::Receiver<bool>) {
    // An error means the sender is gone: nobody can ask any more, so stop as well.
    let _ = stopped.wait_for(|&stop| stop).await;
}

/// `every`, moved by up to a tenth either way, so that instances started together do not
/// run in step; `every` itself where that would not fit in a `Duration` (a task that
/// never runs, at `Duration::MAX`).
pub(crate) fn jittered(every: Duration) -> Duration {
    Duration::try_from_secs_f64(every.as_secs_f64() * (0.9 + 0.2 * fastrand::f64()))
        .unwrap_or(every)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_never_overflows() {
        for _ in 0..1_000 {
            assert!(jittered(Duration::MAX) >= Duration::MAX.mul_f64(0.9));
        }
    }

    #[test]
    fn jitter_stays_within_a_tenth() {
        let every = Duration::from_secs(100);
        for _ in 0..1_000 {
            let delay = jittered(every);
            assert!((Duration::from_secs(90)..=Duration::from_secs(110)).contains(&delay));
        }
    }
}
