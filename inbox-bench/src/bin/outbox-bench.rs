//! What the outbox costs and how fast it delivers, on PostgreSQL: the credit handler
//! with and without one `outbox::enqueue` (the cost of the outbox row), then per broker
//! (RabbitMQ, NATS JetStream, and Kafka where `KAFKA_URL` names one)
//! the relay's throughput draining a filled outbox, and the latency from a credit's
//! commit to the event's arrival at a consumer (which follows the broker's ack), for
//! the relay's poll intervals. Prints a Markdown report.
//!
//! ```sh
//! cargo run --release -p inbox-bench --bin outbox-bench -- --seconds 8 --rounds 3
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use diesel::result::Error;
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use diesel_inbox::outbox::{self, OutboxMessage, Publisher, Relay, RelaySettings};
use diesel_inbox::testing::{TestDatabase, select_i64};
use diesel_inbox::{InboxBackend, idempotent};
use futures_util::StreamExt as _;

#[derive(Parser)]
struct Args {
    /// Seconds each handler round runs.
    #[arg(long, default_value_t = 8)]
    seconds: u64,
    /// Interleaved rounds of the two handlers.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Consumers running the handlers at once.
    #[arg(long, default_value_t = 8)]
    consumers: usize,
    /// Messages the relay drains in the throughput rows.
    #[arg(long, default_value_t = 10_000)]
    drain: usize,
    /// Events per second enqueued in the latency rows.
    #[arg(long, default_value_t = 100)]
    rate: u64,
    /// Seconds each latency row enqueues for.
    #[arg(long, default_value_t = 10)]
    latency_seconds: u64,
}

const ACCOUNTS: i64 = 1_000;

#[idempotent(consumer = "bench-credit", key = key)]
async fn credit<C>(conn: &mut C, key: &str, account: i64) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    conn.batch_execute(&format!(
        "UPDATE bench_accounts SET balance = balance + 1 WHERE id = {account}"
    ))
    .await
}

#[idempotent(consumer = "bench-credit-announced", key = key)]
async fn credit_and_announce<C>(
    conn: &mut C,
    key: &str,
    account: i64,
    event: OutboxMessage,
) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    conn.batch_execute(&format!(
        "UPDATE bench_accounts SET balance = balance + 1 WHERE id = {account}"
    ))
    .await?;
    outbox::enqueue(conn, event).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let pg = std::env::var("POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let amqp = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".to_owned());
    let nats = std::env::var("NATS_URL").unwrap_or_else(|_| "127.0.0.1:4222".to_owned());
    let kafka_url = std::env::var("KAFKA_URL")
        .ok()
        .filter(|url| !url.is_empty());
    let db = TestDatabase::<AsyncPgConnection>::postgres(&pg, "outbox_bench").await?;
    let mut conn = db.connect().await?;
    outbox::migrate(&mut conn).await?;
    conn.batch_execute(&format!(
        "CREATE TABLE bench_accounts (id bigint PRIMARY KEY, balance bigint NOT NULL); \
         INSERT INTO bench_accounts SELECT g, 0 FROM generate_series(1, {ACCOUNTS}) g"
    ))
    .await?;

    println!("## The outbox on PostgreSQL\n");
    handler_cost(&db, &args).await?;

    let queue = format!("outbox-bench-{}", std::process::id());
    let rabbit = rabbitmq::RabbitMq::declare(&amqp, &queue).await?;
    let jetstream = nats::JetStream::create(&nats, &queue.replace('-', "_")).await?;
    let kafka = match &kafka_url {
        Some(url) => Some(kafka::Kafka::create(url, &queue.replace('-', "_")).await?),
        None => None,
    };

    println!(
        "\n### The relay's throughput, draining {} messages\n",
        args.drain
    );
    println!("| broker | relays | messages per second |\n|---|---|---|");
    throughput_rows(&db, &args, &rabbit).await?;
    throughput_rows(&db, &args, &jetstream).await?;
    if let Some(kafka) = &kafka {
        throughput_rows(&db, &args, kafka).await?;
    }

    println!(
        "\n### Latency from commit to arrival, {} events a second for {} s\n",
        args.rate, args.latency_seconds
    );
    println!("| broker | poll interval | p50 | p99 | max |\n|---|---|---|---|---|");
    latency_rows(&db, &args, &rabbit).await?;
    latency_rows(&db, &args, &jetstream).await?;
    if let Some(kafka) = &kafka {
        latency_rows(&db, &args, kafka).await?;
    }

    rabbit.delete().await?;
    jetstream.delete().await?;
    if let Some(kafka) = kafka {
        kafka.delete().await?;
    }
    drop(conn);
    db.cleanup().await?;
    Ok(())
}

