//! `diesel_inbox_nats` against the local NATS JetStream: the key of a message, and each
//! disposition carried out on real streams. Each test creates streams of its own and
//! deletes them at the end.

use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::{self, Context, Message, stream};
use broker_test_support::server_url;
use diesel_inbox::{Disposition, InboxKey};
use diesel_inbox_nats::{
    CONSUMER_HEADER, MessageKey, ORIGINAL_ID_HEADER, REASON_HEADER, SEQUENCE_HEADER, STREAM_HEADER,
    Settled, Settlement, message_key,
};
use futures_util::StreamExt;

#[path = "nats/outbox.rs"]
mod outbox;

struct Broker {
    jetstream: Context,
    name: String,
    consumer: PullConsumer,
    dead_letters: PullConsumer,
    settlement: Settlement,
}

/// A work stream and a dead-letter stream named after the test, or `None` without
/// `NATS_URL`.
/// A retry, as `Disposition::of` makes one for a transient error.
fn retry(after: Option<Duration>) -> Disposition {
    Disposition::Retry {
        after,
        reason: String::from("the database was unreachable"),
    }
}

async fn broker(test: &str) -> Option<Broker> {
    let url = server_url("NATS_URL")?;
    let client = async_nats::connect(url).await.expect("connect to NATS");
    let jetstream = jetstream::new(client);
    let name = format!("inbox_test_{test}_{}", std::process::id());
    for stream in [name.clone(), format!("{name}_dead")] {
        // A run that panicked left its streams behind.
        let _ = jetstream.delete_stream(&stream).await;
    }
    let work = jetstream
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.work")],
            ..Default::default()
        })
        .await
        .expect("work stream");
    let dead = jetstream
        .create_stream(stream::Config {
            name: format!("{name}_dead"),
            subjects: vec![format!("{name}.dead")],
            ..Default::default()
        })
        .await
        .expect("dead-letter stream");
    let config = |durable: &str| pull::Config {
        durable_name: Some(durable.to_owned()),
        ack_policy: AckPolicy::Explicit,
        ack_wait: Duration::from_secs(30),
        ..Default::default()
    };
    let consumer = work
        .create_consumer(config("work"))
        .await
        .expect("consumer");
    let dead_letters = dead
        .create_consumer(config("dead"))
        .await
        .expect("consumer");
    Some(Broker {
        settlement: Settlement::new(format!("{name}.dead")),
        jetstream,
        name,
        consumer,
        dead_letters,
    })
}

impl Broker {
    async fn publish(&self, msg_id: Option<&str>, payload: &'static [u8]) {
        let mut headers = HeaderMap::new();
        if let Some(id) = msg_id {
            headers.insert(async_nats::header::NATS_MESSAGE_ID, id);
        }
        self.jetstream
            .publish_with_headers(format!("{}.work", self.name), headers, payload.into())
            .await
            .expect("publish")
            .await
            .expect("publish acknowledged");
    }

    async fn settle(&self, message: &Message, disposition: &Disposition) -> Settled {
        self.settlement
            .settle(message, disposition)
            .await
            .expect("settle")
    }

    async fn cleanup(self) {
        for stream in [self.name.clone(), format!("{}_dead", self.name)] {
            self.jetstream
                .delete_stream(&stream)
                .await
                .expect("delete stream");
        }
    }
}

/// The next message of `consumer`, waiting up to `within` for it.
async fn next(consumer: &PullConsumer, within: Duration) -> Option<Message> {
    let mut batch = consumer
        .fetch()
        .max_messages(1)
        .expires(within)
        .messages()
        .await
        .expect("fetch");
    batch.next().await.map(|message| message.expect("message"))
}

const SOON: Duration = Duration::from_secs(10);
const NOT_YET: Duration = Duration::from_millis(300);

