//! `diesel_inbox_kafka` against a local Kafka broker (`KAFKA_URL`, `host:port`) with the
//! outbox on the local PostgreSQL: committed messages are produced with their id, one
//! key's records land in one partition in commit order, a copy produced again after a
//! relay's crash is absorbed by the receiver's inbox, records the cluster never takes
//! are parked, a broker out of reach holds messages back until it returns (on a
//! broker of that test's own), and a record without an id in a topic made again is a
//! new message. Each test creates topics of its own and deletes them at
//! the end.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use broker_test_support::{
    Proxy, announce_each, eager, outbox_database, parked_once, server_url, unsent, wait_until_sent,
};
use diesel::result::Error;
use diesel_async::AsyncPgConnection;
use diesel_inbox::outbox::{self, OutboxMessage, Publisher as _, Relay};
use diesel_inbox::testing::{TestDatabase, select_i64};
use diesel_inbox::{Outcome, idempotent};
use diesel_inbox_kafka::{ID_HEADER, OutboxPublisher, RecordKey, message_key};
use rskafka::client::partition::{Compression, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::{Record, RecordAndOffset};

const PARTITIONS: i32 = 3;

/// A topic of `PARTITIONS` partitions named after the test, and the outbox's database.
struct Fixture {
    client: Arc<Client>,
    topic: String,
    db: TestDatabase<AsyncPgConnection>,
}

async fn fixture(test: &str) -> Option<Fixture> {
    let kafka = server_url("KAFKA_URL")?;
    fixture_at(kafka, test).await
}

/// [`fixture`] on the broker at `kafka`.
async fn fixture_at(kafka: String, test: &str) -> Option<Fixture> {
    let db = outbox_database(&format!("kafka_outbox_{test}")).await?;
    // rskafka retries a broker that does not answer for ever: a test would hang to its
    // time-out instead of saying what is missing.
    let client = tokio::time::timeout(
        Duration::from_secs(10),
        ClientBuilder::new(vec![kafka.clone()]).build(),
    )
    .await
    .unwrap_or_else(|_| {
        panic!("no Kafka broker answers at {kafka} (KAFKA_URL): `scripts/kafka.sh start` runs one")
    })
    .expect("connect to Kafka");
    let topic = format!("inbox_test_{test}_{}", std::process::id());
    let controller = client.controller_client().expect("controller");
    // A run that panicked left its topic behind.
    let _ = controller.delete_topic(&topic, 5_000).await;
    controller
        .create_topic(&topic, PARTITIONS, 1, 5_000)
        .await
        .expect("create the topic");
    Some(Fixture {
        client: Arc::new(client),
        topic,
        db,
    })
}

impl Fixture {
    fn publisher(&self) -> OutboxPublisher {
        OutboxPublisher::new(Arc::clone(&self.client))
    }

    async fn partition(&self, partition: i32) -> PartitionClient {
        self.client
            .partition_client(&self.topic, partition, UnknownTopicHandling::Retry)
            .await
            .expect("partition client")
    }

    /// Every record of the topic, by partition in offset order, once `expected` are there.
    async fn records(&self, expected: usize) -> BTreeMap<i32, Vec<RecordAndOffset>> {
        let mut read: BTreeMap<i32, Vec<RecordAndOffset>> = BTreeMap::new();
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                for partition in 0..PARTITIONS {
                    let client = self.partition(partition).await;
                    let records = read.entry(partition).or_default();
                    let next = records.last().map_or(0, |record| record.offset + 1);
                    let (fetched, _) = client
                        .fetch_records(next, 1..1_000_000, 100)
                        .await
                        .expect("fetch");
                    records.extend(fetched);
                }
                if read.values().map(Vec::len).sum::<usize>() >= expected {
                    return;
                }
            }
        })
        .await
        .unwrap_or_else(|_| {
            let got: usize = read.values().map(Vec::len).sum();
            panic!("{got} of {expected} records arrived")
        });
        read
    }

    async fn cleanup(self) {
        self.client
            .controller_client()
            .expect("controller")
            .delete_topic(&self.topic, 5_000)
            .await
            .expect("delete the topic");
        self.db.cleanup().await.expect("cleanup");
    }
}

