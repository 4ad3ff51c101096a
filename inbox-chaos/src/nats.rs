//! The run's JetStream side: its streams, the publisher, and the consumer process.

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::stream::RetentionPolicy;
use async_nats::jetstream::{self, Context, stream};
use diesel_inbox::InboxKey;
use diesel_inbox_nats::{Settlement, message_key};
use futures_util::{StreamExt, TryStreamExt};
use inbox_fixtures::credit::Credit;
use tokio::signal::unix::{SignalKind, signal};

use crate::events::{Direct, Route};
use crate::handlers::{self, Announcing};
use crate::{BoxError, ConsumeArgs, Stage};

/// How long a killed consumer's messages wait before JetStream delivers them again.
const ACK_WAIT: Duration = Duration::from_secs(2);
const CONSUMER: &str = "credit";
/// The shortest duplicate window JetStream accepts.
const DUPLICATE_WINDOW: Duration = Duration::from_millis(100);

/// The subject of the run's stream `name`: the credits', or the chain's events'.
fn subject(name: &str) -> String {
    format!("{name}.messages")
}

fn dead_letter_subject(name: &str) -> String {
    format!("{name}.dead-letter")
}

/// The run's work stream (a work queue: acked messages leave it), its dead-letter
/// stream, and the durable pull consumer the consumer processes share.
pub(crate) struct Topology {
    jetstream: Context,
    name: String,
}

impl Topology {
    pub(crate) async fn create(url: &str, name: &str) -> Result<Self, BoxError> {
        let jetstream = jetstream::new(async_nats::connect(url).await?);
        let work = jetstream
            .create_stream(stream::Config {
                name: name.to_owned(),
                subjects: vec![subject(name)],
                retention: RetentionPolicy::WorkQueue,
                // JetStream drops a copy published again within this window. Kept at its
                // shortest, so that the run's duplicates reach the consumers, as any copy
                // published after the window (2 minutes by default) does.
                duplicate_window: DUPLICATE_WINDOW,
                ..Default::default()
            })
            .await?;
        jetstream
            .create_stream(stream::Config {
                name: format!("{name}_dead"),
                subjects: vec![dead_letter_subject(name)],
                ..Default::default()
            })
            .await?;
        work.create_consumer(pull::Config {
            durable_name: Some(CONSUMER.into()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: ACK_WAIT,
            ..Default::default()
        })
        .await?;
        Ok(Self {
            jetstream,
            name: name.to_owned(),
        })
    }

    /// Publishes chunk after chunk, each past the duplicate window of the one before,
    /// which holds the originals of its duplicates.
    /// Returns how many copies JetStream dropped as duplicates all the same (it forgets
    /// ids some time after the window, not at once).
    pub(crate) async fn publish(&self, chunks: &[Vec<Credit>]) -> Result<u64, BoxError> {
        let mut dropped = 0;
        for chunk in chunks {
            let mut acks = Vec::with_capacity(chunk.len());
            for credit in chunk {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(
                    async_nats::header::NATS_MESSAGE_ID,
                    credit.message_id.as_str(),
                );
                acks.push(
                    self.jetstream
                        .publish_with_headers(subject(&self.name), headers, credit.payload().into())
                        .await?,
                );
            }
            for ack in acks {
                dropped += u64::from(ack.await?.duplicate);
            }
            tokio::time::sleep(DUPLICATE_WINDOW + Duration::from_millis(20)).await;
        }
        Ok(dropped)
    }

    /// Messages not yet delivered, or delivered and not yet acknowledged.
    pub(crate) async fn ready(&self) -> Result<u64, BoxError> {
        let mut consumer: PullConsumer = self
            .jetstream
            .get_stream(&self.name)
            .await?
            .get_consumer(CONSUMER)
            .await?;
        let info = consumer.info().await?;
        Ok(info.num_pending + info.num_ack_pending as u64)
    }

    /// Messages left in the work stream.
    pub(crate) async fn stored(&self) -> Result<u64, BoxError> {
        let mut stream = self.jetstream.get_stream(&self.name).await?;
        Ok(stream.info().await?.state.messages)
    }

    pub(crate) async fn dead_letters(&self) -> Result<u64, BoxError> {
        let mut stream = self
            .jetstream
            .get_stream(format!("{}_dead", self.name))
            .await?;
        Ok(stream.info().await?.state.messages)
    }

    pub(crate) async fn delete(self) -> Result<(), BoxError> {
        self.jetstream.delete_stream(&self.name).await?;
        self.jetstream
            .delete_stream(format!("{}_dead", self.name))
            .await?;
        Ok(())
    }
}

/// One consumer process: pulls until SIGTERM, then lets its handlers finish.
pub(crate) async fn consume(args: ConsumeArgs) -> Result<(), BoxError> {
    let client = async_nats::connect(&args.endpoints.nats_url).await?;
    // Service A's events go to the events stream's subject; the naive variant publishes
    // them itself.
    let announcing = match (&args.events, args.stage) {
        (Some(events), Stage::Credit) => Some(Announcing {
            route: Route {
                destination: subject(events),
                routing_key: String::new(),
            },
            direct: args
                .handler
                .publishes_directly()
                .then(|| Direct::Nats(jetstream::new(client.clone()))),
        }),
        _ => None,
    };
    let context = handlers::Context::new(&args, announcing)?;
    let consumer: PullConsumer = jetstream::new(client.clone())
        .get_stream(&args.name)
        .await?
        .get_consumer(CONSUMER)
        .await?;
    let settlement = Settlement::new(dead_letter_subject(&args.name));
    let messages = consumer
        .stream()
        .max_messages_per_batch(args.concurrency.into())
        .messages()
        .await?;
    let mut terminate = signal(SignalKind::terminate())?;
    messages
        .take_until(async move { terminate.recv().await })
        .try_for_each_concurrent(usize::from(args.concurrency), |message| {
            let (context, settlement) = (&context, &settlement);
            async move {
                let key = message_key(&message)
                    .map_err(|missing| missing.to_string())
                    .and_then(|key| key.encode().map_err(|invalid| invalid.to_string()));
                let redelivered = message
                    .info()
                    .map(|info| info.delivered > 1)
                    .unwrap_or(false);
                let (disposition, label) = handlers::handle(context, key, &message.payload).await;
                let label = match settlement.settle(&message, &disposition).await {
                    Ok(_) => label,
                    Err(_) => "unsettled",
                };
                handlers::report(label, redelivered);
                Ok(())
            }
        })
        .await?;
    client.drain().await?;
    Ok(())
}
