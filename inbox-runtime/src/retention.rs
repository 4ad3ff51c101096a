//! How long markers must be kept, from the broker's settings.

use std::time::Duration;

/// The shortest window that [`prune`](crate::prune) may keep markers for: the longest
/// time after a delivery at which the broker may still deliver the same message again.
///
/// The window is the redelivery timeout (a lock, visibility or ack timeout) times the
/// most deliveries a message gets, plus how long a message may wait in the queue before
/// its first delivery (its time-to-live), plus a margin for a message that an operator
/// resubmits from the dead-letter queue. A marker pruned sooner lets such a delivery
/// through as a new message. [The pruning guide](https://docs.rs/diesel-inbox/latest/diesel_inbox/guide/pruning/index.html#how-long-to-keep-markers)
/// works it out for RabbitMQ, NATS JetStream, Kafka, Amazon SQS and Azure Service Bus.
///
/// ```
/// # use inbox_runtime as diesel_inbox;
/// use std::time::Duration;
/// use diesel_inbox::Retention;
///
/// const MINUTE: Duration = Duration::from_secs(60);
/// const DAY: Duration = Duration::from_secs(24 * 60 * 60);
///
/// // Azure Service Bus: a 1-minute lock, 10 deliveries, messages live 14 days, and
/// // operators resubmit dead letters within 7 days.
/// let retention = Retention::new(MINUTE, 10)
///     .with_message_ttl(14 * DAY)
///     .with_resubmit_margin(7 * DAY);
/// assert_eq!(retention.window(), 10 * MINUTE + 21 * DAY);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    redelivery_timeout: Duration,
    max_deliveries: u32,
    message_ttl: Duration,
    retry_waits: Duration,
    resubmit_margin: Duration,
}

impl Retention {
    /// A message delivered up to `max_deliveries` times, each redelivered once
    /// `redelivery_timeout` has passed without an acknowledgement.
    pub const fn new(redelivery_timeout: Duration, max_deliveries: u32) -> Self {
        Self {
            redelivery_timeout,
            max_deliveries,
            message_ttl: Duration::ZERO,
            retry_waits: Duration::ZERO,
            resubmit_margin: Duration::ZERO,
        }
    }

    /// How long a message may wait in the queue before it is delivered.
    pub const fn with_message_ttl(self, ttl: Duration) -> Self {
        Self {
            message_ttl: ttl,
            ..self
        }
    }

    /// How long a message may wait, in all, in retry queues between its deliveries
    /// (RabbitMQ's retry queues, a JetStream nak's delay beyond `AckWait`).
    pub const fn with_retry_waits(self, waits: Duration) -> Self {
        Self {
            retry_waits: waits,
            ..self
        }
    }

    /// How long after its last delivery an operator may resubmit a dead-lettered
    /// message.
    pub const fn with_resubmit_margin(self, margin: Duration) -> Self {
        Self {
            resubmit_margin: margin,
            ..self
        }
    }

    /// The window: `redelivery_timeout × max_deliveries + message_ttl + retry_waits +
    /// resubmit_margin`, saturating instead of overflowing.
    pub const fn window(&self) -> Duration {
        self.redelivery_timeout
            .saturating_mul(self.max_deliveries)
            .saturating_add(self.message_ttl)
            .saturating_add(self.retry_waits)
            .saturating_add(self.resubmit_margin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_term_counts_and_nothing_overflows() {
        let retention = Retention::new(Duration::from_secs(30), 5)
            .with_message_ttl(Duration::from_secs(100))
            .with_retry_waits(Duration::from_secs(10))
            .with_resubmit_margin(Duration::from_secs(1_000));
        assert_eq!(
            retention.window(),
            Duration::from_secs(30 * 5 + 100 + 10 + 1_000)
        );
        assert_eq!(
            Retention::new(Duration::MAX, u32::MAX).window(),
            Duration::MAX
        );
        assert_eq!(
            Retention::new(Duration::from_secs(1), 0).window(),
            Duration::ZERO
        );
    }
}