/// The receiving service: records each record it processes.
#[idempotent(consumer = "kafka-receiver", key = key)]
async fn receive(conn: &mut AsyncPgConnection, key: RecordKey<'_>) -> Result<(), Error> {
    let _ = (conn, key);
    Ok(())
}

/// The id a record carries, read as a receiver reads its key.
fn id_of<'r>(topic: &'r str, partition: i32, record: &'r RecordAndOffset) -> &'r str {
    match message_key(ID_HEADER, topic, partition, record).expect("a key") {
        RecordKey::Header(id) => id,
        other => panic!("produced without an id: {other:?}"),
    }
}

/// One ordering key's records land in one partition, in commit order, whatever their
/// routing keys (the record keys), as the outbox guide's credits and debits of an
/// account: placed by the routing key, an account's credits and debits went to two
/// partitions, where a consumer could apply a debit before the credit ahead of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_produces_what_committed_one_ordering_keys_records_in_one_partition_in_order() {
    let Some(fixture) = fixture("commits").await else {
        return;
    };
    let mut conn = fixture.db.connect().await.expect("connect");
    let mut committed = announce_each(&mut conn, 40, |n| {
        let account = format!("account-{}", n % 5);
        let event = ["account.credited", "account.debited"][usize::from(n % 2 == 1)];
        OutboxMessage::new(fixture.topic.as_str(), n.to_string())
            .routing_key(event)
            .ordering_key(account.as_str())
            .header("account", account)
            .header("n", n.to_string())
    })
    .await;
    let relay = Relay::spawn(fixture.db.clone(), fixture.publisher(), eager());
    let records = fixture.records(committed.len()).await;
    relay.shut_down().await;

    let mut ids = Vec::new();
    let mut partition_of_key: HashMap<Vec<u8>, i32> = HashMap::new();
    for (&partition, records) in &records {
        let mut last_n: HashMap<Vec<u8>, u32> = HashMap::new();
        for record in records {
            ids.push(id_of(&fixture.topic, partition, record).to_owned());
            let event = record
                .record
                .key
                .as_deref()
                .expect("keyed by the routing key");
            assert!(event.starts_with(b"account."), "{event:?}");
            let key = record.record.headers["account"].clone();
            let n: u32 = std::str::from_utf8(&record.record.headers["n"])
                .expect("utf-8")
                .parse()
                .expect("a number");
            assert_eq!(
                record.record.value.as_deref(),
                Some(n.to_string().as_bytes())
            );
            let placed = *partition_of_key.entry(key.clone()).or_insert(partition);
            assert_eq!(placed, partition, "one key, one partition");
            if let Some(previous) = last_n.insert(key, n) {
                assert!(
                    previous < n,
                    "commit order within a key: {previous} then {n}"
                );
            }
        }
    }
    ids.sort();
    committed.sort();
    assert_eq!(ids, committed, "exactly the committed messages, each once");
    assert!(
        records
            .values()
            .filter(|records| !records.is_empty())
            .count()
            > 1,
        "the keys spread over the partitions"
    );
    assert_eq!(unsent(&mut conn).await, 0);
    drop(conn);
    fixture.cleanup().await;
}

