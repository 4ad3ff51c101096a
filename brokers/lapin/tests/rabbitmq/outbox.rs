//! The outbox relayed to the local RabbitMQ: committed messages are published once
//! confirmed, rolled-back ones never; unpublishable ones are parked with their reason
//! while the rest go out; and a broker that cannot be reached holds nothing back for
//! good: the outbox grows, and drains once the broker is back.

use std::collections::HashMap;
use std::time::Duration;

use broker_test_support::{
    Proxy, announce_each, eager, outbox_database, parked_once, unsent, wait_until_sent,
};
use diesel_inbox::Disposition;
use diesel_inbox::outbox::{self, OutboxMessage, Relay};
use diesel_inbox::testing::select_i64;
use diesel_inbox_lapin::{OutboxPublisher, message_key};

use super::{Broker, broker};

/// A message to the work queue, through the default exchange.
fn to_queue(broker: &Broker, n: usize) -> OutboxMessage {
    OutboxMessage::new("", n.to_string())
        .routing_key(broker.queues.work())
        .header("n", n.to_string())
}

/// Reads the work queue until `expected` distinct ids arrived, or fails after 30 s;
/// returns how many times each id arrived.
async fn receive(broker: &Broker, expected: usize) -> HashMap<String, usize> {
    let mut received: HashMap<String, usize> = HashMap::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        while received.len() < expected {
            match broker.get(broker.queues.work()).await {
                Some(delivery) => {
                    let key = message_key(&delivery).expect("every message has its id");
                    *received.entry(key.to_owned()).or_default() += 1;
                    broker.settle(&delivery, &Disposition::Ack).await;
                }
                None => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} of {expected} messages arrived", received.len()));
    received
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_publishes_what_committed_and_nothing_else() {
    let Some(db) = outbox_database("lapin_outbox_commits").await else {
        return;
    };
    let Some(broker) = broker("outbox-commits").await else {
        return;
    };
    let mut conn = db.connect().await.expect("connect");
    let mut committed = announce_each(&mut conn, 40, |n| to_queue(&broker, n)).await;
    let relay = Relay::spawn(
        db.clone(),
        OutboxPublisher::new(broker.url.clone()),
        eager(),
    );
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
        broker.get(broker.queues.work()).await.is_none(),
        "nothing else arrived"
    );
    assert_eq!(unsent(&mut conn).await, 0);
    broker.cleanup().await;
    drop(conn);
    db.cleanup().await.expect("cleanup");
}

/// A message to an exchange that does not exist closes the relay's channel, and one
/// that no queue is bound for comes back unroutable: both are parked with their reason.
/// The messages published beside them go out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpublishable_messages_are_parked_and_the_rest_go_out() {
    let Some(db) = outbox_database("lapin_outbox_parks").await else {
        return;
    };
    let Some(broker) = broker("outbox-parks").await else {
        return;
    };
    let mut conn = db.connect().await.expect("connect");
    let missing = format!("inbox-test.no-such-exchange.{}", std::process::id());
    let mut good = Vec::new();
    for n in 0..20 {
        let message = match n {
            5 => OutboxMessage::new(missing.as_str(), "lost?"),
            12 => OutboxMessage::new("amq.direct", "unroutable").routing_key("nobody-listens"),
            // Larger than the publisher is told the broker takes.
            17 => OutboxMessage::new("", vec![0; 2_048]).routing_key(broker.queues.work()),
            _ => to_queue(&broker, n),
        };
        let id = outbox::enqueue(&mut conn, message).await.expect("enqueue");
        if ![5, 12, 17].contains(&n) {
            good.push(id);
        }
    }
    let relay = Relay::spawn(
        db.clone(),
        OutboxPublisher::new(broker.url.clone()).with_max_message_size(1_024),
        eager(),
    );
    let received = receive(&broker, good.len()).await;
    let parked = parked_once(&mut conn, 3).await;
    relay.shut_down().await;

    assert_eq!(received.len(), good.len());
    let reasons: Vec<&str> = parked
        .iter()
        .filter_map(|message| message.last_error())
        .collect();
    assert!(
        reasons[0].contains("NOT_FOUND") || reasons[0].contains("no exchange"),
        "{reasons:?}"
    );
    assert!(reasons[1].contains("unroutable"), "{reasons:?}");
    assert!(reasons[2].contains("larger"), "{reasons:?}");
    assert_eq!(parked[0].destination(), missing);
    assert_eq!(unsent(&mut conn).await, 3, "parked, never dropped");
    broker.cleanup().await;
    drop(conn);
    db.cleanup().await.expect("cleanup");
}

/// The broker cannot be reached for a while: the relay retries, the outbox keeps what
/// committed meanwhile, and everything goes out once the broker is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_holds_messages_until_it_returns() {
    let Some(db) = outbox_database("lapin_outbox_outage").await else {
        return;
    };
    let Some(broker) = broker("outbox-outage").await else {
        return;
    };
    // amqp://user:password@host:port/vhost
    let authority = broker.url.rsplit('@').next().expect("a URL");
    let address = authority.split('/').next().expect("host:port");
    let upstream = tokio::net::lookup_host(address)
        .await
        .expect("resolve RabbitMQ")
        .next()
        .expect("an address");
    let proxy = Proxy::start(upstream).await;
    let publisher = OutboxPublisher::new(proxy.url(&broker.url));
    let relay = Relay::spawn(db.clone(), publisher, eager());
    let mut conn = db.connect().await.expect("connect");
    for n in 0..10 {
        outbox::enqueue(&mut conn, to_queue(&broker, n))
            .await
            .expect("enqueue");
    }
    let before = receive(&broker, 10).await;
    // A confirm still on its way when the connection is cut would make its message
    // unsent, and published again: cut once the first ten are marked.
    wait_until_sent(&mut conn).await;

    proxy.cut();
    for n in 10..40 {
        outbox::enqueue(&mut conn, to_queue(&broker, n))
            .await
            .expect("enqueue");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        unsent(&mut conn).await,
        30,
        "the outbox holds what the broker could not take"
    );
    let retried = select_i64(
        &mut conn,
        "SELECT CAST(COALESCE(MAX(attempts), 0) AS BIGINT) FROM inbox_outbox",
    )
    .await
    .expect("attempts");
    assert!(retried >= 2, "the relay kept trying: {retried} attempts");

    proxy.restore();
    let after = receive(&broker, 30).await;
    relay.shut_down().await;
    assert!(before.keys().all(|id| !after.contains_key(id)));
    assert_eq!(unsent(&mut conn).await, 0, "drained");
    broker.cleanup().await;
    drop(conn);
    db.cleanup().await.expect("cleanup");
}
