//! The outbox chain's side of the run: its tables, when it has drained, and its checks:
//! every committed credit announced once and recorded by service B once, no trace of a
//! declined one (no marker, no outbox row, no event), and the outbox all sent.

use std::collections::{HashMap, HashSet};

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use diesel_inbox::outbox;
use diesel_inbox::testing::select_i64;
use inbox_fixtures::credit::Credit;

use crate::events::{self, Credited, received_events};
use crate::handlers::{
    CREDIT_THEN_PUBLISH_CONSUMER, OUTBOX_CONSUMER, PUBLISHING_CONSUMER, RECORDING_CONSUMER,
};
use crate::{BoxError, Handler};

diesel::table! {
    /// The columns of the outbox the checks read.
    inbox_outbox (id) {
        id -> BigInt,
        message_id -> Text,
        payload -> Binary,
        parked -> Bool,
        sent_at -> Nullable<Timestamptz>,
    }
}

/// The outbox, and service B's table, beside the credits'.
pub(crate) async fn create_tables(conn: &mut AsyncPgConnection) -> Result<(), BoxError> {
    outbox::migrate(conn).await?;
    conn.batch_execute(events::CREATE_TABLES).await?;
    Ok(())
}

/// The credits service A does not decline.
pub(crate) fn committed(unique: &[Credit]) -> impl Iterator<Item = &Credit> {
    unique.iter().filter(|credit| !events::declined(credit))
}

/// Service A's inbox consumer.
fn announcing_consumer(handler: Handler) -> &'static str {
    match handler {
        Handler::OutboxNaive => PUBLISHING_CONSUMER,
        Handler::OutboxAfterCommit => CREDIT_THEN_PUBLISH_CONSUMER,
        _ => OUTBOX_CONSUMER,
    }
}

/// Credits service A has committed.
pub(crate) fn applied_sql(handler: Handler) -> String {
    let consumer = announcing_consumer(handler);
    format!("SELECT COUNT(DISTINCT message_id) FROM inbox WHERE consumer = '{consumer}'")
}

/// Outbox messages not yet sent.
pub(crate) async fn unsent(conn: &mut AsyncPgConnection) -> Result<i64, BoxError> {
    let sql = "SELECT COUNT(*) FROM inbox_outbox WHERE sent_at IS NULL";
    Ok(select_i64(conn, sql).await?)
}

/// Whether the outbox is all sent and service B has recorded every event it holds.
/// A service A that publishes itself has published each event before it acknowledged
/// the credit: they are all in the events' queue once the credits' is drained.
pub(crate) async fn relayed(
    handler: Handler,
    conn: &mut AsyncPgConnection,
) -> Result<bool, BoxError> {
    if unsent(conn).await? > 0 {
        return Ok(false);
    }
    if handler.publishes_directly() {
        return Ok(true);
    }
    let announced = select_i64(conn, "SELECT COUNT(*) FROM inbox_outbox").await?;
    let recorded = select_i64(
        conn,
        &format!(
            "SELECT COUNT(DISTINCT message_id) FROM inbox WHERE consumer = '{RECORDING_CONSUMER}'"
        ),
    )
    .await?;
    Ok(recorded >= announced)
}

/// What the chain's checks counted, for the report.
pub(crate) struct Figures {
    outbox_rows: usize,
    events_recorded: usize,
}

impl Figures {
    /// `published`: the relays' confirmed publishes; `absorbed`: the duplicates service
    /// B acknowledged.
    pub(crate) fn report(&self, published: u64, absorbed: u64) {
        let (messages, events) = (self.outbox_rows, self.events_recorded);
        // A relay killed between a publish and its report publishes uncounted.
        let again = (published as usize).saturating_sub(messages);
        println!(
            "outbox: {messages} messages; relays: {published} publishes confirmed, at least \
             {again} of them again; service B: {events} events recorded, {absorbed} copies \
             absorbed by its inbox (duplicates acked)",
        );
    }
}

/// What the events' queue or stream held at the end.
pub(crate) struct EventsQueue {
    pub(crate) left: u64,
    pub(crate) dead_letters: u64,
}

