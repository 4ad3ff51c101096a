//! NATS JetStream glue for [diesel-inbox](https://docs.rs/diesel-inbox), through
//! [async-nats](https://docs.rs/async-nats): the key of a message, and a
//! [`Disposition`] carried out on it. What all the broker glue shares is in
//! diesel-inbox's
//! [brokers guide](https://docs.rs/diesel-inbox/latest/diesel_inbox/guide/brokers/index.html).
//!
//! ```toml
//! [dependencies]
//! diesel-inbox = { version = "0.1", features = ["postgres"] }
//! diesel-inbox-nats = "0.1"
//! ```
//!
//! ```rust,no_run
//! # use std::time::Duration;
//! # use async_nats::jetstream::Message;
//! # use diesel_async::AsyncPgConnection;
//! # use diesel_inbox::Disposition;
//! # type BoxError = Box<dyn std::error::Error + Send + Sync>;
//! # #[diesel_inbox::idempotent(consumer = "credit-nats", key = key)]
//! # async fn credit(
//! #     conn: &mut AsyncPgConnection,
//! #     key: diesel_inbox_nats::MessageKey<'_>,
//! #     payload: &[u8],
//! # ) -> diesel::QueryResult<()> {
//! #     let _ = payload;
//! #     Ok(())
//! # }
//! # async fn consume(conn: &mut AsyncPgConnection, message: Message) -> Result<(), BoxError> {
//! use diesel_inbox_nats::{Settlement, message_key};
//!
//! let settlement = Settlement::new("credits.dead")
//!     .with_max_deliveries(5)
//!     .with_ack_wait(Duration::from_secs(30)); // the consumer's
//! let disposition = match message_key(&message) {
//!     // `+WPI` every 10 s while the handler runs: never redelivered mid-run.
//!     Ok(key) => Disposition::of(
//!         &settlement
//!             .in_progress(&message, credit(conn, key, &message.payload))
//!             .await,
//!     ),
//!     Err(missing) => Disposition::DeadLetter { reason: missing.to_string() },
//! };
//! settlement.settle(&message, &disposition).await?;
//! # Ok(()) }
//! ```
//!
//! # The key
//!
//! The key is the `Nats-Msg-Id` header, which the producer sets (and JetStream also uses
//! to drop a re-published copy within the stream's duplicate window), falling back to
//! the stream, its sequence number and the time the stream stored the message, which
//! stay the same across redeliveries of one stored message but differ for a message
//! published twice: only a producer-set id makes a producer's retry after a lost
//! acknowledgement the same key. (The time tells apart two messages at one sequence
//! number of a stream deleted and created again: without it, the new one was
//! acknowledged as a duplicate of the old.) The consumer sequence, the delivery count
//! and the reply subject change with every delivery, and the publish timestamp alone
//! can repeat: none of them is a key. A message with neither (not delivered by
//! a JetStream consumer) is [`MissingKey`]: dead-letter it.
//!
//! # Settling
//!
//! [`Settlement::settle`] carries out a disposition:
//!
//! | disposition | what happens |
//! |---|---|
//! | `Ack` | `+ACK` |
//! | `Retry { after }` | `-NAK` with that delay (default 1 s; JetStream redelivers it then). From the [`with_max_deliveries`](Settlement::with_max_deliveries)-th delivery, a dead letter whose reason is the last retry's |
//! | `DeadLetter { reason }` | a copy is published to the dead-letter subject with the reason in the `Inbox-Dead-Letter-Reason` header and acknowledged by the stream that holds it, then `+TERM` |
//!
//! The dead-letter copy is confirmed before the message is terminated: a crash in between
//! publishes it twice (with the same `Nats-Msg-Id`, which a dead-letter stream with a
//! duplicate window drops) and never loses it. A copy no stream stores fails the settle
//! and leaves the message unsettled, for JetStream to redeliver. The copy's `Nats-Msg-Id`
//! names the stored message and the consumer that gave up on it
//! (`<stream>#<sequence>@<published>#<consumer>`), never the producer's id, which is unique only
//! within its own stream: two streams, or two consumers of one, dead-lettering messages
//! with the same producer id into one dead-letter stream would otherwise see the second
//! copy dropped as a duplicate, after terminating its original. The producer's id stays
//! on the copy, in [`ORIGINAL_ID_HEADER`], and [`message_key`] gives the copy its
//! original's key, also when a consumer of the dead letters dead-letters the copy again.
//! The copy keeps the message's headers but JetStream's publish controls
//! (`Nats-Expected-*`, `Nats-Rollup`, `Nats-TTL`), which the dead-letter stream would
//! check or act on: `Nats-Expected-Stream` would refuse every copy, and `Nats-Rollup`
//! purge the dead letters before it.
//!
//! # The wait for an ack
//!
//! JetStream hands a message to another consumer once the consumer's `ack_wait` has
//! passed without an ack, while the first may still be running its handler. Wrap each
//! handler call in [`Settlement::in_progress`], which tells JetStream every third of
//! `ack_wait` that the message is still being worked on. [`Settlement::retention`] turns
//! the consumer's config into the window to keep markers for.
//!
//! # Publishing the outbox
//!
//! [`OutboxPublisher`] publishes diesel-inbox's outbox through its `Relay`: the subject
//! from the message's destination and routing key, its id in `Nats-Msg-Id` (which
//! [`message_key`] reads, and by which the stream drops a copy published again within its
//! duplicate window), reported sent only on the stream's ack. A subject no stream takes
//! or an oversized message is parked for an operator.
//!
//! # A complete consumer
//!
//! The repository's `brokers/nats/examples/nats.rs` is a consumer service to copy: a
//! JetStream pull consumer running 8 handlers at once on a deadpool pool with
//! `max_ack_pending` at the same number, settled through [`Settlement`], key-less and
//! unreadable messages dead-lettered, shutdown on SIGTERM or Ctrl-C (stop pulling, let
//! the running handlers finish and settle, drain the connection), and reconnection with
//! exponential backoff. `PUBLISH=200` first publishes 200 credits, each twice:
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test NATS_URL=127.0.0.1:4222 \
//! PUBLISH=200 cargo run -p diesel-inbox-nats --example nats
//! ```
//!
//! It creates the `inbox` and `accounts` tables in the database it is given, and the
//! streams `CREDITS` and `CREDITS_DEAD`; `STREAM` renames them.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]