/// A record without an id header is keyed by its place and time: after its topic is
/// deleted and created again, a new record at the same offset is another message, not
/// a duplicate of the old topic's (which it was when the key was the place alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_made_again_reuses_offsets_but_not_keys() {
    let Some(fixture) = fixture("made_again").await else {
        return;
    };
    let mut conn = fixture.db.connect().await.expect("connect");
    let mut outcomes = Vec::new();
    for generation in 0..2 {
        if generation > 0 {
            let controller = fixture.client.controller_client().expect("controller");
            controller
                .delete_topic(&fixture.topic, 5_000)
                .await
                .expect("delete the topic");
            controller
                .create_topic(&fixture.topic, PARTITIONS, 1, 5_000)
                .await
                .expect("create it again");
        }
        let record = Record {
            key: None,
            value: Some(format!("generation {generation}").into_bytes()),
            headers: BTreeMap::new(),
            timestamp: now(),
        };
        fixture
            .partition(0)
            .await
            .produce(vec![record], Compression::NoCompression)
            .await
            .expect("produce");
        let records = fixture.records(1).await;
        let read = &records[&0][0];
        assert_eq!(read.offset, 0, "a topic of its own starts at offset 0");
        let key = message_key(ID_HEADER, &fixture.topic, 0, read).expect("a key");
        assert!(matches!(key, RecordKey::Position { .. }), "{key:?}");
        outcomes.push(receive(&mut conn, key).await.expect("receive"));
        // Records of a millisecond apart, at least.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(outcomes, [Outcome::Processed(()), Outcome::Processed(())]);
    drop(conn);
    fixture.cleanup().await;
}

/// The time now, as a record's timestamp.
fn now() -> rskafka::chrono::DateTime<rskafka::chrono::Utc> {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    let millis = i64::try_from(since_epoch.as_millis()).expect("before 292 million years");
    rskafka::chrono::DateTime::from_timestamp_millis(millis).expect("a timestamp")
}

/// A relay produces a record and dies before marking it; once its lease ends another
/// relay produces it again, and the receiver's inbox processes the two copies once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_produced_again_after_a_crash_is_absorbed_by_the_receivers_inbox() {
    let Some(fixture) = fixture("crash").await else {
        return;
    };
    let mut conn = fixture.db.connect().await.expect("connect");
    outbox::enqueue(
        &mut conn,
        OutboxMessage::new(fixture.topic.as_str(), "credited"),
    )
    .await
    .expect("enqueue");
    let publisher = fixture.publisher();
    let taken = outbox::take(&mut conn, Duration::from_millis(300), 1)
        .await
        .expect("take")
        .pop()
        .expect("due");
    publisher.publish(taken.message()).await.expect("produced");
    drop(taken); // the relay dies here, before marking it sent

    tokio::time::sleep(Duration::from_millis(400)).await;
    let relay = Relay::spawn(fixture.db.clone(), publisher, eager());
    let records = fixture.records(2).await;
    relay.shut_down().await;

    let (&partition, copies) = records
        .iter()
        .find(|(_, records)| !records.is_empty())
        .expect("the copies");
    assert_eq!(copies.len(), 2, "both copies in one partition: {records:?}");
    let mut outcomes = Vec::new();
    for record in copies {
        let key = message_key(ID_HEADER, &fixture.topic, partition, record).expect("a key");
        outcomes.push(receive(&mut conn, key).await.expect("receive"));
    }
    assert_eq!(outcomes, [Outcome::Processed(()), Outcome::Duplicate]);
    drop(conn);
    fixture.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_the_cluster_never_takes_are_parked_and_the_rest_go_out() {
    let Some(fixture) = fixture("parks").await else {
        return;
    };
    let mut conn = fixture.db.connect().await.expect("connect");
    let nowhere = format!("inbox_test_nowhere_{}", std::process::id());
    let mut good = 0;
    for n in 0..12 {
        let message = match n {
            3 => OutboxMessage::new(nowhere.as_str(), "lost?"),
            5 => OutboxMessage::new("no topic!", "bad name"),
            7 => OutboxMessage::new(fixture.topic.as_str(), "clash").header(ID_HEADER, "mine"),
            _ => {
                good += 1;
                OutboxMessage::new(fixture.topic.as_str(), n.to_string())
            }
        };
        outbox::enqueue(&mut conn, message).await.expect("enqueue");
    }
    let relay = Relay::spawn(fixture.db.clone(), fixture.publisher(), eager());
    let records = fixture.records(good).await;
    let parked = parked_once(&mut conn, 3).await;
    relay.shut_down().await;

    assert_eq!(records.values().map(Vec::len).sum::<usize>(), good);
    let reasons: Vec<&str> = parked
        .iter()
        .map(|message| message.last_error().expect("a reason"))
        .collect();
    assert!(reasons[0].contains("no topic"), "{reasons:?}");
    assert!(reasons[1].contains("not a topic name"), "{reasons:?}");
    assert!(reasons[2].contains("the message's id"), "{reasons:?}");
    drop(conn);
    fixture.cleanup().await;
}

