//! A work queue with its retry and dead-letter queues: declaring them, and settling a
//! delivery through them.

use std::time::Duration;

use diesel_inbox::{Disposition, Retention};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicNackOptions, BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection};

use crate::ladder::{retry_tier, retry_tiers};
use crate::{REASON_HEADER, RETRIES_HEADER, retries};

/// Why a copy was not confirmed, when the broker refused it (a nack).
const REFUSED: &str = "refused by the broker";

/// Copies a retry queue refuses before the settle gives up: a queue being created by
/// several consumers at once refuses the first few.
const RETRY_QUEUE_REFUSALS: u32 = 5;

/// A work queue with its retry queues and dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queues {
    work: String,
    dead_letter: String,
    retry_delay: Duration,
    max_retries: u32,
    delivery_limit: u32,
}

/// What [`Queues::settle`] did with a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settled {
    /// Acked.
    Acked,
    /// Sent to a retry queue, to come back after `after`; `retry` counts from 1.
    Retried {
        /// The how-manyth retry this is.
        retry: u32,
        /// When it comes back to the work queue: the asked delay rounded up to the
        /// retry queue's.
        after: Duration,
    },
    /// Sent to the dead-letter queue with this reason.
    DeadLettered {
        /// Why, as stored in the `x-inbox-reason` header.
        reason: String,
    },
}

/// Why a delivery could not be settled. The delivery is then neither acked nor lost:
/// RabbitMQ redelivers it once the channel closes.
#[derive(Debug)]
#[non_exhaustive]
pub enum SettleError {
    /// The channel or connection failed.
    Broker(lapin::Error),
    /// The broker did not confirm the copy sent to `queue`: it refused it (nack), could
    /// not route it (the queue does not exist), or the channel is not in confirm mode
    /// (`confirm_select`).
    NotConfirmed {
        /// The retry or dead-letter queue.
        queue: String,
        /// Which of the three it was.
        why: &'static str,
    },
}

impl std::fmt::Display for SettleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Broker(error) => write!(f, "settling the delivery failed: {error}"),
            Self::NotConfirmed { queue, why } => write!(
                f,
                "the copy sent to `{queue}` was not confirmed ({why}); the delivery was not acked"
            ),
        }
    }
}

impl std::error::Error for SettleError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Broker(error) => Some(error),
            Self::NotConfirmed { .. } => None,
        }
    }
}

impl From<lapin::Error> for SettleError {
    fn from(error: lapin::Error) -> Self {
        Self::Broker(error)
    }
}

impl Queues {
    /// The work queue `work`, with retry queues `<work>.retry.<ms>ms` and
    /// `<work>.dead-letter`; a retry waits 1 s, at most 10 retries, and the work queue
    /// delivers a message at most 20 times.
    pub fn new(work: impl Into<String>) -> Self {
        let work = work.into();
        Self {
            dead_letter: format!("{work}.dead-letter"),
            work,
            retry_delay: Duration::from_secs(1),
            max_retries: 10,
            delivery_limit: 20,
        }
    }

    /// The delay of a retry when the disposition gives none.
    pub fn with_retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    /// How many retries a message gets before it is dead-lettered instead.
    pub fn with_max_retries(mut self, max_retries: u32) -> Self {
        self.max_retries = max_retries;
        self
    }

    /// The work queue's `x-delivery-limit`: a message delivered this often without being
    /// settled (its consumers crashed or lost their connection each time) is dead-lettered.
    /// Takes effect when the queue is first declared.
    pub fn with_delivery_limit(mut self, limit: u32) -> Self {
        self.delivery_limit = limit;
        self
    }

    /// The [`Retention`] these queues need, from their own settings and the server's
    /// `consumer_timeout` (30 minutes by default), the wait before RabbitMQ takes an
    /// unacked delivery back. Every trip through a retry queue starts a fresh delivery
    /// count, so a message gets up to the delivery limit's deliveries before each of its
    /// retries and after the last; before each retry it waits in a retry queue, at most
    /// the retry queue of `longest_retry` (the longest `Retry { after }` your handlers
    /// return, a claim-mode handler's lease among them). Add the work queue's
    /// `x-message-ttl` and a margin for resubmitted dead letters with
    /// [`Retention::with_message_ttl`] and [`Retention::with_resubmit_margin`].
    pub fn retention(&self, consumer_timeout: Duration, longest_retry: Duration) -> Retention {
        let trips = self.max_retries.saturating_add(1);
        let longest_wait = retry_tier(longest_retry.max(self.retry_delay));
        Retention::new(consumer_timeout, self.delivery_limit.saturating_mul(trips))
            .with_retry_waits(longest_wait.saturating_mul(self.max_retries))
    }

