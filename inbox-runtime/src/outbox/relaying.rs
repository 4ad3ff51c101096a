//! What a relay does with the outbox, and what an operator does with its parked
//! messages. Each call commits on its own.

use std::fmt;
use std::time::Duration;

use diesel::QueryResult;
use diesel::result::Error;
use diesel_async::AsyncConnection;

use super::message::decode_headers;
use crate::backend::InboxBackend;
use crate::backend::outbox_statements::{OutboxStatements as _, OutgoingRow};

/// A message in the outbox, as a relay or an operator reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    id: i64,
    message_id: String,
    destination: String,
    routing_key: String,
    ordering_key: Option<String>,
    headers: Vec<(String, String)>,
    payload: Vec<u8>,
    attempts: u32,
    last_error: Option<String>,
}

impl Outgoing {
    /// Its row in the outbox, which [`requeue`] and [`discard`] take.
    pub fn row_id(&self) -> i64 {
        self.id
    }

    /// The id receivers deduplicate it by.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// Where it goes: an exchange, a subject, a topic.
    pub fn destination(&self) -> &str {
        &self.destination
    }

    /// The routing key within the destination; empty if none was given.
    pub fn routing_key(&self) -> &str {
        &self.routing_key
    }

    /// The ordering key it was enqueued with.
    pub fn ordering_key(&self) -> Option<&str> {
        self.ordering_key.as_deref()
    }

    /// Its headers, in the order they were added.
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// Its payload.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// How many times a relay has taken it, this time included.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Why the last attempt failed, or why it was parked.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }
}

impl TryFrom<OutgoingRow> for Outgoing {
    type Error = Error;

    fn try_from(row: OutgoingRow) -> Result<Self, Error> {
        let text = |bytes: Vec<u8>| {
            String::from_utf8(bytes).map_err(|error| Error::DeserializationError(error.into()))
        };
        let headers = decode_headers(&row.headers).ok_or_else(|| {
            Error::DeserializationError(
                format!("outbox row {} holds headers in another format", row.id).into(),
            )
        })?;
        Ok(Self {
            id: row.id,
            message_id: text(row.message_id)?,
            destination: text(row.destination)?,
            routing_key: text(row.routing_key)?,
            ordering_key: row.ordering_key.map(text).transpose()?,
            headers,
            payload: row.payload,
            attempts: u32::try_from(row.attempts).unwrap_or(0),
            last_error: row.last_error.map(text).transpose()?,
        })
    }
}

/// A message a relay has taken: it holds it until the lease ends, or until it says
/// what became of it.
#[derive(Debug)]
#[must_use = "a taken message is published again once its lease ends unless it is marked"]
pub struct Taken {
    message: Outgoing,
    token: String,
}

impl Taken {
    /// The message to publish.
    pub fn message(&self) -> &Outgoing {
        &self.message
    }

    /// Marks it sent: call this once the broker has confirmed the publish. Marks it
    /// even if the lease has ended meanwhile, since it has been published.
    pub async fn sent<C>(self, conn: &mut C) -> QueryResult<()>
    where
        C: AsyncConnection,
        C::Backend: InboxBackend,
    {
        C::Backend::mark_sent(conn, vec![self.message.id]).await
    }

    /// Makes it due again after `delay`, recording `error`: for a publish that may
    /// succeed later. `false` if this relay's lease had ended and another relay may
    /// hold it; it is left as that relay leaves it.
    pub async fn retry_later<C>(
        self,
        conn: &mut C,
        delay: Duration,
        error: impl fmt::Display,
    ) -> QueryResult<bool>
    where
        C: AsyncConnection,
        C::Backend: InboxBackend,
    {
        let delay = micros(delay.min(LONGEST_DELAY));
        let error = storable(error.to_string());
        C::Backend::retry_later(conn, self.message.id, self.token, delay, error).await
    }