/// A Tansu broker of a test's own, in memory, behind a [`Proxy`] that it advertises as
/// its address: clients reach it only through the proxy, so that cutting the proxy cuts
/// them off. (The shared broker advertises its own address, past any proxy.)
struct OwnBroker {
    proxy: Arc<Proxy>,
    _process: tokio::process::Child,
}

/// Starts an [`OwnBroker`] with the `tansu` that `scripts/kafka.sh` installs (under
/// `TANSU_ROOT`, by default /opt/tansu); `None` where the suite is skipped.
async fn own_broker() -> Option<OwnBroker> {
    server_url("KAFKA_URL")?;
    let root = std::env::var("TANSU_ROOT").unwrap_or_else(|_| "/opt/tansu".to_owned());
    let tansu = format!("{root}/bin/tansu");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let upstream = SocketAddr::from(([127, 0, 0, 1], port));
    let proxy = Proxy::start(upstream).await;
    let process = tokio::process::Command::new(&tansu)
        .args(["broker", "--storage-engine", "memory://tansu/"])
        .arg("--listener-url")
        .arg(format!("tcp://{upstream}"))
        .arg("--advertised-listener-url")
        .arg(format!("tcp://{}", proxy.address()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|error| panic!("{tansu}: {error}; `scripts/kafka.sh start` installs it"));
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(upstream).await.is_ok() {
            return Some(OwnBroker {
                proxy,
                _process: process,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("tansu did not listen on {upstream} within 10 s");
}

/// The broker out of reach for a while: the relay keeps trying, the outbox holds what
/// could not go out, and it all goes out, each message at least once, when the broker
/// is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_out_of_reach_holds_messages_back_until_it_returns() {
    let Some(broker) = own_broker().await else {
        return;
    };
    let Some(fixture) = fixture_at(broker.proxy.address().to_string(), "outage").await else {
        return;
    };
    let relay = Relay::spawn(fixture.db.clone(), fixture.publisher(), eager());
    let mut conn = fixture.db.connect().await.expect("connect");
    let mut enqueued = Vec::new();
    let message = |n: usize| OutboxMessage::new(fixture.topic.as_str(), n.to_string());
    for n in 0..10 {
        enqueued.push(
            outbox::enqueue(&mut conn, message(n))
                .await
                .expect("enqueue"),
        );
    }
    fixture.records(10).await;
    // A produce still unanswered when the connections are cut would go out again:
    // cut once the first ten are marked.
    wait_until_sent(&mut conn).await;

    broker.proxy.cut();
    for n in 10..40 {
        enqueued.push(
            outbox::enqueue(&mut conn, message(n))
                .await
                .expect("enqueue"),
        );
    }
    // Each try ends at the publish time-out, 2 s with `eager`'s 6 s lease.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        unsent(&mut conn).await,
        30,
        "the outbox holds what the broker could not take"
    );
    let attempts = select_i64(
        &mut conn,
        "SELECT CAST(COALESCE(MAX(attempts), 0) AS BIGINT) FROM inbox_outbox",
    )
    .await
    .expect("attempts");
    assert!(attempts >= 2, "the relay kept trying: {attempts} attempts");

    broker.proxy.restore();
    wait_until_sent(&mut conn).await;
    relay.shut_down().await;
    let records = fixture.records(40).await;
    let topic = fixture.topic.as_str();
    let mut produced: Vec<&str> = records
        .iter()
        .flat_map(|(&partition, records)| {
            records
                .iter()
                .map(move |record| id_of(topic, partition, record))
        })
        .collect();
    produced.sort_unstable();
    produced.dedup();
    enqueued.sort();
    assert_eq!(produced, enqueued, "every message, none lost");
    drop(conn);
    fixture.cleanup().await;
}
