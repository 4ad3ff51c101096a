//! Kafka glue for [diesel-inbox](https://docs.rs/diesel-inbox), through
//! [rskafka](https://docs.rs/rskafka) (pure Rust): the key of a record, and a publisher
//! for the outbox. What all the
//! broker glue shares is in diesel-inbox's
//! [brokers guide](https://docs.rs/diesel-inbox/latest/diesel_inbox/guide/brokers/index.html).
//!
//! ```toml
//! [dependencies]
//! diesel-inbox = { version = "0.1", features = ["postgres"] }
//! diesel-inbox-kafka = "0.1"
//! ```
//!
//! Kafka does not redeliver one message: after a crash or a rebalance the consumer
//! re-reads the partition from its last committed offset, and every record after it
//! comes again. So the order is: run the handler (its transaction commits the marker
//! and the effects), **then** commit the offset. Committing the offset first would lose
//! the record if the consumer died before the database commit; committing it after is at
//! least once, and the inbox turns the re-read into `Duplicate`.
//!
//! # The key
//!
//! The key is a header the producer sets (an event id), which stays the same when the
//! producer sends the record again after a lost acknowledgement, or when a record is
//! copied to another topic. Without one, (topic, partition, offset, timestamp) names the
//! record: stable across re-reads, but a producer's retry is a new offset, and so a new
//! key. The timestamp, stored with the record, tells apart two records at one offset of
//! a topic deleted and created again, whose offsets start again at 0 (without it, a new
//! record was acknowledged as a duplicate of the old topic's). The timestamp alone is no
//! key: two records can share one. [`message_key`] picks the key of an rskafka record,
//! [`record_key`] that of any client's:
//!
//! ```
//! use std::collections::BTreeMap;
//! use diesel_inbox_kafka::{RecordKey, record_key};
//!
//! let mut headers = BTreeMap::new();
//! let created = 1_765_000_000_000; // the record's timestamp, in milliseconds
//! let key = record_key("event-id", "credits", 0, 42, created, &headers)?;
//! assert!(matches!(key, RecordKey::Position { offset: 42, .. }));
//! headers.insert("event-id".to_owned(), b"e-1".to_vec());
//! let key = record_key("event-id", "credits", 0, 42, created, &headers)?;
//! assert_eq!(key, RecordKey::Header("e-1"));
//! # Ok::<(), diesel_inbox::MissingKey>(())
//! ```
//!
//! # Publishing the outbox
//!
//! [`OutboxPublisher`] publishes diesel-inbox's outbox through its `Relay`: each message
//! a record of its destination topic with `acks=all`, its id in the [`ID_HEADER`] header
//! that [`message_key`] reads on the receiving side, its routing key (else its ordering
//! key) as the record key. The ordering key (else the record key) picks the partition
//! as Kafka's default partitioner does, so one ordering key's messages are in one
//! partition in commit order, whatever their routing keys. It is
//! reported sent only once the broker has answered. A missing topic or a
//! record the broker refuses as too large is parked for an operator.
//!
//! # A complete consumer
//!
//! The repository's `brokers/kafka/examples/kafka.rs` is a consumer that commits its
//! offset after each handler:
//!
//! ```sh
//! DATABASE_URL=postgres://… KAFKA_BROKERS=127.0.0.1:9092 cargo run -p diesel-inbox-kafka --example kafka
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]

mod outbox;

use std::collections::BTreeMap;

use diesel_inbox::{InboxKey, InvalidKey, MissingKey};

pub use outbox::{ID_HEADER, OutboxPublisher};

/// The header a [`dead_letter`] copy carries its reason in.
pub const REASON_HEADER: &str = "x-inbox-reason";
/// The headers a [`dead_letter`] copy of a record without an id header carries its
/// original's place and time in: its topic, partition, offset and timestamp (in
/// milliseconds), from which [`record_key`] keys the copy as its original.
pub const ORIGINAL_TOPIC_HEADER: &str = "x-inbox-original-topic";
/// See [`ORIGINAL_TOPIC_HEADER`].
pub const ORIGINAL_PARTITION_HEADER: &str = "x-inbox-original-partition";
/// See [`ORIGINAL_TOPIC_HEADER`].
pub const ORIGINAL_OFFSET_HEADER: &str = "x-inbox-original-offset";
/// See [`ORIGINAL_TOPIC_HEADER`].
pub const ORIGINAL_TIMESTAMP_HEADER: &str = "x-inbox-original-timestamp";

