//! The credit handlers: the `#[idempotent]` one, its claim-mode twin that calls the
//! downstream service, the naive one they replace; the outbox chain's service A (which
//! credits and announces it, through the outbox or, naively, straight to the broker)
//! and service B (which records the announcements); and what a consumer reports about
//! each delivery.

use std::fmt;
use std::time::Duration;

use diesel::dsl::{exists, insert_into, select};
use diesel::prelude::*;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use diesel_inbox::outbox::{self, OutboxMessage};
use diesel_inbox::{Claim, Classify, Disposition, Outcome, idempotent};
use inbox_fixtures::credit::{Credit, credit_account, naive_inbox};
use inbox_fixtures::downstream::Client;

use crate::events::{self, Credited, Direct, Route, received_events};
use crate::{BoxError, ConsumeArgs, Handler, Stage};

/// Stands in for the work between reading and writing (a lookup, a computation): what
/// keeps the naive handler's check-then-act window open, and what a kill lands in.
const HANDLER_WORK: Duration = Duration::from_millis(2);

/// The claim-mode handler's lease: short, so that a claim left by a killed consumer is
/// taken over within the run, and long beside its body (one loopback call).
pub(crate) const CLAIM_LEASE: Duration = Duration::from_secs(2);

/// The naive handler's name for itself in `naive_inbox`.
pub(crate) const NAIVE_CONSUMER: &str = "chaos-naive";

/// Service A's inbox consumer in the outbox chain, and in its naive variant (as their
/// handlers' attributes name them).
pub(crate) const OUTBOX_CONSUMER: &str = "chaos-credit-outbox";
pub(crate) const PUBLISHING_CONSUMER: &str = "chaos-credit-publish";
pub(crate) const CREDIT_THEN_PUBLISH_CONSUMER: &str = "chaos-credit-then-publish";

/// Service B's inbox consumer (as its handler's attribute names it).
pub(crate) const RECORDING_CONSUMER: &str = "chaos-record-credited";

#[idempotent(consumer = "chaos-credit", key = msg.message_id.as_str())]
async fn credit(conn: &mut AsyncPgConnection, msg: &Credit) -> QueryResult<()> {
    tokio::time::sleep(HANDLER_WORK).await;
    credit_account(msg.account, msg.amount)
        .execute(conn)
        .await?;
    Ok(())
}

/// The credit as an external call: the body runs under a claim, outside any
/// transaction, and hands the downstream service the claim's idempotency key, which is
/// the same on every attempt.
#[idempotent(consumer = "chaos-credit-claim", key = msg.message_id.as_str(), claim, lease = CLAIM_LEASE)]
async fn credit_downstream(
    conn: &mut AsyncPgConnection,
    downstream: &Client,
    msg: &Credit,
) -> Result<(), BoxError> {
    let claim = Claim::current();
    tokio::time::sleep(HANDLER_WORK).await;
    downstream
        .credit(&claim.idempotency_key().to_string(), msg)
        .await?;
    Ok(())
}

/// Service A declined a credit after writing it and its event: the transaction rolls
/// back, and the consumer acknowledges the message without an effect.
#[derive(Debug)]
struct Declined;

impl fmt::Display for Declined {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("credit declined")
    }
}

impl std::error::Error for Declined {}

/// Service A: credits, enqueues "credited" in the same transaction, and then declines
/// every tenth credit, which takes the event back with it.
#[idempotent(consumer = "chaos-credit-outbox", key = msg.message_id.as_str())]
async fn credit_and_enqueue(
    conn: &mut AsyncPgConnection,
    route: &Route,
    msg: &Credit,
) -> Result<(), BoxError> {
    tokio::time::sleep(HANDLER_WORK).await;
    credit_account(msg.account, msg.amount)
        .execute(conn)
        .await?;
    // The default id: derived from the consumer, the credit's key and the index, so
    // that every delivery of the credit enqueues the same one.
    let event = OutboxMessage::new(&route.destination, Credited::of(msg).payload())
        .routing_key(&route.routing_key);
    outbox::enqueue(conn, event).await?;
    if events::declined(msg) {
        return Err(Declined.into());
    }
    Ok(())
}

