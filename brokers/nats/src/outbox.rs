//! The outbox's publisher for NATS JetStream: each message published with its id as
//! `Nats-Msg-Id`, and reported sent only once the stream has acknowledged it.

use std::error::Error as StdError;

use async_nats::HeaderMap;
use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::{self, ErrorCode};
use diesel_inbox::outbox::{Outgoing, PublishError, Publisher};

/// Publishes the outbox's messages to JetStream, for a
/// [`Relay`](https://docs.rs/diesel-inbox/latest/diesel_inbox/outbox/struct.Relay.html).
///
/// The subject is the message's destination, followed by its routing key after a dot
/// when it has one (`accounts` and `credited` give `accounts.credited`). Its id goes in
/// `Nats-Msg-Id`, which [`message_key`](crate::message_key) reads on the receiving side,
/// and by which the stream itself drops a copy published again within its duplicate
/// window (two minutes by default): a relay that publishes again after a crash is
/// absorbed twice over. Headers go as they are.
///
/// A publish is reported done only once the stream has acknowledged it. A message that
/// can never go out is unpublishable, and the relay parks it: no stream takes its
/// subject, it is larger than the server's `max_payload` or the stream's largest
/// message, or it has no subject or headers NATS cannot carry. Anything else (no ack in
/// time, a lost connection, which async-nats reconnects) is retried.
#[derive(Debug, Clone)]
pub struct OutboxPublisher {
    jetstream: jetstream::Context,
}

impl OutboxPublisher {
    /// A publisher through `jetstream`, whose time-out bounds the wait for each ack.
    pub fn new(jetstream: jetstream::Context) -> Self {
        Self { jetstream }
    }
}

impl Publisher for OutboxPublisher {
    async fn publish(&self, message: &Outgoing) -> Result<(), PublishError> {
        let subject = subject(message)?;
        let headers = headers(message)?;
        let max_payload = self.jetstream.client().server_info().max_payload;
        // The server closes the connection on a larger message: never send one.
        if message.payload().len() > max_payload {
            return Err(PublishError::unpublishable(format!(
                "a payload of {} bytes is larger than the server's max_payload of {max_payload}",
                message.payload().len()
            )));
        }
        let payload = message.payload().to_vec().into();
        let acked = match self
            .jetstream
            .publish_with_headers(subject, headers, payload)
            .await
        {
            Ok(ack) => ack.await,
            Err(error) => Err(error),
        };
        match acked {
            Ok(_) => Ok(()),
            Err(error) if never_taken(&error) => Err(PublishError::unpublishable(error)),
            Err(error) => Err(PublishError::retryable(error)),
        }
    }
}

/// Whether the stream can never take the message: none listens on its subject, or it is
/// larger than the stream allows.
fn never_taken(error: &jetstream::context::PublishError) -> bool {
    if error.kind() == PublishErrorKind::StreamNotFound {
        return true;
    }
    let refused = error
        .source()
        .and_then(|source| source.downcast_ref::<jetstream::Error>())
        .map(jetstream::Error::error_code);
    matches!(
        refused,
        Some(ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM | ErrorCode::STREAM_HEADER_EXCEEDS_MAXIMUM)
    )
}

fn subject(message: &Outgoing) -> Result<String, PublishError> {
    let subject = match (message.destination(), message.routing_key()) {
        (destination, "") => destination.to_owned(),
        ("", routing_key) => routing_key.to_owned(),
        (destination, routing_key) => format!("{destination}.{routing_key}"),
    };
    let valid = !subject.is_empty()
        && !subject.contains(|c: char| c.is_whitespace() || c == '*' || c == '>')
        && !subject.split('.').any(str::is_empty);
    if valid {
        Ok(subject)
    } else {
        Err(PublishError::unpublishable(format!(
            "`{subject}` is not a subject to publish to: tokens separated by dots, without \
             spaces or wildcards"
        )))
    }
}

fn headers(message: &Outgoing) -> Result<HeaderMap, PublishError> {
    if message.message_id().contains(['\r', '\n']) {
        return Err(PublishError::unpublishable(
            "the id holds a line break, which a Nats-Msg-Id header cannot",
        ));
    }
    let mut headers = HeaderMap::new();
    headers.insert(NATS_MESSAGE_ID, message.message_id());
    for (name, value) in message.headers() {
        // A header line is `name: value` and ends at a line break.
        let name_fits = name
            .bytes()
            .all(|byte| byte.is_ascii_graphic() && byte != b':');
        if !name_fits || value.contains(['\r', '\n']) {
            return Err(PublishError::unpublishable(format!(
                "the header `{name}` cannot be carried by NATS: names are printable ASCII \
                 without `:`, and values hold no line breaks"
            )));
        }
        headers.append(name.as_str(), value.as_str());
    }
    Ok(headers)
}