#[tokio::test]
async fn the_key_is_the_msg_id_else_the_stream_sequence() {
    let Some(broker) = broker("key").await else {
        return;
    };
    broker.publish(Some("m-1"), b"with").await;
    broker.publish(None, b"without").await;

    let with = next(&broker.consumer, SOON).await.expect("first");
    assert_eq!(message_key(&with), Ok(MessageKey::MsgId("m-1")));
    assert_eq!(message_key(&with).unwrap().encode().unwrap(), "m-1");
    let without = next(&broker.consumer, SOON).await.expect("second");
    let key = message_key(&without).expect("the sequence");
    assert!(
        matches!(key, MessageKey::StreamSequence { stream, sequence: 2, .. } if stream == broker.name),
        "{key:?}"
    );
    let encoded = key.encode().unwrap();
    assert!(encoded.contains(&broker.name), "{encoded}");

    // A redelivery keeps the key.
    let mut key_before = None;
    broker.settle(&without, &retry(Some(Duration::ZERO))).await;
    if let Some(again) = next(&broker.consumer, SOON).await {
        key_before = Some(message_key(&again).unwrap().encode().unwrap());
        broker.settle(&again, &Disposition::Ack).await;
    }
    assert_eq!(key_before, Some(encoded));
    broker.settle(&with, &Disposition::Ack).await;
    broker.cleanup().await;
}

#[tokio::test]
async fn a_retry_is_redelivered_after_its_delay() {
    let Some(broker) = broker("retry").await else {
        return;
    };
    broker.publish(Some("m-1"), b"payload").await;
    let first = next(&broker.consumer, SOON).await.expect("delivery");

    let delay = Duration::from_millis(1500);
    let sent = Instant::now();
    let settled = broker.settle(&first, &retry(Some(delay))).await;
    assert_eq!(settled, Settled::Retried { after: delay });
    assert!(
        next(&broker.consumer, NOT_YET).await.is_none(),
        "held back for the delay"
    );

    let again = next(&broker.consumer, SOON).await.expect("redelivered");
    assert!(
        sent.elapsed() >= delay,
        "came back after {:?}",
        sent.elapsed()
    );
    assert_eq!(message_key(&again), Ok(MessageKey::MsgId("m-1")));
    assert_eq!(again.info().unwrap().delivered, 2);
    broker.settle(&again, &Disposition::Ack).await;
    broker.cleanup().await;
}

/// A retry after `Duration::MAX` waits a century, not a moment: JetStream takes the
/// delay in nanoseconds as an `i64`, and an overflowed one redelivered at once.
#[tokio::test]
async fn a_retry_after_forever_is_not_redelivered_at_once() {
    let Some(broker) = broker("retry_forever").await else {
        return;
    };
    broker.publish(Some("m-1"), b"payload").await;
    let first = next(&broker.consumer, SOON).await.expect("delivery");
    let forever = retry(Some(Duration::MAX));
    let settled = broker.settle(&first, &forever).await;
    assert!(matches!(settled, Settled::Retried { .. }), "{settled:?}");
    assert!(
        next(&broker.consumer, NOT_YET * 3).await.is_none(),
        "held back"
    );
    broker.cleanup().await;
}

#[tokio::test]
async fn a_dead_letter_is_stored_with_its_reason_and_terminated() {
    let Some(broker) = broker("dead_letter").await else {
        return;
    };
    broker.publish(None, b"payload").await;
    let delivery = next(&broker.consumer, SOON).await.expect("delivery");
    let reason = "account 7 is closed\nby its owner".to_owned();
    broker
        .settle(&delivery, &Disposition::DeadLetter { reason })
        .await;

    let dead = next(&broker.dead_letters, SOON).await.expect("dead letter");
    assert_eq!(&dead.payload[..], b"payload");
    let headers = dead.headers.clone().expect("headers");
    assert_eq!(
        headers.get(REASON_HEADER).map(|value| value.as_str()),
        Some("account 7 is closed by its owner")
    );
    assert_eq!(
        headers.get(SEQUENCE_HEADER).map(|value| value.as_str()),
        Some("1")
    );
    dead.ack().await.expect("ack");
    // Terminated: not redelivered, not even after the ack wait.
    assert!(next(&broker.consumer, NOT_YET).await.is_none());
    broker.cleanup().await;
}