/// A broker destination the relay publishes to, and a consumer of it.
trait Target {
    type Publisher: Publisher;
    /// The broker's name in the report.
    const NAME: &'static str;

    fn publisher(&self) -> Self::Publisher;
    /// A 100-byte message to the destination.
    fn message(&self) -> OutboxMessage;
    /// How many messages the destination holds since the last purge.
    async fn count(&self) -> anyhow::Result<u64>;
    async fn purge(&self) -> anyhow::Result<()>;
    /// A consumer from now on, reporting each message's id and arrival.
    async fn arrivals(&self) -> anyhow::Result<Arrivals>;
    async fn delete(&self) -> anyhow::Result<()>;
}

/// The throughput rows of `target`, with one relay and with two.
async fn throughput_rows<T: Target>(
    db: &TestDatabase<AsyncPgConnection>,
    args: &Args,
    target: &T,
) -> anyhow::Result<()> {
    for relays in [1, 2] {
        let rate = drain(db, args, relays, target).await?;
        println!("| {} | {relays} | {rate:.0} |", T::NAME);
        // Emptied for the next count, and for the latency rows' consumers.
        target.purge().await?;
    }
    Ok(())
}

/// The latency rows of `target`, by poll interval; the last wakes the relay after each
/// commit, as the committing process can.
async fn latency_rows<T: Target>(
    db: &TestDatabase<AsyncPgConnection>,
    args: &Args,
    target: &T,
) -> anyhow::Result<()> {
    for (poll, woken) in [(100, false), (20, false), (5, false), (100, true)] {
        let poll = Duration::from_millis(poll);
        let row = latency(db, args, poll, woken, target).await?;
        let woken = if woken { ", woken" } else { "" };
        println!("| {} | {poll:?}{woken} | {row} |", T::NAME);
    }
    Ok(())
}

/// The credit handler with and without one enqueued event, in interleaved rounds.
async fn handler_cost(db: &TestDatabase<AsyncPgConnection>, args: &Args) -> anyhow::Result<()> {
    println!(
        "### The cost of the outbox row: {} consumers, {} rounds of {} s\n",
        args.consumers, args.rounds, args.seconds
    );
    println!("| round | credit | credit + enqueue | ratio |\n|---|---|---|---|");
    let mut ratios = Vec::new();
    for round in 1..=args.rounds {
        let plain = run_consumers(db, args, false).await?;
        let announced = run_consumers(db, args, true).await?;
        let mut conn = db.connect().await?;
        conn.batch_execute("DELETE FROM inbox_outbox").await?;
        ratios.push(announced / plain);
        println!(
            "| {round} | {plain:.0} | {announced:.0} | {:.2} |",
            announced / plain
        );
    }
    ratios.sort_by(f64::total_cmp);
    println!("\nMedian ratio: {:.2}", ratios[ratios.len() / 2]);
    Ok(())
}

/// Messages per second that `args.consumers` consumers handle in `args.seconds`.
async fn run_consumers(
    db: &TestDatabase<AsyncPgConnection>,
    args: &Args,
    announce: bool,
) -> anyhow::Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let mut consumers = Vec::new();
    for consumer in 0..args.consumers {
        let db = db.clone();
        consumers.push(tokio::spawn(async move {
            let mut conn = db.connect().await?;
            let mut handled = 0_u64;
            while Instant::now() < deadline {
                let key = uuid::Uuid::new_v4().to_string();
                let account = (handled as i64 * 7 + consumer as i64) % ACCOUNTS + 1;
                if announce {
                    let event = OutboxMessage::new("accounts", key.clone().into_bytes())
                        .routing_key("credited");
                    let _processed = credit_and_announce(&mut conn, &key, account, event).await?;
                } else {
                    let _processed = credit(&mut conn, &key, account).await?;
                }
                handled += 1;
            }
            anyhow::Ok(handled)
        }));
    }
    let mut handled = 0;
    for consumer in consumers {
        handled += consumer.await??;
    }
    Ok(handled as f64 / args.seconds as f64)
}

