//! An outgoing message: what a body writes, checked before anything is written, and its
//! headers' encoding in the `headers` column.

use crate::body_scope::with_delivery;
use crate::error::InvalidOutboxMessage;

/// Longest message id, in bytes: what the receiver's inbox stores as a key.
pub const ID_MAX_BYTES: usize = crate::schema::MESSAGE_ID_MAX_BYTES;

/// Longest destination, routing key and ordering key, in bytes: an AMQP exchange name
/// and routing key are at most 255 bytes, as are the columns.
pub const NAME_MAX_BYTES: usize = 255;

/// Longest header name or value, in bytes: the `headers` column stores each with a
/// 32-bit length.
const HEADER_MAX_BYTES: usize = u32::MAX as usize;

/// Derives the default message ids: a fixed namespace, so that the same (consumer,
/// key, index) gives the same id in every process and every version.
const ID_NAMESPACE: uuid::Uuid = uuid::uuid!("0b4f7a53-2f1c-4d0a-8e61-3c5a9d27b8e4");

/// A message for the outbox: published by a relay once the transaction that enqueued it
/// commits, and never if it rolls back.
///
/// ```
/// # use inbox_runtime as diesel_inbox;
/// use diesel_inbox::outbox::OutboxMessage;
///
/// let credited = OutboxMessage::new("accounts", br#"{"account":7,"amount":100}"#.to_vec())
///     .routing_key("account.credited")
///     .header("content-type", "application/json")
///     .ordering_key("account-7");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    pub(crate) destination: String,
    pub(crate) routing_key: String,
    pub(crate) payload: Vec<u8>,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) id: Option<String>,
    pub(crate) ordering_key: Option<String>,
}

impl OutboxMessage {
    /// A message to `destination` (a RabbitMQ exchange, a NATS subject, a Kafka topic:
    /// the publisher says what it means) carrying `payload`. It may be empty: RabbitMQ's
    /// default exchange routes to the queue named by the routing key.
    pub fn new(destination: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        Self {
            destination: destination.into(),
            routing_key: String::new(),
            payload: payload.into(),
            headers: Vec::new(),
            id: None,
            ordering_key: None,
        }
    }

    /// The routing key within the destination (RabbitMQ's routing key, Kafka's record
    /// key); empty unless given.
    #[must_use]
    pub fn routing_key(mut self, routing_key: impl Into<String>) -> Self {
        self.routing_key = routing_key.into();
        self
    }

    /// Adds a header. Headers keep the order they are added in.
    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The message's id, which receivers deduplicate by. By default, inside an
    /// `#[idempotent]` body, a UUID derived from the consumer, the message's key and how
    /// many messages the body enqueued before this one: the same on every delivery of
    /// the message, so that a claim-mode body run again enqueues the same ids. Outside
    /// a body (and in a task the body spawned), a random UUID, fixed once written.
    #[must_use]
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Publishes this message after every earlier-committed message with the same
    /// ordering key has been published. Messages without one, or with different ones,
    /// may go out in any order.
    #[must_use]
    pub fn ordering_key(mut self, ordering_key: impl Into<String>) -> Self {
        self.ordering_key = Some(ordering_key.into());
        self
    }

    /// Checks every field against its column, so that nothing is cut short or refused
    /// by the database halfway through the body's writes.
    pub(crate) fn check(&self) -> Result<(), InvalidOutboxMessage> {
        // Empty names RabbitMQ's default exchange.
        check_text("destination", &self.destination, NAME_MAX_BYTES, true)?;
        check_text("routing_key", &self.routing_key, NAME_MAX_BYTES, true)?;
        if let Some(id) = &self.id {
            check_text("id", id, ID_MAX_BYTES, false)?;
        }
        if let Some(ordering_key) = &self.ordering_key {
            check_text("ordering_key", ordering_key, NAME_MAX_BYTES, false)?;
        }
        for (name, value) in &self.headers {
            check_text("header name", name, HEADER_MAX_BYTES, false)?;
            check_text("header value", value, HEADER_MAX_BYTES, true)?;
        }
        Ok(())
    }
}