/// The inbox key of a Kafka record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RecordKey<'a> {
    /// The producer's id header, stored as it is.
    Header(&'a str),
    /// No id header: the record's place and time, stored as the tuple (topic,
    /// partition, (offset, timestamp)).
    Position {
        /// The topic.
        topic: &'a str,
        /// The partition.
        partition: i32,
        /// The record's offset in the partition.
        offset: i64,
        /// The record's timestamp, in milliseconds since the Unix epoch.
        timestamp_millis: i64,
    },
}

impl InboxKey for RecordKey<'_> {
    fn write_key(&self, out: &mut String) -> Result<(), InvalidKey> {
        match *self {
            Self::Header(id) => id.write_key(out),
            Self::Position {
                topic,
                partition,
                offset,
                timestamp_millis,
            } => (topic, partition, (offset, timestamp_millis)).write_key(out),
        }
    }
}

/// The key of the record at `offset` in `topic`/`partition`, with `timestamp_millis`
/// (its timestamp) and `headers`: the `id_header` where the record has it, else its
/// position and time.
///
/// A record without the id header that a [`dead_letter`] copy made is keyed by its
/// original's place and time (the `ORIGINAL_*` headers), so that a copy sent back from
/// the dead letters is its original's message, not a new one: a claim-mode body then
/// makes its call again under the original's idempotency key.
///
/// A header that is present but empty or not UTF-8 is [`MissingKey`] rather than a
/// fallback to the position, which would let the producer's retry through as new.
pub fn record_key<'a>(
    id_header: &'static str,
    topic: &'a str,
    partition: i32,
    offset: i64,
    timestamp_millis: i64,
    headers: &'a BTreeMap<String, Vec<u8>>,
) -> Result<RecordKey<'a>, MissingKey> {
    match headers.get(id_header) {
        None => Ok(original_position(headers).unwrap_or(RecordKey::Position {
            topic,
            partition,
            offset,
            timestamp_millis,
        })),
        Some(value) => match std::str::from_utf8(value) {
            Ok(id) if !id.is_empty() => Ok(RecordKey::Header(id)),
            _ => Err(MissingKey::new(id_header)),
        },
    }
}

/// The original's place and time that a [`dead_letter`] copy carries, where it has all
/// four headers.
fn original_position(headers: &BTreeMap<String, Vec<u8>>) -> Option<RecordKey<'_>> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|value| std::str::from_utf8(value).ok())
    };
    Some(RecordKey::Position {
        topic: text(ORIGINAL_TOPIC_HEADER)?,
        partition: text(ORIGINAL_PARTITION_HEADER)?.parse().ok()?,
        offset: text(ORIGINAL_OFFSET_HEADER)?.parse().ok()?,
        timestamp_millis: text(ORIGINAL_TIMESTAMP_HEADER)?.parse().ok()?,
    })
}

/// The copy of `record`, read from `topic`/`partition`, to produce to a dead-letter
/// topic: its key, value, headers and timestamp, with `reason` in [`REASON_HEADER`]. A
/// record without `id_header` also gets its place and time (the `ORIGINAL_*` headers),
/// unless it is itself such a copy, so that [`message_key`] keys the copy, and a copy
/// of it sent back to be processed, as the original.
pub fn dead_letter(
    id_header: &'static str,
    topic: &str,
    partition: i32,
    record: &rskafka::record::RecordAndOffset,
    reason: &str,
) -> rskafka::record::Record {
    let mut copy = record.record.clone();
    copy.headers
        .insert(REASON_HEADER.to_owned(), reason.as_bytes().to_vec());
    let keyed_by_place = !copy.headers.contains_key(id_header);
    if keyed_by_place && original_position(&copy.headers).is_none() {
        let place = [
            (ORIGINAL_TOPIC_HEADER, topic.to_owned()),
            (ORIGINAL_PARTITION_HEADER, partition.to_string()),
            (ORIGINAL_OFFSET_HEADER, record.offset.to_string()),
            (
                ORIGINAL_TIMESTAMP_HEADER,
                record.record.timestamp.timestamp_millis().to_string(),
            ),
        ];
        for (name, value) in place {
            copy.headers.insert(name.to_owned(), value.into_bytes());
        }
    }
    copy
}

