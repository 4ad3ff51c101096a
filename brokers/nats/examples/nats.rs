//! A NATS JetStream consumer service of credit messages, exactly once on PostgreSQL.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test NATS_URL=127.0.0.1:4222 \
//!     cargo run -p diesel-inbox-nats --example nats
//! ```
//!
//! It consumes the stream `CREDITS` (subject `credits.requested`; `STREAM` to change the
//! prefix) through the durable pull consumer `credit`. Producers set `Nats-Msg-Id` and send
//! a JSON body `{"account": 1, "amount": 250}`; with `PUBLISH=100` it first publishes
//! that many, each twice, as a producer retrying a lost acknowledgement does.
//!
//! - `CONCURRENCY` handlers (8) run at once, each on a pooled connection; the consumer's
//!   `max_ack_pending` is the same number, so JetStream never hands out more.
//! - The outcome is carried out by `Settlement::settle`: ack, nak with a delay, or
//!   publish to the stream `CREDITS_DEAD` with the reason and terminate. A retry on the 9th delivery is dead-lettered; `max_deliver` is 10.
//! - SIGTERM or Ctrl-C: stop pulling, let the running handlers finish and settle, drain
//!   the connection.
//! - The client reconnects by itself (`retry_on_initial_connect`, exponential backoff up
//!   to 30 s); a pull that fails starts again with the same backoff; a lost database
//!   connection is the pool's to replace, and its message is retried.

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::{self, Context, Message, stream};
use deadpool::managed::PoolError;
use diesel::prelude::*;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use diesel_inbox::{Classify, Disposition, ErrorClass, idempotent};
use diesel_inbox_nats::{Settled, Settlement, message_key};
use futures_util::{StreamExt, TryStreamExt};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

diesel::table! {
    accounts (id) {
        id -> BigInt,
        balance -> BigInt,
    }
}

#[derive(Debug, serde::Deserialize, serde::Serialize)]
struct CreditRequested {
    account: i64,
    amount: i64,
}

#[derive(Debug, thiserror::Error)]
enum CreditError {
    #[error(transparent)]
    Db(#[from] diesel::result::Error),
    #[error("account {0} does not exist")]
    NoSuchAccount(i64),
}

impl Classify for CreditError {
    fn class(&self) -> ErrorClass {
        match self {
            Self::Db(error) => error.class(),
            Self::NoSuchAccount(_) => ErrorClass::Permanent,
        }
    }
}

#[idempotent(consumer = "credit", key = key)]
async fn credit(
    conn: &mut AsyncPgConnection,
    key: diesel_inbox_nats::MessageKey<'_>,
    msg: &CreditRequested,
) -> Result<(), CreditError> {
    let updated = diesel::update(accounts::table.find(msg.account))
        .set(accounts::balance.eq(accounts::balance + msg.amount))
        .execute(conn)
        .await?;
    if updated == 0 {
        return Err(CreditError::NoSuchAccount(msg.account));
    }
    Ok(())
}

const MAX_DELIVER: i64 = 10;

/// How long JetStream waits for an ack before it redelivers; a handler still running
/// says it is in progress every third of it.
const ACK_WAIT: Duration = Duration::from_secs(30);

struct Service {
    pool: Pool<AsyncPgConnection>,
    settlement: Settlement,
    concurrency: u16,
    shutdown: CancellationToken,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt().init();
    let database_url = std::env::var("DATABASE_URL")?;
    let nats_url = std::env::var("NATS_URL")?;
    let concurrency: u16 = env_or("CONCURRENCY", 8)?;
    let prefix = std::env::var("STREAM").unwrap_or_else(|_| "CREDITS".into());

    let pool = Pool::builder(AsyncDieselConnectionManager::<AsyncPgConnection>::new(
        database_url,
    ))
    .max_size(concurrency.into())
    .build()?;
    {
        let mut conn = pool.get().await?;
        diesel_inbox::migrate(&mut conn).await?;
        conn.batch_execute(
            "CREATE TABLE IF NOT EXISTS accounts (id bigint PRIMARY KEY, balance bigint NOT NULL);
             INSERT INTO accounts SELECT id, 0 FROM generate_series(1, 10) AS id
             ON CONFLICT DO NOTHING",
        )
        .await?;
    }
    diesel_inbox::check_consumers()?;

    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .reconnect_delay_callback(backoff)
        .connect(nats_url)
        .await?;
    let jetstream = jetstream::new(client.clone());
    let subject = format!("{}.requested", prefix.to_lowercase());
    let consumer = declare(&jetstream, &prefix, &subject, concurrency).await?;
    let service = Service {
        pool,
        settlement: Settlement::new(format!("{}.dead-letter", prefix.to_lowercase()))
            .with_max_deliveries(MAX_DELIVER - 1)
            .with_ack_wait(ACK_WAIT),
        concurrency,
        shutdown: CancellationToken::new(),
    };
    tokio::spawn(cancel_on_signal(service.shutdown.clone()));
    if let Ok(count) = std::env::var("PUBLISH") {
        publish_demo(&jetstream, &subject, count.parse()?).await?;
    }