    /// The work queue's name.
    pub fn work(&self) -> &str {
        &self.work
    }

    /// The retry queue a retry after `after` waits in: the next delay up on the ladder.
    pub fn retry_queue(&self, after: Duration) -> String {
        self.retry_queue_of(retry_tier(after))
    }

    /// Every retry queue a retry may wait in, shortest delay first (most exist only once
    /// a retry has needed them).
    pub fn retry_queues(&self) -> impl Iterator<Item = String> + '_ {
        retry_tiers().map(|tier| self.retry_queue_of(tier))
    }

    fn retry_queue_of(&self, tier: Duration) -> String {
        format!("{}.retry.{}ms", self.work, tier.as_millis())
    }

    /// The dead-letter queue's name.
    pub fn dead_letter(&self) -> &str {
        &self.dead_letter
    }

    /// Declares the work queue, the dead-letter queue and the retry queue of the default
    /// retry delay, durable quorum queues (idempotent; safe from every instance).
    ///
    /// The work queue dead-letters, at least once, to the dead-letter queue, which catches
    /// messages over the delivery limit; each retry queue dead-letters, at least once, its
    /// expired messages back to the work queue.
    pub async fn declare(&self, channel: &Channel) -> Result<(), lapin::Error> {
        let options = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        let mut work = dead_lettering_to(&self.dead_letter);
        work.insert(
            "x-delivery-limit".into(),
            AMQPValue::LongLongInt(self.delivery_limit.into()),
        );
        channel.queue_declare(&self.work, options, work).await?;
        channel
            .queue_declare(&self.dead_letter, options, quorum())
            .await?;
        self.declare_retry_queue(channel, retry_tier(self.retry_delay))
            .await
    }

    /// Declares the retry queue of `tier`, one of the ladder's delays.
    async fn declare_retry_queue(
        &self,
        channel: &Channel,
        tier: Duration,
    ) -> Result<(), lapin::Error> {
        let options = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        let mut retry = dead_lettering_to(&self.work);
        let ttl = u32::try_from(tier.as_millis()).expect("the ladder's top fits in u32 ms");
        retry.insert("x-message-ttl".into(), AMQPValue::LongUInt(ttl));
        channel
            .queue_declare(&self.retry_queue_of(tier), options, retry)
            .await?;
        Ok(())
    }

    /// Messages waiting in the retry queues to come back to the work queue. Opens a
    /// channel per retry queue that does not exist (RabbitMQ closes the channel that asks
    /// about one), so call it to watch a run, not per delivery.
    pub async fn waiting_retries(&self, connection: &Connection) -> Result<u64, lapin::Error> {
        let asking = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let mut waiting = 0;
        let mut channel = connection.create_channel().await?;
        for queue in self.retry_queues() {
            match channel
                .queue_declare(&queue, asking, FieldTable::default())
                .await
            {
                Ok(queue) => waiting += u64::from(queue.message_count()),
                Err(_not_found) => channel = connection.create_channel().await?,
            }
        }
        let _ = channel.close(200, "counted").await;
        Ok(waiting)
    }

    /// Deletes the work queue, the dead-letter queue and every retry queue, with whatever
    /// they hold (and the single `<work>.retry` of earlier releases).
    pub async fn delete(&self, channel: &Channel) -> Result<(), lapin::Error> {
        let retries = self.retry_queues().chain([format!("{}.retry", self.work)]);
        for queue in [self.work.clone(), self.dead_letter.clone()]
            .into_iter()
            .chain(retries)
        {
            channel
                .queue_delete(&queue, QueueDeleteOptions::default())
                .await?;
        }
        Ok(())
    }

    /// Carries out `disposition` on `delivery`, which arrived on `channel`. The channel
    /// must be in confirm mode (`confirm_select`) for retries and dead letters.
    ///
    /// A retry beyond [`with_max_retries`](Self::with_max_retries) is dead-lettered.
    ///
    /// # Errors
    ///
    /// When the copy for a retry or a dead letter is not stored (the broker refused it, a
    /// queue is full, the channel failed), the delivery is handed back to the work queue
    /// with a nack and requeue where the channel still allows, so that it is delivered
    /// again at once rather than held unacked until the channel closes; a closed channel
    /// returns it by itself. Either way nothing is lost, and the error says why.
    pub async fn settle(
        &self,
        channel: &Channel,
        delivery: &Delivery,
        disposition: &Disposition,
    ) -> Result<Settled, SettleError> {
        let settled = match self.store_copy(channel, delivery, disposition).await {
            Ok(settled) => settled,
            Err(error) => {
                let requeue = BasicNackOptions {
                    requeue: true,
                    ..BasicNackOptions::default()
                };
                // On a closed channel the nack fails too, and the broker requeues anyway.
                let _requeued = delivery.acker.nack(requeue).await;
                return Err(error);
            }
        };
        delivery.acker.ack(BasicAckOptions::default()).await?;
        Ok(settled)
    }

    /// The copy `disposition` calls for, stored and confirmed: none for `Ack`, one in a
    /// retry queue or in the dead-letter queue otherwise.
    async fn store_copy(
        &self,
        channel: &Channel,
        delivery: &Delivery,
        disposition: &Disposition,
    ) -> Result<Settled, SettleError> {
        Ok(match disposition {
            Disposition::Ack => Settled::Acked,
            Disposition::Retry { after, reason } => {
                self.send_to_retry(channel, delivery, *after, reason)
                    .await?
            }
            Disposition::DeadLetter { reason } => {
                self.send_to_dead_letter(channel, delivery, reason).await?;
                Settled::DeadLettered {
                    reason: reason.clone(),
                }
            }
            // A disposition newer than this crate: sent back, never acked unhandled.
            other => {
                let reason = format!("settled as {other:?}, which this crate does not know");
                self.send_to_retry(channel, delivery, None, &reason).await?
            }
        })
    }

    /// A copy in the retry queue of `after` (the default delay when `None`), or in the
    /// dead-letter queue past the retry limit, with why this delivery failed.
    async fn send_to_retry(
        &self,
        channel: &Channel,
        delivery: &Delivery,
        after: Option<Duration>,
        failed: &str,
    ) -> Result<Settled, SettleError> {
        let retry = retries(delivery) + 1;
        if retry > self.max_retries {
            let reason = format!(
                "still failing with a retryable error after {} retries: {failed}",
                self.max_retries
            );
            self.send_to_dead_letter(channel, delivery, &reason).await?;
            return Ok(Settled::DeadLettered { reason });
        }
        let tier = retry_tier(after.unwrap_or(self.retry_delay));
        let mut headers = headers_of(delivery);
        headers.insert(RETRIES_HEADER.into(), AMQPValue::LongLongInt(retry.into()));
        // The queue's TTL alone decides: a producer's shorter `expiration` would return
        // the copy early.
        let properties = copied_properties(&delivery.properties).with_headers(headers);
        self.declare_retry_queue(channel, tier).await?;
        let queue = self.retry_queue_of(tier);
        // A quorum queue that consumers declared at the same instant refuses copies until
        // it is up; a refused copy was not stored, so sending it again cannot make two.
        let mut refusals = 0;
        loop {
            match self
                .publish_confirmed(channel, &queue, delivery, properties.clone())
                .await
            {
                Err(SettleError::NotConfirmed { why: REFUSED, .. })
                    if refusals < RETRY_QUEUE_REFUSALS =>
                {
                    refusals += 1;
                    tokio::time::sleep(Duration::from_millis(50) * refusals).await;
                }
                published => break published?,
            }
        }
        Ok(Settled::Retried { retry, after: tier })
    }

    async fn send_to_dead_letter(
        &self,
        channel: &Channel,
        delivery: &Delivery,
        reason: &str,
    ) -> Result<(), SettleError> {
        let mut headers = headers_of(delivery);
        headers.insert(
            REASON_HEADER.into(),
            AMQPValue::LongString(LongString::from(reason)),
        );
        let properties = copied_properties(&delivery.properties).with_headers(headers);
        self.publish_confirmed(channel, &self.dead_letter, delivery, properties)
            .await
    }

    async fn publish_confirmed(
        &self,
        channel: &Channel,
        queue: &str,
        delivery: &Delivery,
        properties: BasicProperties,
    ) -> Result<(), SettleError> {
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let confirmation = channel
            .basic_publish("", queue, options, &delivery.data, properties)
            .await?
            .await?;
        let why = match confirmation {
            Confirmation::Ack(None) => return Ok(()),
            Confirmation::Ack(Some(_)) => "returned as unroutable: does the queue exist?",
            Confirmation::Nack(_) => REFUSED,
            Confirmation::NotRequested => "the channel is not in confirm mode",
        };
        Err(SettleError::NotConfirmed {
            queue: queue.to_owned(),
            why,
        })
    }
}

