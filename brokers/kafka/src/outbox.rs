//! The outbox's publisher for Kafka: each message produced to its topic with
//! `acks=all`, to the partition its key picks, and reported sent only once the
//! partition's in-sync replicas have it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use diesel_inbox::outbox::{Outgoing, PublishError, Publisher};
use rskafka::chrono::DateTime;
use rskafka::client::Client;
use rskafka::client::error::{Error as KafkaError, ProtocolError};
use rskafka::client::partition::{Compression, PartitionClient, UnknownTopicHandling};
use rskafka::record::Record;

/// The header an [`OutboxPublisher`] puts a message's id in, unless
/// [`OutboxPublisher::with_id_header`] names another: pass the same name to
/// [`message_key`](crate::message_key) on the receiving side.
pub const ID_HEADER: &str = "message-id";

/// How long a topic's partition count is trusted before it is read again, as Kafka's
/// own producers do (`metadata.max.age.ms`).
const METADATA_MAX_AGE: Duration = Duration::from_secs(300);

/// Publishes the outbox's messages to Kafka, for a
/// [`Relay`](https://docs.rs/diesel-inbox/latest/diesel_inbox/outbox/struct.Relay.html).
///
/// A message's destination is the topic, and its payload the record's value. Its id goes
/// in the [`ID_HEADER`] header, its headers as they are. The record's key is the routing
/// key, or the ordering key when there is no routing key, or none. The partition is
/// picked as Kafka's default partitioner does (murmur2, modulo the partition count) from
/// the ordering key when there is one, else from the record's key: one ordering key's
/// messages land in one partition whatever their routing keys (an account's credits and
/// debits), and a keyed record without one lands where a Java producer would put it.
/// The relay publishes one ordering key's messages one after the other, so they are in
/// that partition in the outbox's commit order; messages without an ordering key are
/// published several at once, in no set order. A record with neither key is placed by
/// its id, so a copy published again lands beside the first.
///
/// Each record is produced in a request of its own with `acks=all`, and the publish is
/// reported done only once the broker has answered. A message that can never go out is
/// unpublishable, and the relay parks it: its topic does not exist (create topics before
/// publishing to them), its name is no topic name, a header is named like the id header
/// or given twice, or the broker refuses the record as too large or invalid. Anything
/// else (a lost connection, a leader election, a time-out) is retried: build the client
/// without a backoff deadline, and the relay's publish time-out bounds each attempt.
pub struct OutboxPublisher {
    client: Arc<Client>,
    id_header: &'static str,
    routes: Mutex<Routes>,
    /// Held while the topics' metadata is read, so that a round of publishes to a topic
    /// not yet seen reads it once.
    reading_metadata: tokio::sync::Mutex<()>,
}

/// What the publisher knows of the cluster.
#[derive(Default)]
struct Routes {
    /// Each topic's partition count, and when it was read.
    partitions: HashMap<String, (i32, Instant)>,
    /// A client for each partition published to.
    clients: HashMap<(String, i32), Arc<PartitionClient>>,
}

impl OutboxPublisher {
    /// A publisher through `client`, which may be shared with consumers.
    pub fn new(client: Arc<Client>) -> Self {
        Self {
            client,
            id_header: ID_HEADER,
            routes: Mutex::default(),
            reading_metadata: tokio::sync::Mutex::const_new(()),
        }
    }