/// A message without `Nats-Msg-Id` is keyed by its stream sequence and the time it was
/// stored: after its stream is deleted and created again, a new message at the same
/// sequence is another message, not a duplicate of the old stream's (which it was when
/// the key was the sequence alone).
#[tokio::test]
async fn a_stream_made_again_reuses_sequences_but_not_keys() {
    let Some(mut broker) = broker("made_again").await else {
        return;
    };
    broker.publish(None, b"first").await;
    let first = next(&broker.consumer, SOON).await.expect("first");
    let old = message_key(&first).expect("a key").encode().unwrap();
    first.ack().await.expect("ack");

    broker
        .jetstream
        .delete_stream(&broker.name)
        .await
        .expect("delete the stream");
    let work = broker
        .jetstream
        .create_stream(stream::Config {
            name: broker.name.clone(),
            subjects: vec![format!("{}.work", broker.name)],
            ..Default::default()
        })
        .await
        .expect("the stream again");
    broker.consumer = work
        .create_consumer(pull::Config {
            durable_name: Some("work".to_owned()),
            ack_policy: AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .expect("its consumer again");
    broker.publish(None, b"second").await;
    let second = next(&broker.consumer, SOON).await.expect("second");
    let key = message_key(&second).expect("a key");
    assert!(
        matches!(key, MessageKey::StreamSequence { sequence: 1, .. }),
        "{key:?}"
    );
    assert_ne!(key.encode().unwrap(), old);
    second.ack().await.expect("ack");
    broker.cleanup().await;
}

/// A message published with JetStream's publish-control headers is dead-lettered without
/// them: `Nats-Expected-Stream` names the work stream, and the dead-letter stream refused
/// every copy that carried it, so the message could never be dead-lettered. A dead letter
/// dead-lettered again (by a consumer of the dead letters, to a stream of its own) keeps
/// its original's key.
#[tokio::test]
async fn dead_letters_leave_out_publish_controls_and_keep_their_key() {
    let Some(broker) = broker("dead_letter_controls").await else {
        return;
    };
    let mut headers = HeaderMap::new();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, "m-1");
    headers.insert("Nats-Expected-Stream", broker.name.as_str());
    broker
        .jetstream
        .publish_with_headers(format!("{}.work", broker.name), headers, "payload".into())
        .await
        .expect("publish")
        .await
        .expect("publish acknowledged");
    let delivery = next(&broker.consumer, SOON).await.expect("delivery");
    let refused = Disposition::DeadLetter {
        reason: "refused".to_owned(),
    };
    broker.settle(&delivery, &refused).await;
    let dead = next(&broker.dead_letters, SOON).await.expect("dead letter");
    let headers = dead.headers.clone().expect("headers");
    assert!(headers.get("Nats-Expected-Stream").is_none());
    assert_eq!(
        message_key(&dead).map(|key| key.to_string()),
        Ok("m-1".to_owned())
    );

    // Dead-lettered again, from the dead letters to a stream of their own.
    let again = format!("{}_again", broker.name);
    let _ = broker.jetstream.delete_stream(&again).await;
    let stream = broker
        .jetstream
        .create_stream(stream::Config {
            name: again.clone(),
            subjects: vec![format!("{again}.in")],
            ..Default::default()
        })
        .await
        .expect("stream");
    Settlement::new(format!("{again}.in"))
        .settle(&dead, &refused)
        .await
        .expect("settle the dead letter");
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("again".to_owned()),
            ack_policy: AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .expect("consumer");
    let twice = next(&consumer, SOON)
        .await
        .expect("dead letter of a dead letter");
    assert_eq!(
        message_key(&twice).map(|key| key.to_string()),
        Ok("m-1".to_owned())
    );
    broker
        .jetstream
        .delete_stream(&again)
        .await
        .expect("delete stream");
    broker.cleanup().await;
}

#[tokio::test]
async fn retries_past_the_delivery_limit_are_dead_lettered() {
    let Some(mut broker) = broker("retry_limit").await else {
        return;
    };
    broker.settlement = broker.settlement.clone().with_max_deliveries(2);
    broker.publish(Some("m-1"), b"payload").await;
    let failing = retry(Some(Duration::from_millis(50)));

    let first = next(&broker.consumer, SOON).await.expect("delivery");
    assert!(matches!(
        broker.settle(&first, &failing).await,
        Settled::Retried { .. }
    ));
    let second = next(&broker.consumer, SOON).await.expect("redelivered");
    let settled = broker.settle(&second, &failing).await;
    assert!(
        matches!(settled, Settled::DeadLettered { .. }),
        "{settled:?}"
    );
    let dead = next(&broker.dead_letters, SOON).await.expect("dead letter");
    assert_eq!(message_key(&dead), Ok(MessageKey::MsgId("m-1")));
    // The last failure's own words, for whoever reads the dead letter.
    let headers = dead.headers.clone().expect("headers");
    assert_eq!(
        headers.get(REASON_HEADER).map(|value| value.as_str()),
        Some(
            "still failing with a retryable error after 2 deliveries: the database was unreachable"
        )
    );
    dead.ack().await.expect("ack");
    broker.cleanup().await;
}

#[tokio::test]
async fn a_dead_letter_without_a_stream_to_hold_it_is_not_terminated() {
    let Some(mut broker) = broker("no_dead_letter_stream").await else {
        return;
    };
    broker.settlement = Settlement::new(format!("{}.nowhere", broker.name));
    broker.publish(Some("m-1"), b"payload").await;
    let delivery = next(&broker.consumer, SOON).await.expect("delivery");
    let error = broker
        .settlement
        .settle(
            &delivery,
            &Disposition::DeadLetter {
                reason: "no".into(),
            },
        )
        .await;
    assert!(error.is_err(), "published to a subject no stream captures");
    // Still unsettled: a nak (or the ack wait) brings it back.
    delivery
        .ack_with(async_nats::jetstream::AckKind::Nak(None))
        .await
        .expect("nak");
    let again = next(&broker.consumer, SOON).await.expect("kept");
    broker.settle(&again, &Disposition::Ack).await;
    broker.cleanup().await;
}

/// A producer's `Nats-Msg-Id` is unique only within its stream, and every consumer of a
/// stream sees each message. Two streams holding a message with the same producer id,
/// one of them read by two consumers, each dead-letter it into one dead-letter stream
/// with the default duplicate window: all three copies are stored, each under the
/// producer's id in `Inbox-Original-Msg-Id`. The copies reused that id, so the stream
/// kept the first and acknowledged the others as duplicates, which were taken as
/// stored: their originals were terminated, and two dead letters were lost.
#[tokio::test]
async fn every_dead_letter_arrives_whatever_its_producer_id() {
    let Some(url) = server_url("NATS_URL") else {
        return;
    };
    let client = async_nats::connect(url).await.expect("connect to NATS");
    let jetstream = jetstream::new(client);
    let name = format!("inbox_test_shared_dead_{}", std::process::id());
    let streams = [
        format!("{name}_a"),
        format!("{name}_b"),
        format!("{name}_dead"),
    ];
    for stream in &streams {
        let _ = jetstream.delete_stream(stream).await;
        jetstream
            .create_stream(stream::Config {
                name: stream.clone(),
                subjects: vec![format!("{stream}.in")],
                ..Default::default()
            })
            .await
            .expect("stream");
    }
    let consumer = async |stream: &str, durable: &str| {
        jetstream
            .get_stream(stream)
            .await
            .expect("stream")
            .create_consumer(pull::Config {
                durable_name: Some(durable.to_owned()),
                ack_policy: AckPolicy::Explicit,
                ..Default::default()
            })
            .await
            .expect("consumer")
    };
    let consumers = [
        consumer(&streams[0], "first").await,
        consumer(&streams[0], "second").await,
        consumer(&streams[1], "first").await,
    ];
    for stream in &streams[..2] {
        let mut headers = HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, "order-42");
        jetstream
            .publish_with_headers(format!("{stream}.in"), headers, "order 42".into())
            .await
            .expect("publish")
            .await
            .expect("publish acknowledged");
    }
    let settlement = Settlement::new(format!("{}.in", streams[2]));
    let refused = Disposition::DeadLetter {
        reason: "refused".to_owned(),
    };
    for consumer in &consumers {
        let delivery = next(consumer, SOON).await.expect("delivery");
        let settled = settlement
            .settle(&delivery, &refused)
            .await
            .expect("settle");
        assert!(matches!(settled, Settled::DeadLettered { .. }));
    }

    let dead_letters = consumer(&streams[2], "dead").await;
    let mut copies = Vec::new();
    while let Some(dead) = next(&dead_letters, NOT_YET * 3).await {
        let headers = dead.headers.clone().expect("headers");
        let header = |name: &str| headers.get(name).map(|value| value.as_str().to_owned());
        assert_eq!(header(ORIGINAL_ID_HEADER).as_deref(), Some("order-42"));
        copies.push((header(STREAM_HEADER), header(CONSUMER_HEADER)));
        dead.ack().await.expect("ack");
    }
    copies.sort();
    let copy = |stream: &str, consumer: &str| (Some(stream.to_owned()), Some(consumer.to_owned()));
    assert_eq!(
        copies,
        [
            copy(&streams[0], "first"),
            copy(&streams[0], "second"),
            copy(&streams[1], "first"),
        ]
    );
    for stream in &streams {
        jetstream
            .delete_stream(stream)
            .await
            .expect("delete stream");
    }
}

