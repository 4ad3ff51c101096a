//! RabbitMQ glue for [diesel-inbox](https://docs.rs/diesel-inbox), through
//! [lapin](https://docs.rs/lapin): the key of a delivery, and a
//! [`Disposition`](diesel_inbox::Disposition) carried out on it. What all the broker glue
//! shares is in diesel-inbox's
//! [brokers guide](https://docs.rs/diesel-inbox/latest/diesel_inbox/guide/brokers/index.html).
//!
//! ```toml
//! [dependencies]
//! diesel-inbox = { version = "0.1", features = ["postgres"] }
//! diesel-inbox-lapin = "0.1"
//! ```
//!
//! ```rust,no_run
//! # use diesel_async::AsyncPgConnection;
//! # use diesel_inbox::Disposition;
//! # use lapin::message::Delivery;
//! # type BoxError = Box<dyn std::error::Error + Send + Sync>;
//! # #[diesel_inbox::idempotent(consumer = "credit-rabbitmq", key = key)]
//! # async fn credit(conn: &mut AsyncPgConnection, key: &str, payload: &[u8]) -> diesel::QueryResult<()> {
//! #     let _ = payload;
//! #     Ok(())
//! # }
//! # async fn consume(conn: &mut AsyncPgConnection, delivery: Delivery) -> Result<(), BoxError> {
//! use diesel_inbox_lapin::{Queues, connect, message_key};
//!
//! let connection = connect("amqp://guest:guest@127.0.0.1:5672").await?; // lapin on tokio
//! let channel = connection.create_channel().await?;
//! channel.confirm_select(Default::default()).await?;
//! let queues = Queues::new("credits"); // with credits.retry.<ms>ms and credits.dead-letter
//! queues.declare(&channel).await?;     // quorum queues
//! // … for each delivery:
//! let disposition = match message_key(&delivery) {
//!     Ok(key) => Disposition::of(&credit(conn, key, &delivery.data).await),
//!     // Never processed without the inbox: it goes to the dead-letter queue.
//!     Err(missing) => Disposition::DeadLetter { reason: missing.to_string() },
//! };
//! queues.settle(&channel, &delivery, &disposition).await?;
//! # Ok(()) }
//! ```
//!
//! # The key
//!
//! The key is the `message_id` property, which the producer sets and RabbitMQ never
//! changes: a producer that publishes again after losing its confirm repeats it. The
//! delivery tag (per channel), the `redelivered` flag, the `x-delivery-count` and
//! `x-death` headers and the timestamp all change or may be absent across redeliveries:
//! none of them is a key. A delivery without a `message_id` is [`MissingKey`]:
//! dead-letter it.
//!
//! # Settling
//!
//! [`Queues`] names a work queue and its companions, declares them, and settles
//! deliveries:
//!
//! | disposition | what happens |
//! |---|---|
//! | `Ack` | the delivery is acked |
//! | `Retry { after }` | a copy goes to the retry queue of that delay (default 1 s), `<work>.retry.<ms>ms`, from where RabbitMQ dead-letters it back to the work queue once the delay has passed; then the delivery is acked. Past 10 retries, a dead letter whose reason is the last retry's |
//! | `DeadLetter { reason }` | a copy goes to `<work>.dead-letter` with the reason in the `x-inbox-reason` header; then the delivery is acked |
//!
//! RabbitMQ expires messages only at the head of a queue, so one retry queue holding
//! different delays would return a short retry only after every longer one ahead of it:
//! 200 ms behind 15 s came back after 15 s. Each retry queue holds one delay, its
//! queue-wide TTL, and a delay waits in the queue of the next one up on a fixed ladder
//! (100 ms, 250 ms, 500 ms, 1 s, then each a tenth and a second longer than the last, up
//! to a day): a retry after *d* comes back after at most *d* plus a tenth plus a second,
//! whatever else is waiting. Each retry declares (idempotently) the retry queue it waits
//! in, so only the delays retries have used have a queue;
//! [`Queues::waiting_retries`] counts what they hold. Delays beyond the ladder's top come
//! back after about a day.
//!
//! Copies are published with `mandatory` on a channel in confirm mode, and the delivery is
//! acked only once the broker has confirmed the copy: a crash in between leaves two copies
//! of the message, which the inbox turns into one `Processed` and one `Duplicate`, never
//! none. A copy that is not stored (a full dead-letter queue that rejects publishes, a
//! closed channel) fails the settle and hands the delivery back. The work queue is a
//! quorum queue with a delivery limit (`x-delivery-limit`, 20), so a message that keeps
//! killing its consumer lands in the dead-letter queue too; the retry queues return
//! messages at least once (`x-dead-letter-strategy: at-least-once`).
//!
//! A copy keeps the delivery's properties and headers but for those the broker acts on:
//! not its `expiration` (the retry queue's delay decides, and a dead letter is kept),
//! nor its `user_id`, which RabbitMQ checks against the publishing connection's user;
//! nor its dead-lettering history (`x-death`, `x-first-death-*`, `x-last-death-*`), with
//! which a message moved back from the dead-letter queue would be taken for a
//! dead-letter cycle on its way back from a retry queue and dropped; nor `CC` and `BCC`,
//! which would send the queues they name another copy.
//!
//! # The wait for an ack
//!
//! RabbitMQ takes back a delivery left unacked for the server's `consumer_timeout` (30
//! minutes by default, in `rabbitmq.conf`) and hands it to another consumer, while the
//! first may still be running its handler. A client can neither read nor extend it over
//! AMQP: keep handlers well within it, and raise it for long claim-mode bodies.
//! [`Queues::retention`] turns it and the queues' own settings into the window to keep
//! markers for.
//!
//! # Publishing the outbox
//!
//! [`OutboxPublisher`] publishes diesel-inbox's outbox through its `Relay`: each message
//! persistent and `mandatory`, its id in the `message_id` property that
//! [`message_key`] reads on the receiving side, reported sent only once the broker has
//! confirmed it, one publish per channel at a time. A missing exchange, an unroutable
//! message or an oversized payload is parked for an operator; a closed channel or
//! connection is opened again.
//!
//! # A complete consumer
//!
//! The repository's `brokers/lapin/examples/rabbitmq.rs` is a consumer service to copy:
//! 8 handlers at once on a deadpool pool with the prefetch (`basic_qos`) at the same
//! number, settled through [`Queues`], key-less and unreadable messages dead-lettered,
//! shutdown on SIGTERM or Ctrl-C (stop taking deliveries, let the running handlers finish
//! and settle, close), and reconnection with exponential backoff.
//! `PUBLISH=200` first publishes 200 credits, each twice:
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test AMQP_URL=amqp://guest:guest@127.0.0.1:5672 \
//! PUBLISH=200 cargo run -p diesel-inbox-lapin --example rabbitmq
//! ```
//!
//! It creates the `inbox` and `accounts` tables in the database it is given, and the
//! queues `credits`, `credits.retry.<ms>ms` and `credits.dead-letter`; `QUEUE` renames
//! them.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]