/// Fills the outbox with `args.drain` messages, then times `relays` relays draining it
/// to `target`.
async fn drain<T: Target>(
    db: &TestDatabase<AsyncPgConnection>,
    args: &Args,
    relays: usize,
    target: &T,
) -> anyhow::Result<f64> {
    let mut conn = db.connect().await?;
    conn.batch_execute("DELETE FROM inbox_outbox").await?;
    conn.batch_execute("BEGIN").await?;
    for _ in 0..args.drain {
        outbox::enqueue(&mut conn, target.message()).await?;
    }
    conn.batch_execute("COMMIT").await?;
    let started = Instant::now();
    let running: Vec<Relay> = (0..relays)
        .map(|_| {
            Relay::spawn(
                db.clone(),
                target.publisher(),
                fast(Duration::from_millis(5)),
            )
        })
        .collect();
    while select_i64(
        &mut conn,
        "SELECT COUNT(*) FROM inbox_outbox WHERE sent_at IS NULL",
    )
    .await?
        > 0
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    for relay in running {
        relay.shut_down().await;
    }
    let stored = target.count().await?;
    anyhow::ensure!(
        stored >= args.drain as u64,
        "{stored} of {} stored",
        args.drain
    );
    Ok(args.drain as f64 / elapsed.as_secs_f64())
}

/// Enqueues `args.rate` events a second, each in its own committed transaction, and
/// reports the delays from each commit to its event's arrival at `target`; with
/// `wake`, each commit wakes the relay.
async fn latency<T: Target>(
    db: &TestDatabase<AsyncPgConnection>,
    args: &Args,
    poll: Duration,
    wake: bool,
    target: &T,
) -> anyhow::Result<String> {
    let arrivals = target.arrivals().await?;
    let relay = Relay::spawn(db.clone(), target.publisher(), fast(poll));
    let waker = relay.waker();
    let mut conn = db.connect().await?;
    let committed: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let total = args.rate * args.latency_seconds;
    let mut ticks = tokio::time::interval(Duration::from_secs(1) / args.rate as u32);
    for _ in 0..total {
        ticks.tick().await;
        conn.batch_execute("BEGIN").await?;
        let id = outbox::enqueue(&mut conn, target.message()).await?;
        conn.batch_execute("COMMIT").await?;
        committed.lock().unwrap().insert(id, Instant::now());
        if wake {
            waker.wake();
        }
    }
    let arrived = arrivals.collect(total as usize).await?;
    relay.shut_down().await;
    let committed = committed.lock().unwrap();
    let mut delays: Vec<Duration> = arrived
        .iter()
        .filter_map(|(id, at)| {
            committed
                .get(id)
                .map(|commit| at.saturating_duration_since(*commit))
        })
        .collect();
    anyhow::ensure!(
        delays.len() == total as usize,
        "{} of {total} arrived",
        delays.len()
    );
    delays.sort();
    let at = |share: f64| delays[((delays.len() as f64 * share) as usize).min(delays.len() - 1)];
    Ok(format!(
        "{:.1} ms | {:.1} ms | {:.1} ms",
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        delays[delays.len() - 1].as_secs_f64() * 1e3
    ))
}

/// What a consumer task saw: each event's id and the instant it arrived.
struct Arrivals(tokio::sync::mpsc::UnboundedReceiver<(String, Instant)>);

impl Arrivals {
    async fn collect(mut self, expected: usize) -> anyhow::Result<Vec<(String, Instant)>> {
        let mut arrived = Vec::with_capacity(expected);
        while arrived.len() < expected {
            let next = tokio::time::timeout(Duration::from_secs(30), self.0.recv())
                .await
                .context("events stopped arriving")?;
            arrived.push(next.context("the consumer ended")?);
        }
        Ok(arrived)
    }
}

fn fast(poll: Duration) -> RelaySettings {
    RelaySettings::new()
        .with_poll_interval(poll)
        .without_pruning()
}

mod rabbitmq {
    use lapin::options::{
        BasicAckOptions, BasicConsumeOptions, QueueDeclareOptions, QueueDeleteOptions,
        QueuePurgeOptions,
    };
    use lapin::types::FieldTable;

