//! `diesel_inbox_lapin` against the local RabbitMQ: the key of a delivery, and each
//! disposition carried out on real queues. Each test declares queues of its own and
//! deletes them at the end.

use std::time::{Duration, Instant};

use broker_test_support::server_url;
use diesel_async::RunQueryDsl;
use diesel_inbox::testing::{TestDatabase, select_i64};
use diesel_inbox::{Disposition, idempotent};
use diesel_inbox_lapin::{Queues, REASON_HEADER, SettleError, Settled, message_key, retries};
use lapin::message::BasicGetMessage;
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection};

#[path = "rabbitmq/outage.rs"]
mod outage;
#[path = "rabbitmq/outbox.rs"]
mod outbox;

/// A channel of `connection` in confirm mode, which `Queues::settle` needs for its
/// copies.
async fn confirming_channel(connection: &Connection) -> Channel {
    let channel = connection.create_channel().await.expect("open a channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm mode");
    channel
}

struct Broker {
    url: String,
    connection: Connection,
    channel: Channel,
    queues: Queues,
}

/// A confirm-mode channel and queues named after the test, or `None` without `AMQP_URL`.
/// A retry, as `Disposition::of` makes one for a transient error.
fn retry(after: Option<Duration>) -> Disposition {
    Disposition::Retry {
        after,
        reason: String::from("the database was unreachable"),
    }
}

async fn broker(test: &str) -> Option<Broker> {
    let url = server_url("AMQP_URL")?;
    let connection = diesel_inbox_lapin::connect(&url)
        .await
        .expect("connect to RabbitMQ");
    let channel = confirming_channel(&connection).await;
    let queues = Queues::new(format!("inbox-test.{test}.{}", std::process::id()))
        .with_retry_delay(Duration::from_millis(200));
    // A run that panicked left its queues behind.
    queues.delete(&channel).await.expect("delete old queues");
    queues.declare(&channel).await.expect("declare the queues");
    Some(Broker {
        url,
        connection,
        channel,
        queues,
    })
}

impl Broker {
    async fn publish(&self, message_id: Option<&str>, payload: &[u8]) {
        let mut properties = BasicProperties::default().with_delivery_mode(2);
        if let Some(id) = message_id {
            properties = properties.with_message_id(id.into());
        }
        let confirmation = self
            .channel
            .basic_publish(
                "",
                self.queues.work(),
                BasicPublishOptions::default(),
                payload,
                properties,
            )
            .await
            .expect("publish")
            .await
            .expect("publish confirmed");
        assert!(confirmation.is_ack());
    }

    async fn get(&self, queue: &str) -> Option<BasicGetMessage> {
        self.channel
            .basic_get(queue, BasicGetOptions::default())
            .await
            .expect("basic.get")
    }