mod outbox;

use std::fmt;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::header::{IntoHeaderName, NATS_MESSAGE_ID};
use async_nats::jetstream::{AckKind, Message};
use diesel_inbox::{Disposition, InboxKey, InvalidKey, MissingKey, Retention};

pub use outbox::OutboxPublisher;

/// The header that carries a dead-lettered message's reason.
pub const REASON_HEADER: &str = "Inbox-Dead-Letter-Reason";
/// The header that carries the stream a dead letter came from.
pub const STREAM_HEADER: &str = "Inbox-Stream";
/// The header that carries a dead letter's sequence number in that stream.
pub const SEQUENCE_HEADER: &str = "Inbox-Stream-Sequence";
/// The header that carries when a dead letter was stored in that stream, in nanoseconds
/// since the Unix epoch.
pub const PUBLISHED_HEADER: &str = "Inbox-Stream-Published";
/// The header that carries the consumer that dead-lettered the message.
pub const CONSUMER_HEADER: &str = "Inbox-Consumer";
/// The header that carries a dead letter's `Nats-Msg-Id` as its producer set it.
pub const ORIGINAL_ID_HEADER: &str = "Inbox-Original-Msg-Id";

/// The inbox key of a JetStream message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MessageKey<'a> {
    /// The producer's `Nats-Msg-Id`, stored as it is.
    MsgId(&'a str),
    /// No `Nats-Msg-Id`: the message's place in its stream and when it was stored
    /// there, stored as the tuple `("nats-stream-sequence", stream, (sequence,
    /// published))`. The time tells apart two messages at one sequence number of a
    /// stream deleted and created again, whose sequences start again at 1.
    StreamSequence {
        /// The stream's name.
        stream: &'a str,
        /// The message's sequence number in the stream.
        sequence: u64,
        /// When the stream stored it, in nanoseconds since the Unix epoch.
        published: i64,
    },
}

impl InboxKey for MessageKey<'_> {
    fn write_key(&self, out: &mut String) -> Result<(), InvalidKey> {
        match *self {
            Self::MsgId(id) => id.write_key(out),
            Self::StreamSequence {
                stream,
                sequence,
                published,
            } => ("nats-stream-sequence", stream, (sequence, published)).write_key(out),
        }
    }
}