/// Service A, naively: the same, but publishing "credited" from the body, before the
/// transaction commits, under an id as stable as the outbox's.
#[idempotent(consumer = "chaos-credit-publish", key = msg.message_id.as_str())]
async fn credit_and_publish(
    conn: &mut AsyncPgConnection,
    route: &Route,
    direct: &Direct,
    msg: &Credit,
) -> Result<(), BoxError> {
    tokio::time::sleep(HANDLER_WORK).await;
    credit_account(msg.account, msg.amount)
        .execute(conn)
        .await?;
    let event_id = format!("credited-{}", msg.message_id);
    direct.publish(route, &event_id, &Credited::of(msg)).await?;
    if events::declined(msg) {
        return Err(Declined.into());
    }
    Ok(())
}

/// Service A, naively the other way: only the credit (declined likewise), whose event
/// the consumer publishes once the handler has committed it.
#[idempotent(consumer = "chaos-credit-then-publish", key = msg.message_id.as_str())]
async fn credit_then_decline(conn: &mut AsyncPgConnection, msg: &Credit) -> Result<(), BoxError> {
    tokio::time::sleep(HANDLER_WORK).await;
    credit_account(msg.account, msg.amount)
        .execute(conn)
        .await?;
    if events::declined(msg) {
        return Err(Declined.into());
    }
    Ok(())
}

/// Service B: records each event once, keyed by the id the relay (or A) published.
#[idempotent(consumer = "chaos-record-credited", key = event_id)]
async fn record(conn: &mut AsyncPgConnection, event_id: &str, event: &Credited) -> QueryResult<()> {
    tokio::time::sleep(HANDLER_WORK).await;
    insert_into(received_events::table)
        .values((
            received_events::event_id.eq(event_id),
            received_events::credit_id.eq(&event.credit_id),
            received_events::account.eq(event.account),
            received_events::amount.eq(event.amount),
        ))
        .execute(conn)
        .await?;
    Ok(())
}

async fn naive_credit(conn: &mut AsyncPgConnection, msg: &Credit) -> QueryResult<Outcome<()>> {
    conn.transaction(async |conn| {
        let seen = select(exists(
            naive_inbox::table.filter(
                naive_inbox::message_id
                    .eq(&msg.message_id)
                    .and(naive_inbox::consumer.eq(NAIVE_CONSUMER)),
            ),
        ))
        .get_result::<bool>(conn)
        .await?;
        if seen {
            return Ok(Outcome::Duplicate);
        }
        tokio::time::sleep(HANDLER_WORK).await;
        credit_account(msg.account, msg.amount)
            .execute(conn)
            .await?;
        insert_into(naive_inbox::table)
            .values((
                naive_inbox::message_id.eq(&msg.message_id),
                naive_inbox::consumer.eq(NAIVE_CONSUMER),
            ))
            .execute(conn)
            .await?;
        Ok(Outcome::Processed(()))
    })
    .await
}

/// Where service A sends its events, and for the naive variant the publisher it sends
/// them with.
pub(crate) struct Announcing {
    pub(crate) route: Route,
    pub(crate) direct: Option<Direct>,
}

/// What a consumer's handlers share: the run's database, the downstream service, and
/// in service A of the outbox chain where its events go.
pub(crate) struct Context {
    pool: Pool<AsyncPgConnection>,
    downstream: Client,
    handler: Handler,
    stage: Stage,
    announcing: Option<Announcing>,
}

impl Context {
    pub(crate) fn new(
        args: &ConsumeArgs,
        announcing: Option<Announcing>,
    ) -> Result<Self, BoxError> {
        let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(&args.schema_url);
        let pool = Pool::builder(manager)
            .max_size(args.concurrency.into())
            .build()?;
        Ok(Self {
            pool,
            downstream: Client::new(&args.downstream_url),
            handler: args.handler,
            stage: args.stage,
            announcing,
        })
    }
}