    /// Parks it with `reason`, for an operator: for a publish that can never succeed.
    /// `false` if this relay's lease had ended and another relay may hold it.
    pub async fn park<C>(self, conn: &mut C, reason: impl fmt::Display) -> QueryResult<bool>
    where
        C: AsyncConnection,
        C::Backend: InboxBackend,
    {
        let reason = storable(reason.to_string());
        C::Backend::park(conn, self.message.id, self.token, reason).await
    }
}

/// Marks every message of `taken` sent, in one statement: call this once the broker has
/// confirmed each of them. As [`Taken::sent`], for many.
pub async fn sent_all<C>(conn: &mut C, taken: Vec<Taken>) -> QueryResult<()>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    if taken.is_empty() {
        return Ok(());
    }
    let ids = taken.iter().map(|taken| taken.message.id).collect();
    C::Backend::mark_sent(conn, ids).await
}

/// Takes up to `limit` due messages, oldest first, leased to this call for `lease`:
/// no other relay takes them until the lease ends. Take a lease longer than a publish
/// can last, confirmation included.
pub async fn take<C>(conn: &mut C, lease: Duration, limit: usize) -> QueryResult<Vec<Taken>>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let token = uuid::Uuid::new_v4().to_string();
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let lease = micros(lease.min(LONGEST_DELAY));
    let rows = C::Backend::take_due(conn, token.clone(), lease, limit).await?;
    rows.into_iter()
        .map(|row| {
            Ok(Taken {
                message: row.try_into()?,
                token: token.clone(),
            })
        })
        .collect()
}

/// The parked messages, oldest first: those after row `after` (`0` for the first
/// page), at most `limit`.
pub async fn parked<C>(conn: &mut C, after: i64, limit: usize) -> QueryResult<Vec<Outgoing>>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = C::Backend::parked(conn, after, limit).await?;
    rows.into_iter().map(Outgoing::try_from).collect()
}

/// Makes the parked message in row `row_id` due again, at once; `false` if no parked
/// message is there.
pub async fn requeue<C>(conn: &mut C, row_id: i64) -> QueryResult<bool>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    C::Backend::requeue(conn, row_id).await
}

/// Deletes the parked message in row `row_id`, which is then never published, and lets
/// the later messages of its ordering key go; `false` if no parked message is there.
/// The key's own row goes with its last message.
pub async fn discard<C>(conn: &mut C, row_id: i64) -> QueryResult<bool>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let Some(discarded) = C::Backend::discard(conn, row_id).await? else {
        return Ok(false);
    };
    if let Some(ordering_key) = discarded.ordering_key {
        C::Backend::delete_idle_keys(conn, vec![ordering_key]).await?;
    }
    Ok(true)
}

/// A duration in whole microseconds, as the statements take it; at least one, and
/// saturated at what an `i64` holds.
/// The longest lease or retry delay: a century, as good as forever, and still a time
/// every backend can hold once added to now (a longer one failed the statement, and the
/// relay's whole round with it).
const LONGEST_DELAY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The longest error text kept with a message, in bytes.
const LONGEST_ERROR: usize = 4096;

/// `text` as every backend stores it: without NULs, which PostgreSQL's `text` refuses,
/// and cut at [`LONGEST_ERROR`] bytes (a MySQL `TEXT` holds 64 KiB). A publisher's
/// error the database refused failed the relay's whole round, whose other messages,
/// published already, then went out again at every lease.
fn storable(text: String) -> String {
    let mut text = if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text
    };
    if text.len() > LONGEST_ERROR {
        let mut end = LONGEST_ERROR - '…'.len_utf8();
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

pub(super) fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros())
        .unwrap_or(i64::MAX)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::{LONGEST_ERROR, storable};

    #[test]
    fn error_texts_are_stored_without_nuls_and_cut_at_a_char_boundary() {
        assert_eq!(storable("bad\0frame".to_owned()), "bad\u{FFFD}frame");
        assert_eq!(storable("fine".to_owned()), "fine");
        let long = storable("é".repeat(LONGEST_ERROR));
        assert!(long.len() <= LONGEST_ERROR, "{}", long.len());
        assert!(long.ends_with("é…"), "{long}");
    }
}
