//! A RabbitMQ consumer service of credit messages, exactly once on PostgreSQL.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test AMQP_URL=amqp://guest:guest@127.0.0.1:5672 \
//!     cargo run -p diesel-inbox-lapin --example rabbitmq
//! ```
//!
//! It consumes the quorum queue `credits` (`QUEUE` to change it), published to with a
//! `message_id` and a JSON body `{"account": 1, "amount": 250}`; with `PUBLISH=100` it
//! first publishes that many, each twice, as a producer retrying a lost confirm does.
//!
//! - `CONCURRENCY` handlers (8) run at once, each on a pooled connection; the channel's
//!   prefetch is the same number, so the broker never hands out more than are running.
//! - The outcome is carried out by `Queues::settle`: ack, retry through the retry queue
//!   of its delay (`credits.retry.1000ms`), or dead-letter to `credits.dead-letter` with
//!   the reason. A message without `message_id` is dead-lettered, never processed.
//! - SIGTERM or Ctrl-C: stop taking deliveries, let the running handlers finish and
//!   settle, close the channel and the connection.
//! - A lost broker connection reconnects with exponential backoff (up to 30 s); a lost
//!   database connection is the pool's to replace, and its delivery is retried.

use std::time::Duration;

use deadpool::managed::PoolError;
use diesel::prelude::*;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use diesel_inbox::{Classify, Disposition, ErrorClass, idempotent};
use diesel_inbox_lapin::{Queues, Settled, connect, message_key};
use futures_util::{StreamExt, TryStreamExt};
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel};
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

#[idempotent(consumer = "credit", key = message_id)]
async fn credit(
    conn: &mut AsyncPgConnection,
    message_id: &str,
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

struct Service {
    pool: Pool<AsyncPgConnection>,
    queues: Queues,
    concurrency: u16,
    shutdown: CancellationToken,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt().init();
    let database_url = std::env::var("DATABASE_URL")?;
    let amqp_url = std::env::var("AMQP_URL")?;
    let concurrency: u16 = env_or("CONCURRENCY", 8)?;

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

    let service = Service {
        pool,
        queues: Queues::new(std::env::var("QUEUE").unwrap_or_else(|_| "credits".into())),
        concurrency,
        shutdown: CancellationToken::new(),
    };
    tokio::spawn(cancel_on_signal(service.shutdown.clone()));
    if let Ok(count) = std::env::var("PUBLISH") {
        publish_demo(&amqp_url, &service.queues, count.parse()?).await?;
    }

    let mut backoff = Duration::from_millis(100);
    while !service.shutdown.is_cancelled() {
        match service.consume(&amqp_url).await {
            Ok(()) => break,
            Err(error) => {
                warn!(%error, ?backoff, "RabbitMQ connection lost; reconnecting");
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = service.shutdown.cancelled() => break,
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
    info!("stopped");
    Ok(())
}

impl Service {
    /// Consumes until shut down (`Ok`) or until the connection fails (`Err`).
    async fn consume(&self, amqp_url: &str) -> Result<(), BoxError> {
        let connection = connect(amqp_url).await?;
        let channel = connection.create_channel().await?;
        // Retries and dead letters are copies that must be confirmed before the ack.
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        channel
            .basic_qos(self.concurrency, BasicQosOptions::default())
            .await?;
        self.queues.declare(&channel).await?;
        let deliveries = channel
            .basic_consume(
                self.queues.work(),
                "",
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        info!(queue = self.queues.work(), "consuming");

        // A failed connection ends the stream with an error, and the handlers still
        // running with it: their deliveries go back to the queue with the channel.
        deliveries
            .take_until(self.shutdown.cancelled())
            .try_for_each_concurrent(usize::from(self.concurrency), |delivery| async {
                self.handle(&channel, delivery).await;
                Ok(())
            })
            .await?;
        // Shut down: every handler has settled its delivery.
        channel.close(200, "shutting down").await?;
        connection.close(200, "shutting down").await?;
        Ok(())
    }

    async fn handle(&self, channel: &Channel, delivery: lapin::message::Delivery) {
        let disposition = match message_key(&delivery) {
            Err(missing) => Disposition::DeadLetter {
                reason: missing.to_string(),
            },
            Ok(key) => match serde_json::from_slice::<CreditRequested>(&delivery.data) {
                Err(error) => Disposition::DeadLetter {
                    reason: format!("not a credit message: {error}"),
                },
                Ok(msg) => match self.pool.get().await {
                    Ok(mut conn) => Disposition::of(&credit(&mut conn, key, &msg).await),
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
        match self.queues.settle(channel, &delivery, &disposition).await {
            Ok(Settled::DeadLettered { reason }) => warn!(%reason, "dead-lettered"),
            Ok(_) => {}
            // Unsettled: RabbitMQ redelivers it when the channel closes.
            Err(error) => warn!(%error, "could not settle a delivery"),
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

/// Publishes `count` credit messages, each twice with the same `message_id`.
async fn publish_demo(amqp_url: &str, queues: &Queues, count: u32) -> Result<(), BoxError> {
    let connection = connect(amqp_url).await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    queues.declare(&channel).await?;
    // Ids of this run's own, so that a second run is not all duplicates.
    let run = std::time::UNIX_EPOCH.elapsed()?.as_millis();
    for n in 0..count {
        let body = serde_json::to_vec(&CreditRequested {
            account: i64::from(n % 10) + 1,
            amount: 1,
        })?;
        let properties = BasicProperties::default()
            .with_message_id(format!("{run}-{n}").into())
            .with_delivery_mode(2);
        for _ in 0..2 {
            channel
                .basic_publish(
                    "",
                    queues.work(),
                    BasicPublishOptions::default(),
                    &body,
                    properties.clone(),
                )
                .await?
                .await?;
        }
    }
    connection.close(200, "published").await?;
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
