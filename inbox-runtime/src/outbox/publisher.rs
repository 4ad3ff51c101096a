//! What a relay publishes through: one trait per broker, and the one error it answers
//! with, which says whether the message can ever go out.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use super::Outgoing;

/// Publishes outbox messages to a broker, and returns once the broker has confirmed
/// each: a RabbitMQ publisher confirm, a JetStream publish ack, Kafka's acks. A relay
/// marks a message sent only after `publish` returns `Ok`.
///
/// The broker crates implement it (`diesel-inbox-lapin`, `diesel-inbox-nats`);
/// implement it yourself for another broker. Set the message's
/// [id](Outgoing::message_id) where the receiver reads its key, so that its inbox drops
/// the copy a relay publishes again after a crash.
///
/// A relay publishes several messages at once, at most one of each ordering key.
pub trait Publisher: Send + Sync + 'static {
    /// Publishes `message`, and waits for the broker's confirmation.
    ///
    /// # Errors
    ///
    /// [`PublishError::retryable`] for a failure that may pass (the broker unreachable,
    /// a negative acknowledgement, a time-out); [`PublishError::unpublishable`] for one
    /// that never will (no such destination, a payload the broker refuses), which parks
    /// the message for an operator.
    fn publish(&self, message: &Outgoing) -> impl Future<Output = Result<(), PublishError>> + Send;
}

/// Why a publish failed, and whether it may succeed later.
#[derive(Debug)]
pub struct PublishError {
    error: Box<dyn StdError + Send + Sync>,
    unpublishable: bool,
    retry_after: Option<Duration>,
}

impl PublishError {
    /// A failure that may pass: the relay publishes the message again after a backoff.
    pub fn retryable(error: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self {
            error: error.into(),
            unpublishable: false,
            retry_after: None,
        }
    }

    /// A failure that never passes: the relay parks the message, with this error as
    /// its reason, until an operator requeues or discards it.
    pub fn unpublishable(error: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self {
            error: error.into(),
            unpublishable: true,
            retry_after: None,
        }
    }

    /// Waits at least `delay` before the next attempt, when the broker says how long
    /// (a rate limit's window).
    #[must_use]
    pub fn retry_after(self, delay: Duration) -> Self {
        Self {
            retry_after: Some(delay),
            ..self
        }
    }

    /// Whether the message is parked rather than retried.
    pub fn is_unpublishable(&self) -> bool {
        self.unpublishable
    }

    /// The least delay before the next attempt that the error asks for.
    pub fn delay(&self) -> Option<Duration> {
        self.retry_after
    }
}

impl fmt::Display for PublishError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl StdError for PublishError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.error.source()
    }
}