/// Checks service A's markers, the outbox and service B's records against the plan,
/// and the events' queue or stream; pushes what failed to `failures`.
pub(crate) async fn verify(
    handler: Handler,
    conn: &mut AsyncPgConnection,
    unique: &[Credit],
    events: EventsQueue,
    failures: &mut Vec<String>,
) -> Result<Figures, BoxError> {
    let committed: HashSet<&str> = committed(unique)
        .map(|credit| credit.message_id.as_str())
        .collect();
    let declined: HashSet<&str> = unique
        .iter()
        .map(|credit| credit.message_id.as_str())
        .filter(|id| !committed.contains(id))
        .collect();

    let markers = select_i64(
        conn,
        &format!(
            "SELECT COUNT(*) FROM inbox WHERE consumer = '{}'",
            announcing_consumer(handler)
        ),
    )
    .await?;
    let keys = select_i64(conn, &applied_sql(handler)).await?;
    if markers != committed.len() as i64 || keys != committed.len() as i64 {
        failures.push(format!(
            "service A: {markers} markers for {keys} credits, expected one for each of {} \
             committed credits",
            committed.len()
        ));
    }

    let rows: Vec<(String, Vec<u8>, bool, bool)> = inbox_outbox::table
        .select((
            inbox_outbox::message_id,
            inbox_outbox::payload,
            inbox_outbox::parked,
            inbox_outbox::sent_at.is_not_null(),
        ))
        .load(conn)
        .await?;
    let mut enqueued: HashMap<String, usize> = HashMap::new();
    for (_, payload, _, _) in &rows {
        let credit = Credited::parse(payload).map_or_else(String::new, |event| event.credit_id);
        *enqueued.entry(credit).or_default() += 1;
    }
    let unsent = rows.iter().filter(|row| !row.3).count();
    let parked = rows.iter().filter(|row| row.2).count();
    if unsent > 0 || parked > 0 {
        failures.push(format!(
            "the outbox has {unsent} messages unsent, {parked} of them parked"
        ));
    }
    let for_declined: usize = declined.iter().filter_map(|id| enqueued.get(*id)).sum();
    if for_declined > 0 {
        failures.push(format!(
            "{for_declined} outbox messages for credits that rolled back"
        ));
    }
    if handler == Handler::Outbox {
        let wrong = committed
            .iter()
            .filter(|id| enqueued.get(**id) != Some(&1))
            .count();
        if wrong > 0 || rows.len() != committed.len() {
            failures.push(format!(
                "{} outbox messages for {} committed credits: {wrong} credits without \
                 exactly one",
                rows.len(),
                committed.len()
            ));
        }
    }

    let received: Vec<(String, String)> = received_events::table
        .select((received_events::event_id, received_events::credit_id))
        .load(conn)
        .await?;
    let mut by_credit: HashMap<&str, usize> = HashMap::new();
    let mut by_event: HashMap<&str, usize> = HashMap::new();
    for (event, credit) in &received {
        *by_credit.entry(credit).or_default() += 1;
        *by_event.entry(event).or_default() += 1;
    }
    let rolled_back = declined
        .iter()
        .filter(|id| by_credit.contains_key(**id))
        .count();
    if rolled_back > 0 {
        failures.push(format!(
            "events for credits that rolled back: {rolled_back} of {} declined credits \
             announced to service B",
            declined.len()
        ));
    }
    let lost = committed
        .iter()
        .filter(|id| !by_credit.contains_key(**id))
        .count();
    if lost > 0 {
        failures.push(format!(
            "lost events: {lost} committed credits never reached service B"
        ));
    }
    let doubled = committed
        .iter()
        .filter(|id| by_credit.get(**id).is_some_and(|&rows| rows > 1))
        .count();
    let recorded_twice = by_event.values().filter(|&&rows| rows > 1).count();
    if doubled > 0 || recorded_twice > 0 {
        failures.push(format!(
            "double-recorded events: {doubled} credits recorded more than once by service B \
             ({recorded_twice} event ids recorded twice)"
        ));
    }
    let unknown = by_credit
        .keys()
        .filter(|id| !committed.contains(**id) && !declined.contains(**id))
        .count();
    if unknown > 0 {
        failures.push(format!(
            "service B recorded events for {unknown} credits that were never published"
        ));
    }
    if handler == Handler::Outbox {
        let ids: HashSet<&str> = rows.iter().map(|row| row.0.as_str()).collect();
        let strangers = by_event.keys().filter(|id| !ids.contains(**id)).count();
        if strangers > 0 {
            failures.push(format!(
                "service B recorded {strangers} event ids that are not in the outbox"
            ));
        }
    }

    if events.left > 0 {
        failures.push(format!("{} events left in their queue", events.left));
    }
    if events.dead_letters > 0 {
        failures.push(format!("{} events dead-lettered", events.dead_letters));
    }
    Ok(Figures {
        outbox_rows: rows.len(),
        events_recorded: received.len(),
    })
}