    /// Puts each message's id in the header `name` instead of [`ID_HEADER`].
    #[must_use]
    pub fn with_id_header(self, name: &'static str) -> Self {
        Self {
            id_header: name,
            ..self
        }
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The partition count of `topic`, read from the cluster when it is not known or
    /// older than [`METADATA_MAX_AGE`].
    async fn partition_count(&self, topic: &str) -> Result<i32, PublishError> {
        let fresh = |routes: &Routes| {
            routes
                .partitions
                .get(topic)
                .filter(|(_, read)| read.elapsed() < METADATA_MAX_AGE)
                .map(|&(count, _)| count)
        };
        if let Some(count) = fresh(&self.routes()) {
            return Ok(count);
        }
        let _reading = self.reading_metadata.lock().await;
        if let Some(count) = fresh(&self.routes()) {
            return Ok(count);
        }
        let topics = self
            .client
            .list_topics()
            .await
            .map_err(PublishError::retryable)?;
        let read = Instant::now();
        let mut routes = self.routes();
        routes.partitions = topics
            .into_iter()
            .map(|topic| {
                let count = i32::try_from(topic.partitions.len()).unwrap_or(i32::MAX);
                (topic.name, (count, read))
            })
            .collect();
        match routes.partitions.get(topic) {
            Some(&(count, _)) if count > 0 => Ok(count),
            Some(_) => Err(PublishError::retryable(format!(
                "the topic `{topic}` has no partitions yet"
            ))),
            None => Err(PublishError::unpublishable(format!(
                "no topic `{topic}` on the cluster: create it before publishing to it"
            ))),
        }
    }

    async fn partition_client(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<Arc<PartitionClient>, PublishError> {
        let route = (topic.to_owned(), partition);
        if let Some(client) = self.routes().clients.get(&route) {
            return Ok(Arc::clone(client));
        }
        let client = self
            .client
            .partition_client(topic, partition, UnknownTopicHandling::Error)
            .await
            .map_err(|error| self.failed(topic, partition, error))?;
        let mut routes = self.routes();
        Ok(Arc::clone(
            routes
                .clients
                .entry(route)
                .or_insert_with(|| Arc::new(client)),
        ))
    }

    /// The record for `message`, or why it cannot be one.
    fn record(&self, message: &Outgoing) -> Result<Record, PublishError> {
        let mut headers = BTreeMap::new();
        headers.insert(
            self.id_header.to_owned(),
            message.message_id().as_bytes().to_vec(),
        );
        for (name, value) in message.headers() {
            if name == self.id_header {
                return Err(PublishError::unpublishable(format!(
                    "the header `{name}` is where the publisher puts the message's id"
                )));
            }
            // rskafka's record holds one value a name, and keeping either of two would
            // drop the other silently.
            if headers
                .insert(name.clone(), value.as_bytes().to_vec())
                .is_some()
            {
                return Err(PublishError::unpublishable(format!(
                    "the header `{name}` is given more than once, and a record from this \
                     publisher carries one value a name"
                )));
            }
        }
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let timestamp = i64::try_from(since_epoch.as_millis())
            .ok()
            .and_then(DateTime::from_timestamp_millis)
            .unwrap_or_default();
        Ok(Record {
            key: record_key(message).map(|key| key.as_bytes().to_vec()),
            value: Some(message.payload().to_vec()),
            headers,
            timestamp,
        })
    }

    /// The publish error for `error` from `topic`/`partition`; a partition the broker
    /// does not know is read again before the next publish.
    fn failed(&self, topic: &str, partition: i32, error: KafkaError) -> PublishError {
        let KafkaError::ServerError { protocol_error, .. } = &error else {
            return PublishError::retryable(error);
        };
        match protocol_error {
            ProtocolError::MessageTooLarge
            | ProtocolError::RecordListTooLarge
            | ProtocolError::InvalidRecord
            | ProtocolError::InvalidTopicException => PublishError::unpublishable(error),
            ProtocolError::UnknownTopicOrPartition => {
                let mut routes = self.routes();
                routes.partitions.remove(topic);
                routes.clients.remove(&(topic.to_owned(), partition));
                PublishError::retryable(error)
            }
            _ => PublishError::retryable(error),
        }
    }
}

impl Publisher for OutboxPublisher {
    async fn publish(&self, message: &Outgoing) -> Result<(), PublishError> {
        let topic = message.destination();
        check_topic_name(topic)?;
        let record = self.record(message)?;
        let partitions = self.partition_count(topic).await?;
        // One ordering key's messages in one partition; a record with no key at all
        // placed by its id, so that its retries land alike.
        let placed_by = message
            .ordering_key()
            .map(str::as_bytes)
            .or(record.key.as_deref())
            .unwrap_or(message.message_id().as_bytes());
        let partition = partition_for(placed_by, partitions);
        let client = self.partition_client(topic, partition).await?;
        match client
            .produce(vec![record], Compression::NoCompression)
            .await
        {
            Ok(_) => Ok(()),
            Err(error) => Err(self.failed(topic, partition, error)),
        }
    }
}

impl std::fmt::Debug for OutboxPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxPublisher")
            .field("id_header", &self.id_header)
            .finish_non_exhaustive()
    }
}

/// The record key of `message`: its routing key, else its ordering key.
fn record_key(message: &Outgoing) -> Option<&str> {
    match message.routing_key() {
        "" => message.ordering_key(),
        routing_key => Some(routing_key),
    }
}

/// The partition Kafka's default partitioner picks for `key` among `partitions`.
fn partition_for(key: &[u8], partitions: i32) -> i32 {
    let hash = murmur2::murmur2(key, murmur2::KAFKA_SEED) & 0x7fff_ffff;
    // Both are below 2^31, so the remainder is too.
    i32::try_from(hash % partitions.unsigned_abs()).unwrap_or_default()
}

/// Kafka's rule for topic names: 1 to 249 of ASCII letters, digits, `.`, `_` and `-`,
/// and neither `.` nor `..`.
fn check_topic_name(topic: &str) -> Result<(), PublishError> {
    let valid = (1..=249).contains(&topic.len())
        && topic
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'))
        && topic != "."
        && topic != "..";
    if valid {
        Ok(())
    } else {
        Err(PublishError::unpublishable(format!(
            "`{topic}` is not a topic name: 1 to 249 ASCII letters, digits, `.`, `_` or `-`"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_picked_as_kafkas_default_partitioner_does() {
        // Kafka's own murmur2 vectors (`UtilsTest.testMurmur2`), as Java's signed ints.
        let vectors: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (key, java) in vectors {
            let hash = murmur2::murmur2(key, murmur2::KAFKA_SEED);
            assert_eq!(hash.cast_signed(), java, "{key:?}");
            let positive = i64::from(java & 0x7fff_ffff);
            for partitions in [1, 3, 50] {
                let expected = i32::try_from(positive % i64::from(partitions)).unwrap();
                assert_eq!(partition_for(key, partitions), expected);
            }
        }
        assert_eq!(partition_for(b"foobar", 50), 16);
    }

    #[test]
    fn topic_names_follow_kafkas_rule() {
        for valid in ["credits", "a.b_c-D9", &"t".repeat(249)] {
            assert!(check_topic_name(valid).is_ok(), "{valid}");
        }
        for invalid in [
            "",
            ".",
            "..",
            "credits!",
            "a b",
            "crédits",
            &"t".repeat(250),
        ] {
            let error = check_topic_name(invalid).unwrap_err();
            assert!(error.is_unpublishable(), "{invalid}");
        }
    }
}
