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
        None => Ok(RecordKey::Position {
            topic,
            partition,
            offset,
            timestamp_millis,
        }),
        Some(value) => match std::str::from_utf8(value) {
            Ok(id) if !id.is_empty() => Ok(RecordKey::Header(id)),
            _ => Err(MissingKey::new(id_header)),
        },
    }
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
    use super::*;

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