/// Runs `handler` on one delivery and says what to tell the broker, with the label
/// the consumer reports. A delivery with no key or an unreadable payload is
/// dead-lettered and never processed.
pub(crate) async fn handle(
    context: &Context,
    key: Result<String, String>,
    payload: &[u8],
) -> (Disposition, &'static str) {
    let key = match key {
        Ok(key) => key,
        Err(reason) => return (Disposition::DeadLetter { reason }, "dead-lettered"),
    };
    let mut conn = match context.pool.get().await {
        Ok(conn) => conn,
        Err(error) => {
            let reason = error.to_string();
            return (
                Disposition::Retry {
                    after: None,
                    reason,
                },
                "retried",
            );
        }
    };
    if context.stage == Stage::Record {
        let Some(event) = Credited::parse(payload) else {
            let reason = "not a credited event".to_owned();
            return (Disposition::DeadLetter { reason }, "dead-lettered");
        };
        return settle(&record(&mut conn, &key, &event).await);
    }
    let Some(msg) = Credit::parse(&key, payload) else {
        let reason = "not a credit message".to_owned();
        return (Disposition::DeadLetter { reason }, "dead-lettered");
    };
    match context.handler {
        Handler::Inbox => settle(&credit(&mut conn, &msg).await),
        Handler::Naive => settle(&naive_credit(&mut conn, &msg).await),
        Handler::Claim => settle(&credit_downstream(&mut conn, &context.downstream, &msg).await),
        Handler::Outbox | Handler::OutboxNaive | Handler::OutboxAfterCommit => {
            announce(context, &mut conn, &msg).await
        }
    }
}

/// Service A's credit, with its event through the outbox or straight to the broker.
async fn announce(
    context: &Context,
    conn: &mut AsyncPgConnection,
    msg: &Credit,
) -> (Disposition, &'static str) {
    let result = match (context.handler, &context.announcing) {
        (Handler::Outbox, Some(announcing)) => {
            credit_and_enqueue(conn, &announcing.route, msg).await
        }
        (
            Handler::OutboxNaive,
            Some(Announcing {
                route,
                direct: Some(direct),
            }),
        ) => credit_and_publish(conn, route, direct, msg).await,
        (
            Handler::OutboxAfterCommit,
            Some(Announcing {
                route,
                direct: Some(direct),
            }),
        ) => match credit_then_decline(conn, msg).await {
            // Only the delivery that committed the credit announces it: a consumer
            // killed before this publish leaves a redelivery that finds a duplicate.
            Ok(Outcome::Processed(())) => {
                // Work between the commit and the publish (building the event, a
                // lookup), as HANDLER_WORK before the credit: what a kill lands in.
                tokio::time::sleep(HANDLER_WORK).await;
                let event_id = format!("credited-{}", msg.message_id);
                let published = direct.publish(route, &event_id, &Credited::of(msg)).await;
                published.map(|()| Outcome::Processed(()))
            }
            result => result,
        },
        _ => {
            let reason = "service A started without its events' route".to_owned();
            return (Disposition::DeadLetter { reason }, "dead-lettered");
        }
    };
    match result {
        // A business refusal: nothing was written, and there is nothing to redeliver.
        Err(error) if error.is::<Declined>() => (Disposition::Ack, "declined"),
        result => settle(&result),
    }
}

/// What to tell the broker about a handler's result, and the label to report.
fn settle<E>(result: &Result<Outcome<()>, E>) -> (Disposition, &'static str)
where
    E: Classify + fmt::Display,
{
    let label = match result {
        Ok(Outcome::Processed(())) => "processed",
        Ok(Outcome::Duplicate) => "duplicate",
        Ok(Outcome::InProgress { .. }) => "in-progress",
        Err(_) => "failed",
    };
    let disposition = Disposition::of(result);
    let label = match disposition {
        Disposition::Ack => label,
        // Held by a live claim elsewhere: retried once its lease has run out.
        Disposition::Retry { .. } if matches!(result, Ok(Outcome::InProgress { .. })) => {
            "in-progress"
        }
        Disposition::Retry { .. } => "retried",
        Disposition::DeadLetter { .. } => "dead-lettered",
        // Counted apart, so that a run with a disposition the brokers' glue does not
        // know fails its tally instead of passing unnoticed.
        _ => "unknown-disposition",
    };
    (disposition, label)
}

/// One line per settled delivery on stdout, which the run counts: `<outcome>
/// <redelivered>`. Line-buffered, so a kill loses at most the line being written.
pub(crate) fn report(label: &str, redelivered: bool) {
    println!("{label} {}", u8::from(redelivered));
}