fn check_text(
    field: &'static str,
    text: &str,
    max: usize,
    may_be_empty: bool,
) -> Result<(), InvalidOutboxMessage> {
    if text.is_empty() && !may_be_empty {
        return Err(InvalidOutboxMessage::Empty { field });
    }
    if text.len() > max {
        return Err(InvalidOutboxMessage::TooLong {
            field,
            len: text.len(),
            max,
        });
    }
    match text.find('\0') {
        Some(at) => Err(InvalidOutboxMessage::Nul { field, at }),
        None => Ok(()),
    }
}

/// The id of the next message the body being polled enqueues without one of its own,
/// and counts it; a random one outside every body.
pub(crate) fn next_default_id() -> String {
    with_delivery(|delivery| match delivery {
        Some(delivery) => {
            let index = delivery.enqueued;
            delivery.enqueued += 1;
            let consumer = delivery.consumer.as_bytes();
            let key = delivery.message_id.as_bytes();
            let mut name = Vec::with_capacity(consumer.len() + key.len() + 20);
            // Length-prefixed, so that no two (consumer, key, index) give the same name.
            name.extend_from_slice(&(consumer.len() as u64).to_be_bytes());
            name.extend_from_slice(consumer);
            name.extend_from_slice(&(key.len() as u64).to_be_bytes());
            name.extend_from_slice(key);
            name.extend_from_slice(&index.to_be_bytes());
            uuid::Uuid::new_v5(&ID_NAMESPACE, &name)
        }
        None => uuid::Uuid::new_v4(),
    })
    .to_string()
}

/// The headers as the `headers` column stores them: each name and value as a
/// big-endian `u32` length and its UTF-8 bytes.
pub(crate) fn encode_headers(headers: &[(String, String)]) -> Vec<u8> {
    let mut encoded = Vec::new();
    for text in headers.iter().flat_map(|(name, value)| [name, value]) {
        let len = u32::try_from(text.len()).expect("checked against HEADER_MAX_BYTES");
        encoded.extend_from_slice(&len.to_be_bytes());
        encoded.extend_from_slice(text.as_bytes());
    }
    encoded
}

/// Reads what [`encode_headers`] wrote; `None` if the column holds something else.
pub(crate) fn decode_headers(mut encoded: &[u8]) -> Option<Vec<(String, String)>> {
    let next_text = |encoded: &mut &[u8]| -> Option<String> {
        let (len, rest) = encoded.split_first_chunk::<4>()?;
        let len = usize::try_from(u32::from_be_bytes(*len)).ok()?;
        let (text, rest) = (rest.get(..len)?, rest.get(len..)?);
        *encoded = rest;
        String::from_utf8(text.to_vec()).ok()
    };
    let mut headers = Vec::new();
    while !encoded.is_empty() {
        let name = next_text(&mut encoded)?;
        let value = next_text(&mut encoded)?;
        headers.push((name, value));
    }
    Some(headers)
}

#[cfg(test)]
mod tests {
    use super::{OutboxMessage, decode_headers, encode_headers};
    use crate::error::InvalidOutboxMessage;

    #[test]
    fn headers_round_trip_in_order() {
        let headers = vec![
            ("b".to_owned(), String::new()),
            ("a".to_owned(), "é\0x".to_owned()),
            ("b".to_owned(), "second".to_owned()),
        ];
        assert_eq!(decode_headers(&encode_headers(&headers)), Some(headers));
        assert_eq!(decode_headers(&[0, 0, 0, 5, b'a']), None);
    }

    #[test]
    fn fields_that_do_not_fit_are_refused() {
        let message = || OutboxMessage::new("accounts", Vec::new());
        assert_eq!(message().check(), Ok(()));
        assert_eq!(OutboxMessage::new("", Vec::new()).check(), Ok(()));
        assert_eq!(
            message().header("", "v").check(),
            Err(InvalidOutboxMessage::Empty {
                field: "header name"
            })
        );
        assert_eq!(
            message().routing_key("r".repeat(256)).check(),
            Err(InvalidOutboxMessage::TooLong {
                field: "routing_key",
                len: 256,
                max: 255
            })
        );
        assert_eq!(
            message().id("a\0b").check(),
            Err(InvalidOutboxMessage::Nul { field: "id", at: 1 })
        );
        assert_eq!(
            message().ordering_key("").check(),
            Err(InvalidOutboxMessage::Empty {
                field: "ordering_key"
            })
        );
        assert_eq!(
            message().header("", "v").check(),
            Err(InvalidOutboxMessage::Empty {
                field: "header name"
            })
        );
    }
}