/// The key of an rskafka record read from `topic`/`partition`.
pub fn message_key<'a>(
    id_header: &'static str,
    topic: &'a str,
    partition: i32,
    record: &'a rskafka::record::RecordAndOffset,
) -> Result<RecordKey<'a>, MissingKey> {
    record_key(
        id_header,
        topic,
        partition,
        record.offset,
        record.record.timestamp.timestamp_millis(),
        &record.record.headers,
    )
}

#[cfg(test)]
mod tests {
    use rskafka::record::{Record, RecordAndOffset};

    use super::*;

    /// A dead letter of a record without an id, read from the dead-letter topic, and
    /// sent back from there, is keyed as its original; one of a record with an id keeps
    /// the id.
    #[test]
    fn a_dead_letter_is_keyed_as_its_original() {
        let record = |headers: BTreeMap<String, Vec<u8>>, millis, offset| RecordAndOffset {
            record: Record {
                key: None,
                value: Some(b"payload".to_vec()),
                headers,
                timestamp: rskafka::chrono::DateTime::from_timestamp_millis(millis).unwrap(),
            },
            offset,
        };
        let original = record(BTreeMap::new(), 1_765_000_000_000, 42);
        let key = message_key("event-id", "credits", 3, &original).unwrap();
        let copy = dead_letter("event-id", "credits", 3, &original, "refused");
        assert_eq!(copy.headers[REASON_HEADER], b"refused");
        let read = record(copy.headers, 1_765_000_000_500, 7);
        assert_eq!(message_key("event-id", "credits.dead", 0, &read), Ok(key));
        let again = dead_letter("event-id", "credits.dead", 0, &read, "still refused");
        let sent_back = record(again.headers, 1_765_000_001_000, 99);
        assert_eq!(message_key("event-id", "credits", 1, &sent_back), Ok(key));

        let with_id = BTreeMap::from([("event-id".to_owned(), b"e-1".to_vec())]);
        let copy = dead_letter("event-id", "credits", 3, &record(with_id, 0, 5), "no");
        assert!(!copy.headers.contains_key(ORIGINAL_OFFSET_HEADER));
        let read = record(copy.headers, 0, 8);
        assert_eq!(
            message_key("event-id", "credits.dead", 0, &read),
            Ok(RecordKey::Header("e-1"))
        );
    }

    #[test]
    fn the_header_wins_and_the_position_is_the_fallback() {
        let mut headers = BTreeMap::new();
        let created = 1_765_000_000_000;
        let position = record_key("event-id", "credits", 3, 42, created, &headers).unwrap();
        let encoded = position.encode().unwrap();
        assert!(encoded.starts_with("7:credits1:3"), "{encoded}");
        // A topic made again: the same offset, at another time, is another record.
        let again = record_key("event-id", "credits", 3, 42, created + 1, &headers).unwrap();
        assert_ne!(again.encode().unwrap(), encoded);
        headers.insert("event-id".to_owned(), b"e-1".to_vec());
        let header = record_key("event-id", "credits", 3, 42, created, &headers).unwrap();
        assert_eq!(header.encode().unwrap(), "e-1");
        headers.insert("event-id".to_owned(), vec![0xff]);
        let error = record_key("event-id", "credits", 3, 42, created, &headers).unwrap_err();
        assert_eq!(error.field(), "event-id");
    }
}
