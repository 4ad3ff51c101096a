//! The outbox's publisher for RabbitMQ: each message published with `mandatory` on a
//! channel in confirm mode, and reported sent only once the broker has confirmed it.

use std::fmt;

use diesel_inbox::outbox::{Outgoing, PublishError, Publisher};
use lapin::message::BasicReturnMessage;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ErrorKind};
use tokio::sync::Mutex;

/// RabbitMQ's largest message by default (`max_message_size`, 16 MiB since 4.0).
const DEFAULT_MAX_MESSAGE_SIZE: usize = 16 * 1024 * 1024;

/// Publishes the outbox's messages to RabbitMQ, for a
/// [`Relay`](https://docs.rs/diesel-inbox/latest/diesel_inbox/outbox/struct.Relay.html).
///
/// A message's destination is the exchange (empty for the default exchange, which
/// routes to the queue named by the routing key), its routing key the routing key, its
/// id the `message_id` property that [`message_key`](crate::message_key) reads on the
/// receiving side, and its headers string headers. Messages are persistent
/// (`delivery_mode` 2) and `mandatory`.
///
/// A publish is reported done only once the broker has confirmed it. A message that can
/// never go out is unpublishable, and the relay parks it: its exchange does not exist,
/// no queue is bound for its routing key (returned as unroutable), or its payload is
/// larger than the broker takes ([`OutboxPublisher::with_max_message_size`]). Anything
/// else (a negative acknowledgement, a lost connection) is retried. The publisher
/// connects on its first publish, and connects again after the broker closes the
/// connection.
///
/// Each channel carries one publish at a time, the relay's publishes spread over as
/// many channels as it runs at once: the broker acknowledges several publishes of one
/// channel together, and lapin then cannot tell which of them a returned (unroutable)
/// message was, nor does an error that closes a channel fail other messages than its
/// own.
pub struct OutboxPublisher {
    url: String,
    max_message_size: usize,
    link: Mutex<Link>,
}

/// The connection, and its channels in confirm mode that no publish is using.
#[derive(Default)]
struct Link {
    connection: Option<Connection>,
    idle: Vec<Channel>,
}

impl OutboxPublisher {
    /// A publisher to the broker at `url` (`amqp://…`), which it connects to on the
    /// current tokio runtime when it first publishes.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            link: Mutex::new(Link::default()),
        }
    }

    /// Parks, without publishing, a message whose payload is larger than `bytes`: set
    /// it to the broker's `max_message_size` (16 MiB by default).
    #[must_use]
    pub fn with_max_message_size(self, bytes: usize) -> Self {
        Self {
            max_message_size: bytes,
            ..self
        }
    }

    /// A channel in confirm mode for one publish: an idle one, or a new one, on a new
    /// connection if the broker closed the last.
    async fn channel(&self) -> Result<Channel, lapin::Error> {
        let mut link = self.link.lock().await;
        while let Some(channel) = link.idle.pop() {
            if channel.status().connected() {
                return Ok(channel);
            }
        }
        let connection = match link.connection.take() {
            Some(connection) if connection.status().connected() => connection,
            _ => crate::connect(&self.url).await?,
        };
        let opened = connection.create_channel().await;
        link.connection = Some(connection);
        let channel = opened?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(channel)
    }

    async fn publish_confirmed(&self, message: &Outgoing) -> Result<Confirmation, lapin::Error> {
        let channel = self.channel().await?;
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let confirmed = async {
            channel
                .basic_publish(
                    message.destination(),
                    message.routing_key(),
                    options,
                    message.payload(),
                    properties(message),
                )
                .await?
                .await
        }
        .await;
        // A channel the broker closed is dropped; one a time-out abandoned mid-publish is
        // dropped with the future, never handed to another publish.
        if channel.status().connected() {
            self.link.lock().await.idle.push(channel);
        }
        confirmed
    }
}

impl fmt::Debug for OutboxPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL may hold a password.
        f.debug_struct("OutboxPublisher")
            .field("max_message_size", &self.max_message_size)
            .finish_non_exhaustive()
    }
}

impl Publisher for OutboxPublisher {
    async fn publish(&self, message: &Outgoing) -> Result<(), PublishError> {
        if message.payload().len() > self.max_message_size {
            return Err(PublishError::unpublishable(format!(
                "a payload of {} bytes is larger than the broker's {} bytes",
                message.payload().len(),
                self.max_message_size
            )));
        }
        if message.message_id().len() > 255 {
            return Err(PublishError::unpublishable(format!(
                "the AMQP message_id property is at most 255 bytes; this id has {}",
                message.message_id().len()
            )));
        }
        if let Some((name, _)) = message.headers().iter().find(|(name, _)| name.len() > 255) {
            return Err(PublishError::unpublishable(format!(
                "AMQP header names are at most 255 bytes; `{name}` has {}",
                name.len()
            )));
        }
        match self.publish_confirmed(message).await {
            Ok(Confirmation::Ack(None)) => Ok(()),
            Ok(Confirmation::Ack(Some(returned)))
                if returned_is(&returned, message.message_id()) =>
            {
                Err(PublishError::unpublishable(format!(
                    "returned as unroutable: no queue is bound to exchange `{}` for routing key `{}`",
                    message.destination(),
                    message.routing_key()
                )))
            }
            // Another message's return: this one's fate is unknown, so it goes again.
            Ok(Confirmation::Ack(Some(_))) => Err(PublishError::retryable(
                "the broker returned another message with this one's confirmation",
            )),
            Ok(Confirmation::Nack(_)) => {
                Err(PublishError::retryable("the broker refused it (nack)"))
            }
            Ok(Confirmation::NotRequested) => Err(PublishError::retryable(
                "the channel is not in confirm mode",
            )),
            Err(error) if names_a_missing_exchange(&error, message.destination()) => {
                Err(PublishError::unpublishable(error))
            }
            Err(error) => Err(PublishError::retryable(error)),
        }
    }
}

/// Whether `error` closed the channel because `exchange` does not exist: the broker
/// names the exchange, so an error of the channel's that is not this message's (the
/// channel closed for another reason) is retried.
fn names_a_missing_exchange(error: &lapin::Error, exchange: &str) -> bool {
    match error.kind() {
        ErrorKind::ProtocolError(amqp) => {
            matches!(amqp.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
                && amqp
                    .get_message()
                    .as_str()
                    .contains(&format!("no exchange '{exchange}'"))
        }
        _ => false,
    }
}

/// Whether `returned` is the message with id `message_id`.
fn returned_is(returned: &BasicReturnMessage, message_id: &str) -> bool {
    returned
        .properties
        .message_id()
        .as_ref()
        .is_some_and(|id| id.as_str() == message_id)
}

fn properties(message: &Outgoing) -> BasicProperties {
    let mut headers = FieldTable::default();
    for (name, value) in message.headers() {
        headers.insert(
            ShortString::from(name.as_str()),
            AMQPValue::LongString(LongString::from(value.as_str())),
        );
    }
    BasicProperties::default()
        .with_message_id(ShortString::from(message.message_id()))
        .with_delivery_mode(2)
        .with_headers(headers)
}
