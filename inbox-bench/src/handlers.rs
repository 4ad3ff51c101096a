//! The credit handler each variant runs.
//!
//! Every handler makes the same business change, [`Statements::credit`], and reports
//! whether it applied it ([`Outcome::Processed`]) or found the message already
//! processed ([`Outcome::Duplicate`]).
//!
//! [`Statements::credit`]: crate::connection::Statements::credit

use std::any::Any;
use std::collections::BTreeMap;

use diesel::QueryResult;
use diesel::result::{DatabaseErrorKind, Error};
use diesel_async::AsyncPgConnection;
use diesel_inbox::{BatchOutcome, Claim, Outcome, idempotent};

use crate::backend::Backend;
use crate::connection::{BenchConnection, Statements as _};
use crate::variant::Variant;
use crate::workload::Delivery;

/// The consumer of (4), (7) and (8)'s handler on `backend`: [`idempotent_credit`], or on
/// PostgreSQL [`pg_idempotent_credit`]. The attribute needs a literal, so each is spelled
/// there too; the pre-filled rows that variant 7 relies on use this.
pub const fn idempotent_consumer(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "bench-credit-pg",
        Backend::Mysql | Backend::Sqlite => "bench-credit",
    }
}
/// The consumer of [`duplicated_credit`], spelled out for the rows variant 5 pre-marks.
/// It is not [`idempotent_consumer`]'s: a handler's adaptive fast path goes by its recent
/// duplicates, and a replay must not make the measurements after it read first. The
/// runner fails a measurement whose duplicates do not show up.
pub const DUPLICATED_CONSUMER: &str = "bench-credit-duplicated";
const NAIVE_CONSUMER: &str = "bench-naive";
const HAND_WRITTEN_CONSUMER: &str = "bench-hand-written";
const PEER_CONSUMER: &str = "bench-peer";

/// What one call of a handler did with its deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    Settled {
        processed: u64,
        duplicates: u64,
    },
    /// Another delivery holds the message's claim: deliver it again.
    InProgress,
}

impl From<Outcome<()>> for Handled {
    fn from(outcome: Outcome<()>) -> Self {
        match outcome {
            Outcome::Processed(()) => Self::Settled {
                processed: 1,
                duplicates: 0,
            },
            Outcome::Duplicate => Self::Settled {
                processed: 0,
                duplicates: 1,
            },
            Outcome::InProgress { .. } => Self::InProgress,
        }
    }
}

impl<T> From<BatchOutcome<T>> for Handled {
    fn from(batch: BatchOutcome<T>) -> Self {
        Self::Settled {
            processed: batch.processed() as u64,
            duplicates: batch.duplicates() as u64,
        }
    }
}

/// Handles `deliveries` as `variant` does: a batch variant in one call, any other
/// variant one delivery at a time, as [`Variant::messages_per_call`] hands them out.
pub async fn handle<C: BenchConnection>(
    variant: Variant,
    conn: &mut C,
    deliveries: &[Delivery],
) -> QueryResult<Handled> {
    match variant {
        Variant::Batch(_) => match (conn as &mut dyn Any).downcast_mut() {
            Some(pg) => Ok(pg_idempotent_batch_credit(pg, deliveries).await?.into()),
            None => Ok(idempotent_batch_credit(conn, deliveries).await?.into()),
        },
        Variant::BareBatch(_) => bare_batch(conn, deliveries).await,
        _ => {
            let [delivery] = deliveries else {
                unreachable!("{} takes one delivery per call", variant.label())
            };
            Ok(handle_one(variant, conn, delivery).await?.into())
        }
    }
}

/// Handles one delivery as `variant` does.
async fn handle_one<C: BenchConnection>(
    variant: Variant,
    conn: &mut C,
    delivery: &Delivery,
) -> QueryResult<Outcome<()>> {
    match variant {
        Variant::Bare => bare(conn, delivery).await,
        Variant::Naive => naive(conn, delivery).await,
        Variant::HandWritten => hand_written(conn, delivery).await,
        Variant::Idempotent | Variant::Prefilled { .. } | Variant::PruneUnderLoad { .. } => {
            match (conn as &mut dyn Any).downcast_mut() {
                Some(pg) => pg_idempotent_credit(pg, delivery).await,
                None => idempotent_credit(conn, delivery).await,
            }
        }
        Variant::Duplicates { .. } => duplicated_credit(conn, delivery).await,
        Variant::IdempotentReadingFirst => idempotent_credit_reading_first(conn, delivery).await,
        Variant::Claimed => claimed_credit(conn, delivery).await,
        Variant::PeerFlow => peer_flow(conn, delivery).await,
        Variant::Batch(_) | Variant::BareBatch(_) => {
            unreachable!("a batch is handled in one call")
        }
        Variant::Reference { .. } => {
            unreachable!("a C client runs the reference script on connections of its own")
        }
    }
}