mod ladder;
mod outbox;
mod queues;

use diesel_inbox::MissingKey;
use lapin::message::Delivery;
use lapin::types::AMQPValue;
use lapin::{Connection, ConnectionProperties};

pub use outbox::OutboxPublisher;
pub use queues::{Queues, SettleError, Settled};

/// The header that counts how often a message went through the retry queue.
pub const RETRIES_HEADER: &str = "x-inbox-retries";
/// The header that carries a dead-lettered message's reason.
pub const REASON_HEADER: &str = "x-inbox-reason";

/// Connects to RabbitMQ at `url` (`amqp://…`) with lapin running on the current tokio
/// runtime, its executor and its reactor: the glue lapin needs and does not bring.
///
/// # Panics
///
/// Outside a tokio runtime.
pub async fn connect(url: &str) -> Result<Connection, lapin::Error> {
    let properties = ConnectionProperties::default()
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio::current());
    Connection::connect(url, properties).await
}

/// The inbox key of a delivery: its `message_id` property.
///
/// A delivery without one, or with an empty one, is [`MissingKey`]: dead-letter it.
pub fn message_key(delivery: &Delivery) -> Result<&str, MissingKey> {
    match delivery.properties.message_id() {
        Some(id) if !id.as_str().is_empty() => Ok(id.as_str()),
        _ => Err(MissingKey::new("message_id property")),
    }
}

/// How many times a delivery has already been sent back through the retry queue.
pub fn retries(delivery: &Delivery) -> u32 {
    delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get(RETRIES_HEADER))
        .and_then(AMQPValue::as_long_long_int)
        .and_then(|count| u32::try_from(count).ok())
        .unwrap_or(0)
}