impl fmt::Display for MessageKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MsgId(id) => f.write_str(id),
            Self::StreamSequence {
                stream,
                sequence,
                published,
            } => write!(f, "{stream}#{sequence}@{published}"),
        }
    }
}

/// The inbox key of `message`: its `Nats-Msg-Id` header, else its stream sequence and
/// when the stream stored it. A dead-letter copy that [`Settlement::settle`] published
/// has its original's key (from [`ORIGINAL_ID_HEADER`], else [`STREAM_HEADER`],
/// [`SEQUENCE_HEADER`] and [`PUBLISHED_HEADER`]), so that a consumer of the dead letters
/// that sends them back keys them as the originals.
///
/// A message with neither (not delivered by a JetStream consumer) is [`MissingKey`]:
/// dead-letter it.
pub fn message_key(message: &Message) -> Result<MessageKey<'_>, MissingKey> {
    if let Some(id) = header(message, ORIGINAL_ID_HEADER) {
        return Ok(MessageKey::MsgId(id));
    }
    let sequence = header(message, SEQUENCE_HEADER).map(str::parse);
    let published = header(message, PUBLISHED_HEADER).map(str::parse);
    if let (Some(stream), Some(Ok(sequence)), Some(Ok(published))) =
        (header(message, STREAM_HEADER), sequence, published)
    {
        return Ok(MessageKey::StreamSequence {
            stream,
            sequence,
            published,
        });
    }
    if let Some(id) = header(message, NATS_MESSAGE_ID) {
        return Ok(MessageKey::MsgId(id));
    }
    match message.info() {
        Ok(info) => Ok(MessageKey::StreamSequence {
            stream: info.stream,
            sequence: info.stream_sequence,
            published: published_nanos(&info),
        }),
        Err(_) => Err(MissingKey::new(
            "Nats-Msg-Id header, nor the stream sequence of a JetStream delivery",
        )),
    }
}

/// When `info`'s message was stored, in nanoseconds since the Unix epoch, within
/// `i64`'s years (1677 to 2262).
fn published_nanos(info: &async_nats::jetstream::message::Info<'_>) -> i64 {
    let nanos = info.published.unix_timestamp_nanos();
    i64::try_from(nanos).unwrap_or(if nanos < 0 { i64::MIN } else { i64::MAX })
}

/// The value of `message`'s header `name`, unless it is missing or empty.
fn header(message: &Message, name: impl IntoHeaderName) -> Option<&str> {
    message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(name))
        .map(|value| value.as_str())
        .filter(|value| !value.is_empty())
}

/// What [`Settlement::settle`] did with a message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settled {
    /// Acked.
    Acked,
    /// Nakked, to be redelivered after `after`.
    Retried {
        /// When JetStream delivers it again.
        after: Duration,
    },
    /// Published to the dead-letter subject with this reason, then terminated.
    DeadLettered {
        /// Why, as stored in the `Inbox-Dead-Letter-Reason` header.
        reason: String,
    },
}

/// How to settle the messages of one consumer: where dead letters go, how long a retry
/// waits, and after how many deliveries a retry becomes a dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    dead_letter_subject: String,
    retry_delay: Duration,
    max_deliveries: Option<i64>,
    ack_wait: Duration,
}

impl Settlement {
    /// Dead letters go to `dead_letter_subject`, which a stream must capture (publishing
    /// there fails otherwise, and the message is then left unsettled for redelivery); a
    /// retry waits 1 s; retries are not limited; the consumer's `ack_wait` is JetStream's
    /// default, 30 s.
    pub fn new(dead_letter_subject: impl Into<String>) -> Self {
        Self {
            dead_letter_subject: dead_letter_subject.into(),
            retry_delay: Duration::from_secs(1),
            max_deliveries: None,
            ack_wait: Duration::from_secs(30),
        }
    }