/// (1) The ceiling: the credit in a transaction of its own, no inbox at all.
async fn bare<C: BenchConnection>(conn: &mut C, delivery: &Delivery) -> QueryResult<Outcome<()>> {
    let (account, amount) = (delivery.account, delivery.amount);
    conn.transaction(async move |conn| conn.credit(account, amount).await)
        .await?;
    Ok(Outcome::Processed(()))
}

/// (2) What most people write first. The look-up runs before the transaction and nothing
/// is unique, so two concurrent copies of a message can both be applied. The table has a
/// plain index, so the look-up costs what the inbox's does.
async fn naive<C: BenchConnection>(conn: &mut C, delivery: &Delivery) -> QueryResult<Outcome<()>> {
    let message_id = delivery.message_id.to_string();
    if conn.naive_seen(message_id.clone(), NAIVE_CONSUMER).await? {
        return Ok(Outcome::Duplicate);
    }
    let (account, amount) = (delivery.account, delivery.amount);
    conn.transaction(async move |conn| {
        conn.naive_record(message_id, NAIVE_CONSUMER).await?;
        conn.credit(account, amount).await
    })
    .await?;
    Ok(Outcome::Processed(()))
}

/// (3) The statements `#[idempotent]` issues for a new message, in its order. With
/// unique keys its adaptive fast path never reads first, so neither does this: BEGIN and
/// the marker insert (on PostgreSQL one round trip, pipelined as for a handler that names
/// `AsyncPgConnection`; on MySQL and SQLite one batch with
/// the savepoint, on MySQL ahead of the marker, then its id and autocommit off), the
/// credit, then the backend's checked commit in one round trip (PostgreSQL:
/// `SELECT 1; COMMIT`; MySQL and SQLite: `RELEASE SAVEPOINT …; COMMIT`, on MySQL then
/// the statement prepared per connection that restores autocommit, after checking the
/// marker row on a Galera node or a server that is not MariaDB). A duplicate or an error
/// rolls back.
/// Transaction control is raw SQL because the library's commit is not
/// `AsyncConnection::transaction`'s.
async fn hand_written<C: BenchConnection>(
    conn: &mut C,
    delivery: &Delivery,
) -> QueryResult<Outcome<()>> {
    let message_id = delivery.message_id.to_string();
    let attempt = async {
        if !conn
            .begin_with_marker(message_id.clone(), HAND_WRITTEN_CONSUMER)
            .await?
        {
            return Ok(Outcome::Duplicate);
        }
        conn.credit(delivery.account, delivery.amount).await?;
        conn.commit_checked(message_id, HAND_WRITTEN_CONSUMER)
            .await?;
        Ok(Outcome::Processed(()))
    }
    .await;
    match attempt {
        Ok(Outcome::Duplicate) => {
            conn.batch_execute("ROLLBACK").await?;
            Ok(Outcome::Duplicate)
        }
        Ok(processed) => Ok(processed),
        Err(error) => Err(roll_back_for(conn, error).await),
    }
}

/// (4), (7) and (8).
#[idempotent(consumer = "bench-credit", key = delivery.message_id)]
async fn idempotent_credit<C: BenchConnection>(
    conn: &mut C,
    delivery: &Delivery,
) -> Result<(), Error> {
    conn.credit(delivery.account, delivery.amount).await?;
    Ok(())
}

/// (4), (7) and (8) on PostgreSQL, with the connection's type named as services write
/// it: BEGIN and the marker insert then share a round trip. The generic handlers above
/// and below send them in two there.
#[idempotent(consumer = "bench-credit-pg", key = delivery.message_id)]
async fn pg_idempotent_credit(
    conn: &mut AsyncPgConnection,
    delivery: &Delivery,
) -> Result<(), Error> {
    conn.credit(delivery.account, delivery.amount).await?;
    Ok(())
}

/// (5).
#[idempotent(consumer = "bench-credit-duplicated", key = delivery.message_id)]
async fn duplicated_credit<C: BenchConnection>(
    conn: &mut C,
    delivery: &Delivery,
) -> Result<(), Error> {
    conn.credit(delivery.account, delivery.amount).await?;
    Ok(())
}

/// (4b).
#[idempotent(
    consumer = "bench-credit-read-first",
    key = delivery.message_id,
    fast_path = true
)]
async fn idempotent_credit_reading_first<C: BenchConnection>(
    conn: &mut C,
    delivery: &Delivery,
) -> Result<(), Error> {
    conn.credit(delivery.account, delivery.amount).await?;
    Ok(())
}

