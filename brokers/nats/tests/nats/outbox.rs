//! The outbox relayed to the local JetStream: committed messages are published with
//! their id as `Nats-Msg-Id`, a copy published again after a relay's crash is dropped
//! by the stream, and messages no stream takes are parked.

use std::collections::HashMap;
use std::time::Duration;

use broker_test_support::{
    announce_each, eager, outbox_database, parked_once, unsent, wait_until_sent,
};
use diesel_inbox::outbox::{self, OutboxMessage, Publisher as _, Relay};
use diesel_inbox::testing::select_i64;
use diesel_inbox_nats::{MessageKey, OutboxPublisher, message_key};

use super::{Broker, NOT_YET, broker, next};

/// A message to the broker's work subject.
fn to_work(broker: &Broker, n: usize) -> OutboxMessage {
    OutboxMessage::new(broker.name.as_str(), n.to_string())
        .routing_key("work")
        .header("Inbox-Test-N", n.to_string())
}

/// Reads the work stream until `expected` distinct ids arrived; how many times each did.
async fn receive(broker: &Broker, expected: usize) -> HashMap<String, usize> {
    let mut received: HashMap<String, usize> = HashMap::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        while received.len() < expected {
            if let Some(message) = next(&broker.consumer, Duration::from_millis(200)).await {
                let MessageKey::MsgId(id) = message_key(&message).expect("a key") else {
                    panic!("published without a Nats-Msg-Id");
                };
                *received.entry(id.to_owned()).or_default() += 1;
                message.ack().await.expect("ack");
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} of {expected} messages arrived", received.len()));
    received
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_publishes_what_committed_with_its_id() {
    let Some(db) = outbox_database("nats_outbox_commits").await else {
        return;
    };
    let Some(broker) = broker("outbox_commits").await else {
        return;
    };
    let mut conn = db.connect().await.expect("connect");
    let mut committed = announce_each(&mut conn, 40, |n| to_work(&broker, n)).await;
    let publisher = OutboxPublisher::new(broker.jetstream.clone());
    let relay = Relay::spawn(db.clone(), publisher, eager());
    let received = receive(&broker, committed.len()).await;
    relay.shut_down().await;

    let mut ids: Vec<&String> = received.keys().collect();
    ids.sort();
    committed.sort();
    assert_eq!(
        ids,
        committed.iter().collect::<Vec<_>>(),
        "exactly the committed messages"
    );
    assert!(received.values().all(|&times| times == 1), "{received:?}");
    assert!(
        next(&broker.consumer, NOT_YET).await.is_none(),
        "nothing else arrived"
    );
    assert_eq!(unsent(&mut conn).await, 0);
    drop(conn);
    broker.cleanup().await;
    db.cleanup().await.expect("cleanup");
}

/// A relay publishes a message and dies before marking it; once its lease ends another
/// relay publishes it again, and the stream keeps one copy, by `Nats-Msg-Id`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_published_again_after_a_crash_is_dropped_by_the_stream() {
    let Some(db) = outbox_database("nats_outbox_crash").await else {
        return;
    };
    let Some(broker) = broker("outbox_crash").await else {
        return;
    };
    let mut conn = db.connect().await.expect("connect");
    outbox::enqueue(&mut conn, to_work(&broker, 1))
        .await
        .expect("enqueue");
    let publisher = OutboxPublisher::new(broker.jetstream.clone());
    let taken = outbox::take(&mut conn, Duration::from_millis(300), 1)
        .await
        .expect("take")
        .pop()
        .expect("due");
    publisher.publish(taken.message()).await.expect("published");
    drop(taken); // the relay dies here, before marking it sent

    tokio::time::sleep(Duration::from_millis(400)).await;
    let relay = Relay::spawn(db.clone(), publisher, eager());
    wait_until_sent(&mut conn).await;
    relay.shut_down().await;

    let attempts = select_i64(
        &mut conn,
        "SELECT CAST(attempts AS BIGINT) FROM inbox_outbox",
    )
    .await
    .expect("attempts");
    assert_eq!(attempts, 2, "published twice");
    let mut stream = broker
        .jetstream
        .get_stream(&broker.name)
        .await
        .expect("stream");
    assert_eq!(
        stream.info().await.expect("info").state.messages,
        1,
        "stored once"
    );
    drop(conn);
    broker.cleanup().await;
    db.cleanup().await.expect("cleanup");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_no_stream_takes_are_parked_and_the_rest_go_out() {
    let Some(db) = outbox_database("nats_outbox_parks").await else {
        return;
    };
    let Some(broker) = broker("outbox_parks").await else {
        return;
    };
    let mut conn = db.connect().await.expect("connect");
    let nowhere = format!("inbox_test_nowhere_{}", std::process::id());
    // One byte more than the server takes in a message.
    let max_payload = broker.jetstream.client().server_info().max_payload;
    let mut good = 0;
    for n in 0..12 {
        let message = match n {
            3 => OutboxMessage::new(nowhere.as_str(), "lost?"),
            7 => OutboxMessage::new(broker.name.as_str(), "wild").routing_key("*"),
            10 => OutboxMessage::new(broker.name.as_str(), vec![0; max_payload + 1])
                .routing_key("work"),
            _ => {
                good += 1;
                to_work(&broker, n)
            }
        };
        outbox::enqueue(&mut conn, message).await.expect("enqueue");
    }
    let publisher = OutboxPublisher::new(broker.jetstream.clone());
    let relay = Relay::spawn(db.clone(), publisher, eager());
    let received = receive(&broker, good).await;
    let parked = parked_once(&mut conn, 3).await;
    relay.shut_down().await;

    assert_eq!(received.len(), good);
    assert_eq!(parked[0].destination(), nowhere);
    assert!(
        parked[0]
            .last_error()
            .is_some_and(|error| error.contains("no stream")),
        "{parked:?}"
    );
    assert!(
        parked[1]
            .last_error()
            .is_some_and(|error| error.contains("not a subject")),
        "{parked:?}"
    );
    assert!(
        parked[2]
            .last_error()
            .is_some_and(|error| error.contains("max_payload")),
        "{:?}",
        parked[2].last_error()
    );
    drop(conn);
    broker.cleanup().await;
    db.cleanup().await.expect("cleanup");
}