/// A handler that runs three times the consumer's `ack_wait` is not redelivered while it
/// runs when its call is wrapped in `Settlement::in_progress`, which tells JetStream the
/// message is still being worked on; unwrapped, the same wait lets JetStream hand the
/// message to another consumer at once.
#[tokio::test]
async fn a_long_handler_is_not_redelivered_while_it_runs() {
    let Some(broker) = broker("in_progress").await else {
        return;
    };
    let ack_wait = Duration::from_secs(1);
    let consumer = broker
        .jetstream
        .get_stream(&broker.name)
        .await
        .expect("stream")
        .create_consumer(pull::Config {
            durable_name: Some("slow".to_owned()),
            ack_policy: AckPolicy::Explicit,
            ack_wait,
            ..Default::default()
        })
        .await
        .expect("consumer");
    let settlement = broker.settlement.clone().with_ack_wait(ack_wait);
    let handler = || tokio::time::sleep(3 * ack_wait);

    for (id, kept) in [("unwrapped", false), ("in-progress", true)] {
        broker.publish(Some(id), b"slow").await;
        let delivery = next(&consumer, SOON).await.expect("delivery");
        assert_eq!(message_key(&delivery), Ok(MessageKey::MsgId(id)));
        let running = async {
            if kept {
                settlement.in_progress(&delivery, handler()).await;
            } else {
                handler().await;
            }
        };
        let (redelivered, ()) = tokio::join!(next(&consumer, 3 * ack_wait), running);
        assert_eq!(redelivered.is_some(), !kept, "{id}");
        delivery.ack().await.expect("ack");
        if let Some(redelivered) = redelivered {
            redelivered.ack().await.expect("ack");
        }
    }
    broker.cleanup().await;
}