/// (b10, b50, b100) The batch's new messages credited in one statement, their markers
/// inserted in one (PostgreSQL) or per 64 (MySQL, SQLite), in one transaction.
#[idempotent(consumer = "bench-batch", batch = deliveries, key = |delivery| delivery.message_id)]
async fn idempotent_batch_credit<C: BenchConnection>(
    conn: &mut C,
    deliveries: &[Delivery],
) -> Result<(), Error> {
    conn.credit_batch(&batch_credits(deliveries.iter().copied()))
        .await
}

/// The batches on PostgreSQL, with the connection's type named, as
/// [`pg_idempotent_credit`].
#[idempotent(consumer = "bench-batch-pg", batch = deliveries, key = |delivery| delivery.message_id)]
async fn pg_idempotent_batch_credit(
    conn: &mut AsyncPgConnection,
    deliveries: &[Delivery],
) -> Result<(), Error> {
    conn.credit_batch(&batch_credits(deliveries.iter().copied()))
        .await
}

/// (bb10, bb50, bb100) The batch's credits in a transaction of their own, no inbox.
async fn bare_batch<C: BenchConnection>(
    conn: &mut C,
    deliveries: &[Delivery],
) -> QueryResult<Handled> {
    let credits = batch_credits(deliveries.iter());
    conn.transaction(async move |conn| conn.credit_batch(&credits).await)
        .await?;
    Ok(Handled::Settled {
        processed: deliveries.len() as u64,
        duplicates: 0,
    })
}

/// A batch's credits summed by account, accounts ascending: two messages for one
/// account add up, and every batch locks its accounts in the same order.
fn batch_credits<'d>(deliveries: impl Iterator<Item = &'d Delivery>) -> Vec<(i64, i64)> {
    let mut credits = BTreeMap::new();
    for delivery in deliveries {
        *credits.entry(delivery.account).or_insert(0) += delivery.amount;
    }
    credits.into_iter().collect()
}

/// (4c) Claim mode, as for an effect outside the database: the claim commits on its
/// own, then the body runs outside any transaction: the external call, here a no-op
/// given the claim's idempotency key as a real call would be, and the credit, which
/// autocommits; then the completion commits. Three statements, each its own commit.
#[idempotent(consumer = "bench-claim", key = delivery.message_id, claim)]
async fn claimed_credit<C: BenchConnection>(
    conn: &mut C,
    delivery: &Delivery,
) -> Result<(), Error> {
    std::hint::black_box(Claim::current().idempotency_key());
    conn.credit(delivery.account, delivery.amount).await?;
    Ok(())
}

/// (6) The flow of MassTransit's Entity Framework Core inbox, on a table like its
/// `InboxState`: a first transaction records the delivery and commits; a second,
/// serializable one locks that row (`SELECT … FOR UPDATE`), runs the handler and marks the
/// row consumed. The second transaction is opened with raw SQL because its isolation
/// level is spelled differently on each backend.
async fn peer_flow<C: BenchConnection>(
    conn: &mut C,
    delivery: &Delivery,
) -> QueryResult<Outcome<()>> {
    let message_id = delivery.message_id.to_string();
    let received = message_id.clone();
    let recorded = conn
        .transaction(async move |conn| conn.peer_insert(received, PEER_CONSUMER).await)
        .await;
    match recorded {
        // A retry after the second transaction failed finds the row already recorded.
        Ok(_) | Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => {}
        Err(error) => return Err(error),
    }

    conn.batch_execute(C::BEGIN_SERIALIZABLE).await?;
    let attempt = async {
        match conn
            .lock_peer_row(message_id.clone(), PEER_CONSUMER)
            .await?
        {
            Some(false) => {}
            Some(true) => return Ok(Outcome::Duplicate),
            None => return Err(Error::NotFound),
        }
        conn.credit(delivery.account, delivery.amount).await?;
        conn.consume_peer_row(message_id, PEER_CONSUMER).await?;
        Ok(Outcome::Processed(()))
    }
    .await;
    match attempt {
        Ok(outcome) => match conn.batch_execute("COMMIT").await {
            Ok(()) => Ok(outcome),
            Err(error) => Err(roll_back_for(conn, error).await),
        },
        Err(error) => Err(roll_back_for(conn, error).await),
    }
}

/// Rolls back the transaction `error` ended, and returns `error`: it explains more than a
/// failed ROLLBACK after it (or one with no transaction left to end).
async fn roll_back_for<C: BenchConnection>(conn: &mut C, error: Error) -> Error {
    let _already_over = conn.batch_execute(C::ROLLBACK).await;
    error
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Workload;

    #[test]
    fn a_batch_sums_its_credits_by_account_in_ascending_order() {
        let delivery = |account| Delivery {
            account,
            ..Workload::new(1, 1, 0).delivery(0)
        };
        let batch = [
            delivery(7),
            delivery(3),
            delivery(7),
            delivery(5),
            delivery(7),
        ];
        assert_eq!(batch_credits(batch.iter()), [(3, 1), (5, 1), (7, 3)]);
    }
}