fn quorum() -> FieldTable {
    let mut arguments = FieldTable::default();
    arguments.insert("x-queue-type".into(), long_string("quorum"));
    arguments
}

fn dead_lettering_to(queue: &str) -> FieldTable {
    let mut arguments = quorum();
    arguments.insert("x-dead-letter-exchange".into(), long_string(""));
    arguments.insert("x-dead-letter-routing-key".into(), long_string(queue));
    // At-least-once dead-lettering (RabbitMQ 3.10) needs publishers refused, not old
    // messages dropped, when the queue is full.
    arguments.insert(
        "x-dead-letter-strategy".into(),
        long_string("at-least-once"),
    );
    arguments.insert("x-overflow".into(), long_string("reject-publish"));
    arguments
}

fn long_string(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// Headers the broker acts on that a copy must not carry over: the dead-lettering history,
/// which names the work queue for a message that came back from the dead-letter queue (a
/// shovel, "move messages"), and would make RabbitMQ take the copy's return from the
/// retry queue for a dead-letter cycle and drop it; and sender-selected distribution,
/// which would send the copy to the queues named again.
const NOT_COPIED_HEADERS: &[&str] = &[
    "x-death",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-first-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
    "x-last-death-exchange",
    "CC",
    "BCC",
];

/// The delivery's headers, for its copy: less those of [`NOT_COPIED_HEADERS`].
fn headers_of(delivery: &Delivery) -> FieldTable {
    let mut headers = FieldTable::default();
    if let Some(original) = delivery.properties.headers() {
        for (name, value) in original.inner() {
            if !NOT_COPIED_HEADERS.contains(&name.as_str()) {
                headers.insert(name.clone(), value.clone());
            }
        }
    }
    headers
}

/// The delivery's properties for its copy: less its `expiration`, so that a dead letter is
/// kept until a person reads it, whatever TTL the producer gave the message; and less its
/// `user_id`, which RabbitMQ checks against the publishing connection's user, and which
/// would close the channel for a message another user published.
fn copied_properties(properties: &BasicProperties) -> BasicProperties {
    let mut copy = BasicProperties::default();
    macro_rules! copy {
        ($($get:ident => $set:ident),* $(,)?) => {$(
            if let Some(value) = properties.$get() {
                copy = copy.$set(value.clone());
            }
        )*};
    }
    copy!(
        content_type => with_content_type,
        content_encoding => with_content_encoding,
        headers => with_headers,
        delivery_mode => with_delivery_mode,
        priority => with_priority,
        correlation_id => with_correlation_id,
        reply_to => with_reply_to,
        message_id => with_message_id,
        timestamp => with_timestamp,
        kind => with_type,
        app_id => with_app_id,
        cluster_id => with_cluster_id,
    );
    copy
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RabbitMQ closes the channel of a publish whose `user_id` is not the connection's
    /// user: a copy of a message another user published could never be stored.
    #[test]
    fn a_copy_leaves_out_the_expiration_and_the_user_id() {
        let original = BasicProperties::default()
            .with_expiration("1000".into())
            .with_user_id("producer".into())
            .with_message_id("m-1".into());
        let copy = copied_properties(&original);
        assert_eq!(copy.expiration(), &None);
        assert_eq!(copy.user_id(), &None);
        assert_eq!(copy.message_id(), original.message_id());
    }

    #[test]
    fn retention_counts_every_trip_through_the_retry_queues() {
        let queues = Queues::new("credits")
            .with_max_retries(2)
            .with_delivery_limit(3);
        let minute = Duration::from_secs(60);
        let retention = queues.retention(30 * minute, Duration::from_millis(900));
        // 3 deliveries on each of 3 trips, and 2 waits of the 1 s retry queue.
        assert_eq!(
            retention.window(),
            9 * 30 * minute + 2 * Duration::from_secs(1)
        );
    }
}