    /// The consumer's `ack_wait`, which [`Settlement::in_progress`] keeps a handler
    /// within.
    pub fn with_ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = ack_wait;
        self
    }

    /// Runs `handling`, the handler's call for `message`, telling JetStream every third
    /// of `ack_wait` that the message is still in progress (`+WPI`), so that a handler
    /// that runs longer than `ack_wait` is not redelivered, to another consumer, while it
    /// runs. Wrap every handler call in it: how long one takes is up to the database and
    /// whatever the handler waits for.
    pub async fn in_progress<F: std::future::Future>(
        &self,
        message: &Message,
        handling: F,
    ) -> F::Output {
        let mut handling = std::pin::pin!(handling);
        let every = self.ack_wait / 3;
        loop {
            tokio::select! {
                output = &mut handling => return output,
                () = tokio::time::sleep(every) => {
                    // A lost `+WPI` only risks the redelivery it is there to spare.
                    if let Err(error) = message.ack_with(AckKind::Progress).await {
                        tracing::warn!(
                            target: "diesel_inbox",
                            error = %error,
                            "could not tell JetStream the message is still in progress"
                        );
                    }
                }
            }
        }
    }

    /// The delay of a retry when the disposition gives none.
    pub fn with_retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    /// A retry on a message's `max_deliveries`-th delivery dead-letters it instead. Keep
    /// it at or below the consumer's `max_deliver`, past which JetStream stops delivering
    /// the message and only publishes an advisory.
    pub fn with_max_deliveries(mut self, max_deliveries: i64) -> Self {
        self.max_deliveries = Some(max_deliveries);
        self
    }

    /// The [`Retention`] a JetStream consumer with `config` needs, settled by this
    /// settlement: a message gets up to the consumer's `max_deliver` deliveries, fewer
    /// where [`with_max_deliveries`](Self::with_max_deliveries) dead-letters it first,
    /// each redelivered after `ack_wait`, its `backoff` or the delay of a `Retry`,
    /// whichever is longest; `longest_retry` is the longest `Retry { after }` your
    /// handlers return (a claim-mode handler's lease among them). `None` when neither
    /// limits the deliveries: no window is then safe. Add the stream's `max_age` and a
    /// margin for resubmitted dead letters with [`Retention::with_message_ttl`] and
    /// [`Retention::with_resubmit_margin`].
    pub fn retention(
        &self,
        config: &async_nats::jetstream::consumer::pull::Config,
        longest_retry: Duration,
    ) -> Option<Retention> {
        let limits = [Some(config.max_deliver), self.max_deliveries];
        let deliveries = limits
            .into_iter()
            .flatten()
            .filter(|limit| *limit > 0)
            .min()?;
        let longest_backoff = config.backoff.iter().max().copied().unwrap_or_default();
        let between = config
            .ack_wait
            .max(longest_backoff)
            .max(longest_retry.max(self.retry_delay));
        Some(Retention::new(
            between,
            u32::try_from(deliveries).unwrap_or(u32::MAX),
        ))
    }

    /// The subject dead letters are published to.
    pub fn dead_letter_subject(&self) -> &str {
        &self.dead_letter_subject
    }

    /// Carries out `disposition` on `message`.
    ///
    /// An error leaves the message unsettled: JetStream redelivers it after `ack_wait`.
    pub async fn settle(
        &self,
        message: &Message,
        disposition: &Disposition,
    ) -> Result<Settled, async_nats::Error> {
        match disposition {
            Disposition::Ack => {
                message.ack().await?;
                Ok(Settled::Acked)
            }
            Disposition::Retry { after, reason } => self.retry(message, *after, reason).await,
            Disposition::DeadLetter { reason } => {
                self.dead_letter(message, reason).await?;
                Ok(Settled::DeadLettered {
                    reason: reason.clone(),
                })
            }
            // A disposition newer than this crate: sent back, never acked unhandled.
            other => {
                let reason = format!("settled as {other:?}, which this crate does not know");
                self.retry(message, None, &reason).await
            }
        }
    }

    /// A nak with `after` (the default delay when `None`), or a dead letter from the
    /// `max_deliveries`-th delivery, with why this delivery failed.
    async fn retry(
        &self,
        message: &Message,
        after: Option<Duration>,
        failed: &str,
    ) -> Result<Settled, async_nats::Error> {
        let delivered = message.info().map(|info| info.delivered).unwrap_or(1);
        if let Some(max) = self.max_deliveries.filter(|max| delivered >= *max) {
            let reason =
                format!("still failing with a retryable error after {max} deliveries: {failed}");
            self.dead_letter(message, &reason).await?;
            return Ok(Settled::DeadLettered { reason });
        }
        let after = after.unwrap_or(self.retry_delay).min(LONGEST_RETRY_DELAY);
        message.ack_with(AckKind::Nak(Some(after))).await?;
        Ok(Settled::Retried { after })
    }

    async fn dead_letter(&self, message: &Message, reason: &str) -> Result<(), async_nats::Error> {
        let mut headers = copied_headers(message);
        // Header values cannot hold line breaks.
        let reason: String = reason
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        headers.insert(REASON_HEADER, reason.as_str());
        if let Ok(info) = message.info() {
            let (stream, sequence) = (info.stream, info.stream_sequence);
            let published = published_nanos(&info);
            // A dead letter dead-lettered again keeps its original's key (see
            // `message_key`), not the copy's.
            let a_copy =
                headers.get(ORIGINAL_ID_HEADER).is_some() || headers.get(SEQUENCE_HEADER).is_some();
            if !a_copy {
                headers.insert(STREAM_HEADER, stream);
                headers.insert(SEQUENCE_HEADER, sequence.to_string().as_str());
                headers.insert(PUBLISHED_HEADER, published.to_string().as_str());
                if let Some(original) = headers.get(NATS_MESSAGE_ID).cloned() {
                    headers.insert(ORIGINAL_ID_HEADER, original);
                }
            }
            headers.insert(CONSUMER_HEADER, info.consumer);
            // One id per stored message and consumer: the dead-letter stream drops only
            // the copy that a crash before `+TERM` makes this consumer publish again
            // (the time, for a stream made again, whose sequences start again at 1).
            let copy = format!("{stream}#{sequence}@{published}#{}", info.consumer);
            headers.insert(NATS_MESSAGE_ID, copy.as_str());
        }
        publish_confirmed(message, &self.dead_letter_subject, headers).await?;
        message.ack_with(AckKind::Term).await
    }
}