    /// The next message of `queue`, waiting up to `within` for it.
    async fn next(&self, queue: &str, within: Duration) -> Option<BasicGetMessage> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(message) = self.get(queue).await {
                return Some(message);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn settle(&self, message: &BasicGetMessage, disposition: &Disposition) -> Settled {
        self.queues
            .settle(&self.channel, message, disposition)
            .await
            .expect("settle")
    }

    async fn cleanup(self) {
        self.queues
            .delete(&self.channel)
            .await
            .expect("delete the queues");
        self.connection.close(200, "done").await.expect("close");
    }
}

#[tokio::test]
async fn the_key_is_the_message_id_property() {
    let Some(broker) = broker("key").await else {
        return;
    };
    broker.publish(Some("m-1"), b"with").await;
    broker.publish(None, b"without").await;
    broker.publish(Some(""), b"empty").await;

    let with = broker.get(broker.queues.work()).await.expect("first");
    assert_eq!(message_key(&with), Ok("m-1"));
    for _ in 0..2 {
        let without = broker.get(broker.queues.work()).await.expect("key-less");
        let missing = message_key(&without).expect_err("no usable message_id");
        assert!(missing.to_string().contains("message_id"), "{missing}");
        let reason = missing.to_string();
        broker
            .settle(&without, &Disposition::DeadLetter { reason })
            .await;
    }
    broker.settle(&with, &Disposition::Ack).await;

    let dead = broker
        .get(broker.queues.dead_letter())
        .await
        .expect("dead letter");
    assert_eq!(dead.data, b"without");
    broker.cleanup().await;
}

#[tokio::test]
async fn a_retry_comes_back_after_its_delay_counted() {
    let Some(broker) = broker("retry").await else {
        return;
    };
    broker.publish(Some("m-1"), b"payload").await;
    let first = broker.get(broker.queues.work()).await.expect("delivery");
    assert_eq!(retries(&first), 0);

    let delay = Duration::from_millis(600);
    let sent = Instant::now();
    let settled = broker.settle(&first, &retry(Some(delay))).await;
    // The next retry queue up from 600 ms holds messages for a second.
    assert_eq!(
        settled,
        Settled::Retried {
            retry: 1,
            after: Duration::from_secs(1)
        }
    );
    assert!(
        broker.get(broker.queues.work()).await.is_none(),
        "acked, not requeued"
    );

    let again = broker
        .next(broker.queues.work(), Duration::from_secs(10))
        .await
        .expect("back from the retry queue");
    assert!(
        sent.elapsed() >= delay,
        "came back after {:?}",
        sent.elapsed()
    );
    assert_eq!(message_key(&again), Ok("m-1"));
    assert_eq!(again.data, b"payload");
    assert_eq!(retries(&again), 1);
    broker.settle(&again, &Disposition::Ack).await;
    broker.cleanup().await;
}

/// RabbitMQ expires messages only at the head of a queue: with one retry queue for every
/// delay, a retry after 200 ms sent after one of 5 s came back after 5 s (15 s behind
/// 15 s in a service, 5 minutes behind an in-progress claim's lease). Each delay now
/// waits in a queue of its own, and comes back after at most a tenth and a second more.
#[tokio::test]
async fn a_short_retry_is_not_held_behind_a_long_one() {
    let Some(broker) = broker("retry_order").await else {
        return;
    };
    broker.publish(Some("long"), b"long").await;
    broker.publish(Some("short"), b"short").await;
    let long = broker.get(broker.queues.work()).await.expect("long");
    let short = broker.get(broker.queues.work()).await.expect("short");
    let (long_delay, short_delay) = (Duration::from_secs(5), Duration::from_millis(200));
    broker.settle(&long, &retry(Some(long_delay))).await;
    let sent = Instant::now();
    broker.settle(&short, &retry(Some(short_delay))).await;

    let back = broker
        .next(broker.queues.work(), Duration::from_secs(10))
        .await
        .expect("a retry comes back");
    let waited = sent.elapsed();
    assert_eq!(message_key(&back), Ok("short"), "after {waited:?}");
    assert!(
        waited <= short_delay + short_delay / 10 + Duration::from_secs(1),
        "the 200 ms retry came back after {waited:?}"
    );
    broker.settle(&back, &Disposition::Ack).await;
    let later = broker
        .next(broker.queues.work(), Duration::from_secs(10))
        .await
        .expect("the long retry comes back too");
    assert_eq!(message_key(&later), Ok("long"));
    broker.settle(&later, &Disposition::Ack).await;
    broker.cleanup().await;
}

#[tokio::test]
async fn a_dead_letter_keeps_the_message_and_its_reason() {
    let Some(broker) = broker("dead-letter").await else {
        return;
    };
    broker.publish(Some("m-1"), b"payload").await;
    let delivery = broker.get(broker.queues.work()).await.expect("delivery");
    let reason = "account 7 is closed".to_owned();
    broker
        .settle(
            &delivery,
            &Disposition::DeadLetter {
                reason: reason.clone(),
            },
        )
        .await;

    let dead = broker
        .get(broker.queues.dead_letter())
        .await
        .expect("dead letter");
    assert_eq!(message_key(&dead), Ok("m-1"));
    assert_eq!(dead.data, b"payload");
    let headers = dead.properties.headers().clone().expect("headers");
    assert_eq!(
        headers.inner().get(REASON_HEADER),
        Some(&AMQPValue::LongString(reason.as_str().into()))
    );
    assert!(broker.get(broker.queues.work()).await.is_none());
    broker.cleanup().await;
}

/// A message that came back from the dead-letter queue (a shovel, "move messages")
/// carries a dead-lettering history that names the work queue: copied onto a retry, it
/// made RabbitMQ take the copy's return from the retry queue for a dead-letter cycle and
/// drop it, after the delivery was acked. Nor do the copies carry the `CC` of their
/// original, which sent the queues named another copy.
#[tokio::test]
async fn copies_carry_neither_a_dead_lettering_history_nor_a_cc() {
    let Some(broker) = broker("history").await else {
        return;
    };
    let audit = format!("{}.audit", broker.queues.work());
    broker
        .channel
        .queue_declare(
            &audit,
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("declare the audit queue");
    let work = broker.queues.work();
    let mut death = FieldTable::default();
    death.insert("queue".into(), AMQPValue::LongString(work.into()));
    death.insert("reason".into(), AMQPValue::LongString("expired".into()));
    death.insert("count".into(), AMQPValue::LongLongInt(1));
    death.insert("exchange".into(), AMQPValue::LongString("".into()));
    let mut headers = FieldTable::default();
    headers.insert(
        "x-death".into(),
        AMQPValue::FieldArray(vec![AMQPValue::FieldTable(death)].into()),
    );
    headers.insert(
        "x-first-death-queue".into(),
        AMQPValue::LongString(work.into()),
    );
    headers.insert(
        "x-first-death-reason".into(),
        AMQPValue::LongString("expired".into()),
    );
    headers.insert(
        "CC".into(),
        AMQPValue::FieldArray(vec![AMQPValue::LongString(audit.as_str().into())].into()),
    );
    let properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id("m-1".into())
        .with_headers(headers);
    broker
        .channel
        .basic_publish(
            "",
            work,
            BasicPublishOptions::default(),
            b"payload",
            properties,
        )
        .await
        .expect("publish")
        .await
        .expect("publish confirmed");

    let first = broker.get(work).await.expect("delivery");
    let retried = broker.settle(&first, &retry(None)).await;
    assert!(
        matches!(retried, Settled::Retried { retry: 1, .. }),
        "{retried:?}"
    );
    let again = broker
        .next(work, Duration::from_secs(10))
        .await
        .expect("back from the retry queue, not dropped as a dead-letter cycle");
    assert_eq!(message_key(&again), Ok("m-1"));
    let reason = "refused".to_owned();
    broker
        .settle(&again, &Disposition::DeadLetter { reason })
        .await;
    let dead = broker
        .get(broker.queues.dead_letter())
        .await
        .expect("dead letter");
    let headers = dead.properties.headers().clone().expect("headers");
    assert!(!headers.inner().contains_key("CC"), "{headers:?}");
    // The original's one copy, none of the retry's or the dead letter's.
    let mut copies = 0;
    while broker.get(&audit).await.is_some() {
        copies += 1;
    }
    assert_eq!(copies, 1);
    broker
        .channel
        .queue_delete(&audit, Default::default())
        .await
        .expect("delete the audit queue");
    broker.cleanup().await;
}

#[tokio::test]
async fn retries_past_the_limit_are_dead_lettered() {
    let Some(mut broker) = broker("retry-limit").await else {
        return;
    };
    broker.queues = broker.queues.clone().with_max_retries(1);
    broker.publish(Some("m-1"), b"payload").await;
    let failing = retry(Some(Duration::from_millis(50)));

    let first = broker.get(broker.queues.work()).await.expect("delivery");
    assert!(matches!(
        broker.settle(&first, &failing).await,
        Settled::Retried { .. }
    ));
    let second = broker
        .next(broker.queues.work(), Duration::from_secs(10))
        .await
        .expect("retried");
    let settled = broker.settle(&second, &failing).await;
    assert!(
        matches!(settled, Settled::DeadLettered { .. }),
        "{settled:?}"
    );
    let dead = broker
        .get(broker.queues.dead_letter())
        .await
        .expect("dead letter");
    assert_eq!(message_key(&dead), Ok("m-1"));
    // The last failure's own words, for whoever reads the dead letter.
    let headers = dead.properties.headers().clone().expect("headers");
    assert_eq!(
        headers.inner().get(REASON_HEADER),
        Some(&AMQPValue::LongString(
            "still failing with a retryable error after 1 retries: the database was unreachable"
                .into()
        ))
    );
    broker.cleanup().await;
}

#[tokio::test]
async fn without_confirms_a_delivery_is_not_acked() {
    let Some(broker) = broker("no-confirms").await else {
        return;
    };
    broker.publish(Some("m-1"), b"payload").await;
    let plain = broker.connection.create_channel().await.expect("channel");
    let delivery = plain
        .basic_get(broker.queues.work(), BasicGetOptions::default())
        .await
        .expect("basic.get")
        .expect("delivery");
    let error = broker
        .queues
        .settle(
            &plain,
            &delivery,
            &Disposition::DeadLetter {
                reason: "no".into(),
            },
        )
        .await
        .expect_err("a dead letter needs a confirm-mode channel");
    assert!(matches!(error, SettleError::NotConfirmed { .. }), "{error}");
    plain.close(200, "done").await.expect("close");

    // Closing the channel returned the unacked delivery to the work queue.
    let again = broker
        .next(broker.queues.work(), Duration::from_secs(10))
        .await
        .expect("returned");
    assert!(again.redelivered);
    broker.settle(&again, &Disposition::Ack).await;
    broker.cleanup().await;
}

diesel::table! {
    accounts (id) {
        id -> BigInt,
        balance -> BigInt,
    }
}

#[idempotent(consumer = "rabbitmq-credit", key = message_id)]
async fn credit(
    conn: &mut diesel_async::AsyncPgConnection,
    message_id: &str,
    amount: i64,
) -> diesel::QueryResult<()> {
    use diesel::{ExpressionMethods, QueryDsl};
    diesel::update(accounts::table.find(1))
        .set(accounts::balance.eq(accounts::balance + amount))
        .execute(conn)
        .await?;
    Ok(())
}

/// Every message published twice, as a producer that lost its confirm does, is applied
/// once: the key read from the delivery reaches the inbox.
#[tokio::test]
async fn duplicates_published_twice_are_applied_once() {
    let Some(pg_url) = server_url("POSTGRES_URL") else {
        return;
    };
    let Some(broker) = broker("end-to-end").await else {
        return;
    };
    let db = TestDatabase::postgres(&pg_url, "rabbitmq_end_to_end")
        .await
        .expect("test schema");
    let mut conn = db.connect().await.expect("connect");
    diesel::sql_query("CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL)")
        .execute(&mut conn)
        .await
        .expect("accounts");
    diesel::sql_query("INSERT INTO accounts VALUES (1, 0)")
        .execute(&mut conn)
        .await
        .expect("account");

    for amount in 1..=20_i64 {
        let id = format!("m-{amount}");
        broker
            .publish(Some(&id), amount.to_string().as_bytes())
            .await;
        broker
            .publish(Some(&id), amount.to_string().as_bytes())
            .await;
    }
    let mut acked = 0;
    while let Some(delivery) = broker.get(broker.queues.work()).await {
        let key = message_key(&delivery).expect("key");
        let amount: i64 = std::str::from_utf8(&delivery.data)
            .unwrap()
            .parse()
            .unwrap();
        let disposition = Disposition::of(&credit(&mut conn, key, amount).await);
        assert_eq!(broker.settle(&delivery, &disposition).await, Settled::Acked);
        acked += 1;
    }
    assert_eq!(acked, 40);
    assert_eq!(
        select_i64(&mut conn, "SELECT balance FROM accounts")
            .await
            .unwrap(),
        (1..=20).sum::<i64>()
    );
    assert_eq!(
        select_i64(&mut conn, "SELECT COUNT(*) FROM inbox")
            .await
            .unwrap(),
        20
    );
    drop(conn);
    db.cleanup().await.expect("drop the schema");
    broker.cleanup().await;
}

/// A dead-letter queue at its `x-max-length` with `overflow = reject-publish` refuses the
/// copy: the settle fails and hands the delivery back, on the same live channel, so it
/// comes back at once rather than waiting unacked for the channel to close.
#[tokio::test]
async fn a_full_dead_letter_queue_loses_nothing() {
    let Some(url) = server_url("AMQP_URL") else {
        return;
    };
    let connection = diesel_inbox_lapin::connect(&url).await.expect("connect");
    let channel = confirming_channel(&connection).await;
    let queues = Queues::new(format!(
        "inbox-test.dead-letter-full.{}",
        std::process::id()
    ));
    queues.delete(&channel).await.expect("delete old queues");
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    channel
        .queue_declare(queues.work(), durable, arguments.clone())
        .await
        .expect("work queue");
    arguments.insert("x-max-length".into(), AMQPValue::LongLongInt(1));
    arguments.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    channel
        .queue_declare(queues.dead_letter(), durable, arguments)
        .await
        .expect("a dead-letter queue that holds one message");
    // Filled past its limit (a quorum queue takes one message more before it refuses).
    let publish = async |queue: &str, id: &str| {
        let properties = BasicProperties::default().with_message_id(id.into());
        channel
            .basic_publish("", queue, BasicPublishOptions::default(), b"x", properties)
            .await
            .expect("publish")
            .await
            .expect("answered")
    };
    for filler in ["filler-1", "filler-2"] {
        publish(queues.dead_letter(), filler).await;
    }
    publish(queues.work(), "m-1").await;

    let delivery = channel
        .basic_get(queues.work(), BasicGetOptions::default())
        .await
        .expect("basic.get")
        .expect("the message");
    let refuse = Disposition::DeadLetter {
        reason: "refused".to_owned(),
    };
    let refused = queues.settle(&channel, &delivery, &refuse).await;
    assert!(
        matches!(refused, Err(SettleError::NotConfirmed { .. })),
        "{refused:?}"
    );

    let back = channel
        .basic_get(queues.work(), BasicGetOptions::default())
        .await
        .expect("basic.get")
        .expect("back in the work queue, with the channel still open");
    assert_eq!(message_key(&back), Ok("m-1"));
    assert!(back.redelivered);
    channel
        .basic_ack(back.delivery_tag, BasicAckOptions::default())
        .await
        .expect("ack");
    queues.delete(&channel).await.expect("delete the queues");
    connection.close(200, "done").await.expect("close");
}

/// A channel that closes before the delivery is settled: the settle fails, and the
/// delivery comes back to the work queue, never lost.
#[tokio::test]
async fn a_channel_closed_before_the_settle_loses_nothing() {
    let Some(broker) = broker("channel_closed").await else {
        return;
    };
    broker.publish(Some("m-1"), b"payload").await;
    let channel = confirming_channel(&broker.connection).await;
    let delivery = channel
        .basic_get(broker.queues.work(), BasicGetOptions::default())
        .await
        .expect("basic.get")
        .expect("the message");
    channel.close(200, "gone").await.expect("close");
    for disposition in [
        Disposition::Ack,
        retry(None),
        Disposition::DeadLetter {
            reason: "refused".to_owned(),
        },
    ] {
        let settled = broker
            .queues
            .settle(&channel, &delivery, &disposition)
            .await;
        assert!(settled.is_err(), "{disposition:?}: {settled:?}");
    }
    let back = broker
        .next(broker.queues.work(), Duration::from_secs(10))
        .await
        .expect("back in the work queue");
    assert_eq!(message_key(&back), Ok("m-1"));
    broker.settle(&back, &Disposition::Ack).await;
    assert!(broker.get(broker.queues.dead_letter()).await.is_none());
    broker.cleanup().await;
}

/// Consumers on channels of their own retry with a delay whose retry queue does not exist
/// yet, all at once: each copy is stored, none refused while the queue is being created.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retries_racing_to_create_their_queue_are_all_stored() {
    let Some(broker) = broker("retry_race").await else {
        return;
    };
    const CONSUMERS: usize = 8;
    for n in 0..CONSUMERS {
        broker.publish(Some(&format!("m-{n}")), b"payload").await;
    }
    let mut channels = Vec::new();
    for _ in 0..CONSUMERS {
        let channel = confirming_channel(&broker.connection).await;
        let delivery = channel
            .basic_get(broker.queues.work(), BasicGetOptions::default())
            .await
            .expect("basic.get")
            .expect("a message");
        channels.push((channel, delivery));
    }
    let failing = retry(Some(Duration::from_millis(2_000)));
    let settles = channels
        .iter()
        .map(|(channel, delivery)| broker.queues.settle(channel, delivery, &failing));
    for settled in futures_util::future::join_all(settles).await {
        assert!(
            matches!(settled, Ok(Settled::Retried { .. })),
            "{settled:?}"
        );
    }
    broker.cleanup().await;
}
