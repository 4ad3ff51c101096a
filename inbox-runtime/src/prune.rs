//! Deleting markers old enough that no redelivery can still arrive for them.

use std::future::Future;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use diesel::QueryResult;
use diesel_async::AsyncConnection;

use crate::backend::sealed::{MarkerAge, PruneBounds, Sealed as _};
use crate::backend::{InFlight, InboxBackend, outside_a_transaction};

/// Ids per statement: enough to make each round trip worth it, few enough that a
/// batch's locks and its transaction stay short beside the handlers.
const BATCH: i64 = 1_000;

/// Windows longer than this find nothing: no marker is five centuries old. Each
/// backend's date arithmetic fails somewhat further back (MariaDB's `DATETIME` begins
/// in the year 1000, PostgreSQL's and SQLite's a few thousand years BC), where a window
/// would be an error instead of "nothing is that old".
pub(crate) const LONGEST_WINDOW: Duration = Duration::from_secs(500 * 365 * 24 * 3600);

/// Deletes the markers processed more than `older_than` ago, as the database's clock
/// tells time, and returns how many it deleted. A claim that was never completed is
/// never deleted, however old: it is listed by
/// [`claims::list_stale`](crate::claims::list_stale) for a person to settle.
///
/// Works in batches of 1,000 ids, each one statement and so its own short transaction,
/// lowest ids first, up to where the window begins, which it finds by bisecting the
/// primary key: it never scans the recent part of the inbox, and reads the old part only
/// to delete it. Several instances may prune at once: none deadlocks, and no
/// row is counted twice. Like a handler, it refuses a connection inside a transaction,
/// where its batches would not be short.
///
/// A marker deleted too early lets a late redelivery of its message through as new, so
/// choose `older_than` from the broker's settings: [`Retention`](crate::Retention)
/// does the arithmetic. SQLite stores `processed_at` in whole seconds, and compares the
/// window to the second.
///
/// # Errors
///
/// A database error, or
/// [`AlreadyInTransaction`](diesel::result::Error::AlreadyInTransaction). Batches
/// deleted before an error stay deleted.
pub async fn prune<C>(conn: &mut C, older_than: Duration) -> QueryResult<u64>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    prune_in_batches(conn, older_than, |_| {
        std::future::ready(ControlFlow::Continue(()))
    })
    .await
}

/// [`prune`], calling `after_batch` with the time each batch took: it may pause before
/// the next batch, or end the prune there.
pub(crate) async fn prune_in_batches<C, AfterBatch, Pausing>(
    conn: &mut C,
    older_than: Duration,
    after_batch: AfterBatch,
) -> QueryResult<u64>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    AfterBatch: FnMut(Duration) -> Pausing,
    Pausing: Future<Output = ControlFlow<()>>,
{
    outside_a_transaction(conn)?;
    if older_than > LONGEST_WINDOW {
        return Ok(0);
    }
    let window = i64::try_from(older_than.as_micros()).expect("five centuries fit in i64 µs");
    // Its statements run outside any transaction: a prune dropped midway leaves the
    // connection marked, never one whose next user reads the prune's answers.
    let in_flight = InFlight::mark(conn)?;
    let pruned = prune_window(conn, window, after_batch).await;
    in_flight.answered(conn);
    pruned
}

/// [`prune_in_batches`] of the markers older than `window` µs.
async fn prune_window<C, AfterBatch, Pausing>(
    conn: &mut C,
    window: i64,
    mut after_batch: AfterBatch,
) -> QueryResult<u64>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    AfterBatch: FnMut(Duration) -> Pausing,
    Pausing: Future<Output = ControlFlow<()>>,
{
    let Some(PruneBounds {
        start: Some(mut from),
        end: Some(end),
    }) = C::Backend::prune_bounds(conn).await?
    else {
        return Ok(0);
    };
    let end = window_start(conn, window, from, end).await?;
    let mut deleted = 0;
    // By id ranges rather than `ORDER BY id LIMIT`: each batch then starts where the
    // last one ended, instead of stepping again over the rows the earlier batches
    // deleted (11 times faster for a million markers on PostgreSQL).
    while from < end {
        let to = from.saturating_add(BATCH).min(end);
        let started = Instant::now();
        let batch = C::Backend::prune_batch(conn, window, from, to).await?;
        deleted += batch as u64;
        tracing::debug!(
            target: "diesel_inbox",
            { inbox.pruned = batch, inbox.pruned_total = deleted },
            "pruned a batch of markers"
        );
        from = to;
        if from < end && after_batch(started.elapsed()).await.is_break() {
            break;
        }
    }
    Ok(deleted)
}

/// The lowest id in `start..end` from which on the first marker is inside the window, or
/// `end` when none is: where the walk of old markers stops, found by bisecting the
/// primary key, a few dozen seeks whatever the inbox holds. Ids grow with insertion
/// time, so the old markers lie below it. Where concurrent inserts made them grow out of
/// step by a moment, each batch still deletes only what is old, and an old marker left
/// above the bound goes in the next prune. A marker processed long after its insert (a
/// claim completed late) holds the bound below it until it is old too.
async fn window_start<C>(conn: &mut C, window: i64, start: i64, end: i64) -> QueryResult<i64>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let (mut low, mut high) = (start, end);
    while low < high {
        let middle = low + (high - low) / 2;
        match C::Backend::first_marker_from(conn, window, middle).await? {
            Some(MarkerAge { id, old: true }) => low = id.saturating_add(1).min(high),
            Some(MarkerAge { old: false, .. }) | None => high = middle,
        }
    }
    Ok(low)
}