/// Headers with which the producer told JetStream how to store the message: on the dead
/// letter they would be checked against the dead-letter stream (`Nats-Expected-Stream`
/// refused every copy, so the message could never be dead-lettered) or act on it
/// (`Nats-Rollup` purged the dead letters before it).
const PUBLISH_CONTROL_HEADERS: &[&str] = &[
    "Nats-Expected-Stream",
    "Nats-Expected-Last-Msg-Id",
    "Nats-Expected-Last-Sequence",
    "Nats-Expected-Last-Subject-Sequence",
    "Nats-Rollup",
    "Nats-TTL",
];

/// The message's headers, for its dead letter: less those of [`PUBLISH_CONTROL_HEADERS`].
fn copied_headers(message: &Message) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, values) in message.headers.iter().flat_map(HeaderMap::iter) {
        let text: &str = name.as_ref();
        if PUBLISH_CONTROL_HEADERS
            .iter()
            .any(|control| control.eq_ignore_ascii_case(text))
        {
            continue;
        }
        for value in values {
            headers.append(name.clone(), value.clone());
        }
    }
    headers
}

/// The longest delay a retry waits: a century, as good as forever. JetStream takes the
/// delay in nanoseconds as an `i64`: a longer one (from about 292 years) overflowed, and
/// the server redelivered the message at once.
const LONGEST_RETRY_DELAY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

async fn publish_confirmed(
    message: &Message,
    subject: &str,
    headers: HeaderMap,
) -> Result<(), async_nats::Error> {
    message
        .context
        .publish_with_headers(subject.to_owned(), headers, message.payload.clone())
        .await?
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use async_nats::jetstream::consumer::pull;

    use super::*;

    #[test]
    fn retention_takes_the_fewest_deliveries_and_the_longest_wait() {
        let second = Duration::from_secs(1);
        let config = pull::Config {
            ack_wait: 30 * second,
            max_deliver: 10,
            backoff: vec![5 * second, 60 * second],
            ..Default::default()
        };
        let settlement = Settlement::new("dead").with_max_deliveries(4);
        let retention = settlement.retention(&config, 20 * second).expect("limited");
        assert_eq!(retention.window(), 4 * 60 * second);
        let slower = settlement.retention(&config, 90 * second).expect("limited");
        assert_eq!(slower.window(), 4 * 90 * second);

        let unlimited = pull::Config {
            max_deliver: -1,
            ..config
        };
        assert_eq!(Settlement::new("dead").retention(&unlimited, second), None);
        let by_the_settlement = Settlement::new("dead").with_max_deliveries(3);
        let limited = by_the_settlement
            .retention(&unlimited, second)
            .expect("limited");
        assert_eq!(limited.window(), 3 * 60 * second);
    }
}
