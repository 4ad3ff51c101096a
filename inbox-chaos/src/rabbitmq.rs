//! The run's RabbitMQ side: its queues, the publisher, and the consumer process.

use diesel_inbox_lapin::{Queues, message_key};
use futures_util::{StreamExt, TryStreamExt};
use inbox_fixtures::credit::Credit;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection};
use tokio::signal::unix::{SignalKind, signal};

use crate::events::{Direct, Route};
use crate::handlers::{self, Announcing};
use crate::{BoxError, ConsumeArgs, Stage};

async fn connect(url: &str) -> Result<(Connection, Channel), BoxError> {
    let connection = diesel_inbox_lapin::connect(url).await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok((connection, channel))
}

/// The run's three queues.
pub(crate) struct Topology {
    connection: Connection,
    channel: Channel,
    queues: Queues,
}

impl Topology {
    pub(crate) async fn create(url: &str, name: &str) -> Result<Self, BoxError> {
        let (connection, channel) = connect(url).await?;
        // Every kill costs the in-flight deliveries one delivery each; the limit only
        // has to stop a message that kills every consumer it meets.
        let queues = Queues::new(name).with_delivery_limit(1000);
        queues.declare(&channel).await?;
        Ok(Self {
            connection,
            channel,
            queues,
        })
    }

    /// Returns how many copies the broker dropped as duplicates: none, RabbitMQ keeps all.
    pub(crate) async fn publish(&self, messages: &[Credit]) -> Result<u64, BoxError> {
        // Confirmed in windows, as a producer with publisher confirms does.
        for window in messages.chunks(100) {
            let mut confirms = Vec::with_capacity(window.len());
            for credit in window {
                let properties = BasicProperties::default()
                    .with_message_id(credit.message_id.as_str().into())
                    .with_delivery_mode(2);
                confirms.push(
                    self.channel
                        .basic_publish(
                            "",
                            self.queues.work(),
                            BasicPublishOptions::default(),
                            &credit.payload(),
                            properties,
                        )
                        .await?,
                );
            }
            for confirm in confirms {
                if !confirm.await?.is_ack() {
                    return Err("RabbitMQ refused a message".into());
                }
            }
        }
        Ok(0)
    }

    /// Messages ready in the work and retry queues (not those a consumer holds).
    pub(crate) async fn ready(&self) -> Result<u64, BoxError> {
        let retrying = self.queues.waiting_retries(&self.connection).await?;
        Ok(self.count(self.queues.work()).await? + retrying)
    }

    pub(crate) async fn dead_letters(&self) -> Result<u64, BoxError> {
        self.count(self.queues.dead_letter()).await
    }

    async fn count(&self, queue: &str) -> Result<u64, BoxError> {
        let options = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let queue = self
            .channel
            .queue_declare(queue, options, FieldTable::default())
            .await?;
        Ok(queue.message_count().into())
    }

    pub(crate) async fn delete(self) -> Result<(), BoxError> {
        self.queues.delete(&self.channel).await?;
        self.connection.close(200, "done").await?;
        Ok(())
    }
}

/// One consumer process: consumes until SIGTERM, then lets its handlers finish.
pub(crate) async fn consume(args: ConsumeArgs) -> Result<(), BoxError> {
    let (connection, channel) = connect(&args.endpoints.amqp_url).await?;
    let announcing = match (&args.events, args.stage) {
        (Some(events), Stage::Credit) => Some(announcing(&connection, &args, events).await?),
        _ => None,
    };
    let context = handlers::Context::new(&args, announcing)?;
    channel
        .basic_qos(args.concurrency, BasicQosOptions::default())
        .await?;
    let queues = Queues::new(&args.name);
    let deliveries = channel
        .basic_consume(
            queues.work(),
            "",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut terminate = signal(SignalKind::terminate())?;
    deliveries
        .take_until(async move { terminate.recv().await })
        .try_for_each_concurrent(usize::from(args.concurrency), |delivery| {
            let (context, channel, queues) = (&context, &channel, &queues);
            async move {
                let key = message_key(&delivery)
                    .map(str::to_owned)
                    .map_err(|missing| missing.to_string());
                let (disposition, label) = handlers::handle(context, key, &delivery.data).await;
                let label = match queues.settle(channel, &delivery, &disposition).await {
                    Ok(_) => label,
                    Err(_) => "unsettled",
                };
                handlers::report(label, delivery.redelivered);
                Ok(())
            }
        })
        .await?;
    channel.close(200, "shutting down").await?;
    connection.close(200, "shutting down").await?;
    Ok(())
}

/// Service A's events go to the events' work queue through the default exchange; the
/// naive variant publishes them on a channel of its own, in confirm mode.
async fn announcing(
    connection: &Connection,
    args: &ConsumeArgs,
    events: &str,
) -> Result<Announcing, BoxError> {
    let route = Route {
        destination: String::new(),
        routing_key: Queues::new(events).work().to_owned(),
    };
    let direct = if args.handler.publishes_directly() {
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Some(Direct::Rabbitmq(channel))
    } else {
        None
    };
    Ok(Announcing { route, direct })
}