    use super::*;

    pub(super) struct RabbitMq {
        url: String,
        connection: lapin::Connection,
        channel: lapin::Channel,
        queue: String,
    }

    impl RabbitMq {
        pub(super) async fn declare(url: &str, queue: &str) -> anyhow::Result<Self> {
            let connection = diesel_inbox_lapin::connect(url).await?;
            let channel = connection.create_channel().await?;
            channel
                .queue_declare(queue, QueueDeclareOptions::default(), FieldTable::default())
                .await?;
            Ok(Self {
                url: url.to_owned(),
                connection,
                channel,
                queue: queue.to_owned(),
            })
        }
    }

    impl super::Target for RabbitMq {
        type Publisher = diesel_inbox_lapin::OutboxPublisher;
        const NAME: &'static str = "RabbitMQ";

        fn publisher(&self) -> Self::Publisher {
            diesel_inbox_lapin::OutboxPublisher::new(self.url.clone())
        }

        fn message(&self) -> OutboxMessage {
            OutboxMessage::new("", vec![0; 100]).routing_key(self.queue.as_str())
        }

        async fn count(&self) -> anyhow::Result<u64> {
            let declared = self
                .channel
                .queue_declare(
                    &self.queue,
                    QueueDeclareOptions {
                        passive: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await?;
            Ok(u64::from(declared.message_count()))
        }

        async fn purge(&self) -> anyhow::Result<()> {
            self.channel
                .queue_purge(&self.queue, QueuePurgeOptions::default())
                .await?;
            Ok(())
        }

        /// A consumer of the queue on a channel of its own, which it closes once the
        /// arrivals are dropped, handing back what it had not passed on.
        async fn arrivals(&self) -> anyhow::Result<Arrivals> {
            let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
            let channel = self.connection.create_channel().await?;
            let mut consumer = channel
                .basic_consume(
                    &self.queue,
                    "",
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            tokio::spawn(async move {
                loop {
                    let delivery = tokio::select! {
                        () = sender.closed() => break,
                        delivery = consumer.next() => match delivery {
                            Some(delivery) => delivery?,
                            None => break,
                        },
                    };
                    let at = Instant::now();
                    let id = diesel_inbox_lapin::message_key(&delivery)?.to_owned();
                    if sender.send((id, at)).is_err() {
                        break;
                    }
                    delivery.ack(BasicAckOptions::default()).await?;
                }
                channel.close(200, "measured").await?;
                anyhow::Ok(())
            });
            Ok(Arrivals(receiver))
        }

        async fn delete(&self) -> anyhow::Result<()> {
            self.channel
                .queue_delete(&self.queue, QueueDeleteOptions::default())
                .await?;
            Ok(())
        }
    }
}

mod nats {
    use async_nats::jetstream::{self, consumer, stream};

    use super::*;

    pub(super) struct JetStream {
        pub(super) context: jetstream::Context,
        name: String,
    }

    impl JetStream {
        pub(super) async fn create(url: &str, name: &str) -> anyhow::Result<Self> {
            let client = async_nats::connect(url).await?;
            let context = jetstream::new(client);
            let _ = context.delete_stream(name).await;
            context
                .create_stream(stream::Config {
                    name: name.to_owned(),
                    subjects: vec![format!("{name}.>")],
                    ..Default::default()
                })
                .await?;
            Ok(Self {
                context,
                name: name.to_owned(),
            })
        }
    }

    impl super::Target for JetStream {
        type Publisher = diesel_inbox_nats::OutboxPublisher;
        const NAME: &'static str = "NATS JetStream";

        fn publisher(&self) -> Self::Publisher {
            diesel_inbox_nats::OutboxPublisher::new(self.context.clone())
        }

        fn message(&self) -> OutboxMessage {
            OutboxMessage::new(self.name.as_str(), vec![0; 100]).routing_key("credited")
        }

        async fn count(&self) -> anyhow::Result<u64> {
            let mut stream = self.context.get_stream(&self.name).await?;
            Ok(stream.info().await?.state.messages)
        }

        async fn purge(&self) -> anyhow::Result<()> {
            self.context.get_stream(&self.name).await?.purge().await?;
            Ok(())
        }

        async fn arrivals(&self) -> anyhow::Result<Arrivals> {
            let stream = self.context.get_stream(&self.name).await?;
            let consumer = stream
                .create_consumer(consumer::push::OrderedConfig {
                    deliver_subject: format!(
                        "_deliver.{}.{}",
                        self.name,
                        uuid::Uuid::new_v4().simple()
                    ),
                    deliver_policy: consumer::DeliverPolicy::New,
                    ..Default::default()
                })
                .await?;
            let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
            tokio::spawn(async move {
                let mut messages = consumer.messages().await?;
                while let Some(message) = messages.next().await {
                    let message = message?;
                    let at = Instant::now();
                    let id = match diesel_inbox_nats::message_key(&message)? {
                        diesel_inbox_nats::MessageKey::MsgId(id) => id.to_owned(),
                        other => other.to_string(),
                    };
                    if sender.send((id, at)).is_err() {
                        break;
                    }
                }
                anyhow::Ok(())
            });
            Ok(Arrivals(receiver))
        }

        async fn delete(&self) -> anyhow::Result<()> {
            self.context.delete_stream(&self.name).await?;
            Ok(())
        }
    }
}

mod kafka {
    use rskafka::client::partition::{OffsetAt, PartitionClient, UnknownTopicHandling};
    use rskafka::client::{Client, ClientBuilder};

    use super::*;

    /// A topic of one partition, so that counting and reading it is one partition's
    /// offsets; the publisher's partitioning is measured by the Kafka crate's tests.
    pub(super) struct Kafka {
        client: Arc<Client>,
        partition: Arc<PartitionClient>,
        topic: String,
        /// The offset counting starts from, moved on by `purge`.
        base: Mutex<i64>,
    }

    impl Kafka {
        pub(super) async fn create(url: &str, topic: &str) -> anyhow::Result<Self> {
            let client = ClientBuilder::new(vec![url.to_owned()]).build().await?;
            let controller = client.controller_client()?;
            let _ = controller.delete_topic(topic, 5_000).await;
            controller.create_topic(topic, 1, 1, 5_000).await?;
            let partition = client
                .partition_client(topic, 0, UnknownTopicHandling::Retry)
                .await?;
            Ok(Self {
                client: Arc::new(client),
                partition: Arc::new(partition),
                topic: topic.to_owned(),
                base: Mutex::new(0),
            })
        }
    }

    impl super::Target for Kafka {
        type Publisher = diesel_inbox_kafka::OutboxPublisher;
        const NAME: &'static str = "Kafka (Tansu)";

        fn publisher(&self) -> Self::Publisher {
            diesel_inbox_kafka::OutboxPublisher::new(Arc::clone(&self.client))
        }

        fn message(&self) -> OutboxMessage {
            OutboxMessage::new(self.topic.as_str(), vec![0; 100])
        }

        async fn count(&self) -> anyhow::Result<u64> {
            let latest = self.partition.get_offset(OffsetAt::Latest).await?;
            let base = *self.base.lock().unwrap();
            Ok(u64::try_from(latest - base)?)
        }

        async fn purge(&self) -> anyhow::Result<()> {
            let latest = self.partition.get_offset(OffsetAt::Latest).await?;
            *self.base.lock().unwrap() = latest;
            Ok(())
        }

        /// A reader from the partition's end on, fetching as soon as the last fetch
        /// returned: an empty fetch waits at most 5 ms on the broker.
        async fn arrivals(&self) -> anyhow::Result<Arrivals> {
            let mut next = self.partition.get_offset(OffsetAt::Latest).await?;
            let partition = Arc::clone(&self.partition);
            let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
            tokio::spawn(async move {
                while !sender.is_closed() {
                    let (records, _) = partition.fetch_records(next, 1..1_000_000, 5).await?;
                    let at = Instant::now();
                    for record in records {
                        next = record.offset + 1;
                        let id = record
                            .record
                            .headers
                            .get(diesel_inbox_kafka::ID_HEADER)
                            .context("a record without its id")?;
                        if sender.send((String::from_utf8(id.clone())?, at)).is_err() {
                            break;
                        }
                    }
                }
                anyhow::Ok(())
            });
            Ok(Arrivals(receiver))
        }

        async fn delete(&self) -> anyhow::Result<()> {
            self.client
                .controller_client()?
                .delete_topic(&self.topic, 5_000)
                .await?;
            Ok(())
        }
    }
}