    let mut attempt = 0;
    while !service.shutdown.is_cancelled() {
        match service.consume(&consumer).await {
            Ok(()) => break,
            Err(error) => {
                let delay = backoff(attempt);
                attempt += 1;
                warn!(%error, ?delay, "pulling failed; starting again");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = service.shutdown.cancelled() => break,
                }
            }
        }
    }
    // Sends what is buffered (the last acks) before closing.
    client.drain().await?;
    info!("stopped");
    Ok(())
}

/// Exponential backoff from 100 ms, up to 30 s.
fn backoff(attempt: usize) -> Duration {
    Duration::from_millis(100)
        .saturating_mul(1 << attempt.min(9))
        .min(Duration::from_secs(30))
}

/// The work stream, the dead-letter stream and the durable consumer (idempotent).
async fn declare(
    jetstream: &Context,
    prefix: &str,
    subject: &str,
    concurrency: u16,
) -> Result<PullConsumer, BoxError> {
    let work = jetstream
        .get_or_create_stream(stream::Config {
            name: prefix.to_owned(),
            subjects: vec![subject.to_owned()],
            // Also the window in which a re-published `Nats-Msg-Id` is dropped.
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await?;
    jetstream
        .get_or_create_stream(stream::Config {
            name: format!("{prefix}_DEAD"),
            subjects: vec![format!("{}.dead-letter", prefix.to_lowercase())],
            ..Default::default()
        })
        .await?;
    let consumer = work
        .get_or_create_consumer(
            "credit",
            pull::Config {
                durable_name: Some("credit".into()),
                ack_policy: AckPolicy::Explicit,
                ack_wait: ACK_WAIT,
                max_deliver: MAX_DELIVER,
                max_ack_pending: concurrency.into(),
                ..Default::default()
            },
        )
        .await?;
    Ok(consumer)
}

impl Service {
    /// Consumes until shut down (`Ok`) or until pulling fails (`Err`).
    async fn consume(&self, consumer: &PullConsumer) -> Result<(), BoxError> {
        let messages = consumer
            .stream()
            .max_messages_per_batch(self.concurrency.into())
            .messages()
            .await?;
        info!("consuming");
        // Messages pulled but not started when shutting down are redelivered after
        // `ack_wait`; a failed pull ends the handlers still running with it, whose
        // messages are redelivered the same way.
        messages
            .take_until(self.shutdown.cancelled())
            .try_for_each_concurrent(usize::from(self.concurrency), |message| async move {
                self.handle(message).await;
                Ok(())
            })
            .await?;
        Ok(())
    }

    async fn handle(&self, message: Message) {
        let disposition = match message_key(&message) {
            Err(missing) => Disposition::DeadLetter {
                reason: missing.to_string(),
            },
            Ok(key) => match serde_json::from_slice::<CreditRequested>(&message.payload) {
                Err(error) => Disposition::DeadLetter {
                    reason: format!("not a credit message: {error}"),
                },
                Ok(msg) => match self.pool.get().await {
                    // Kept in progress while it runs, however long the database takes.
                    Ok(mut conn) => {
                        let credited = credit(&mut conn, key, &msg);
                        Disposition::of(&self.settlement.in_progress(&message, credited).await)
                    }
                    Err(error) => {
                        warn!(%error, "no database connection");
                        Disposition::Retry {
                            after: matches!(error, PoolError::Timeout(_))
                                .then(|| Duration::from_secs(1)),
                            reason: error.to_string(),
                        }
                    }
                },
            },
        };
        match self.settlement.settle(&message, &disposition).await {
            Ok(Settled::DeadLettered { reason }) => warn!(%reason, "dead-lettered"),
            Ok(_) => {}
            // Unsettled: JetStream redelivers it after `ack_wait`.
            Err(error) => warn!(%error, "could not settle a message"),
        }
    }
}

async fn cancel_on_signal(shutdown: CancellationToken) {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    info!("shutting down: finishing the handlers under way");
    shutdown.cancel();
}

/// Publishes `count` credit messages, each twice with the same `Nats-Msg-Id`.
async fn publish_demo(jetstream: &Context, subject: &str, count: u32) -> Result<(), BoxError> {
    // Ids of this run's own, so that a second run is not all duplicates.
    let run = std::time::UNIX_EPOCH.elapsed()?.as_millis();
    for n in 0..count {
        let body = serde_json::to_vec(&CreditRequested {
            account: i64::from(n % 10) + 1,
            amount: 1,
        })?;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            format!("{run}-{n}").as_str(),
        );
        for _ in 0..2 {
            jetstream
                .publish_with_headers(subject.to_owned(), headers.clone(), body.clone().into())
                .await?
                .await?;
        }
    }
    info!(count, "published, each twice");
    Ok(())
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T, BoxError>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    match std::env::var(name) {
        Ok(value) => Ok(value.parse()?),
        Err(_) => Ok(default),
    }
}
