//! The crate's own errors, and [`InboxError`], which finds them in whatever error a
//! handler returned.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use crate::key::InvalidKey;

/// One of the crate's own errors, for a `match` that tells them apart.
///
/// A handler's error type is only asked to convert from `diesel::result::Error`, so the
/// crate's own errors reach the caller inside one. [`InboxError::find`] takes them out
/// of it, or out of any error whose [`source`](StdError::source) chain holds it (a
/// handler's own error type that wraps the diesel error):
///
/// ```
/// # use inbox_runtime as diesel_inbox;
/// use diesel_inbox::{ClaimError, InboxError, InvalidKey};
///
/// fn explain(error: &diesel::result::Error) -> &'static str {
///     match InboxError::find(error) {
///         Some(InboxError::InvalidKey(InvalidKey::Empty)) => "a message without an id",
///         Some(InboxError::Claim(ClaimError::Lost { .. })) => "the claim was taken over",
///         Some(_) => "another refusal of the inbox's",
///         None => "not the inbox's own error",
///     }
/// }
///
/// let error = diesel::result::Error::from(InvalidKey::Empty);
/// assert_eq!(explain(&error), "a message without an id");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InboxError {
    /// A message's key cannot be stored. Nothing was written.
    InvalidKey(InvalidKey),
    /// A message of a batch has a key that cannot be stored. Nothing of the batch was
    /// written.
    InvalidBatchKey(InvalidBatchKey),
    /// A claim-mode delivery did not run its body, or could not complete it.
    Claim(ClaimError),
    /// The message id was seen before with another payload.
    FingerprintMismatch(FingerprintMismatch),
    /// An outbox message cannot be stored. Nothing of it was written.
    InvalidOutboxMessage(InvalidOutboxMessage),
    /// Another message's marker holds the same digest in the unique index.
    KeyCollision(KeyCollision),
    /// A handler was called inside another handler's body where it cannot run.
    Nested(NestedHandler),
}

impl InboxError {
    /// The crate's own error in `error` or its [`source`](StdError::source) chain: a
    /// `diesel::result::Error` that carries one, or an error that wraps such a diesel
    /// error as its source.
    pub fn find<'e>(error: &'e (dyn StdError + 'static)) -> Option<&'e Self> {
        let mut current = Some(error);
        while let Some(error) = current {
            if let Some(found) = error.downcast_ref::<Self>().or_else(|| carried_by(error)) {
                return Some(found);
            }
            current = error.source();
        }
        None
    }
}

/// The crate's error inside a diesel error, where [`From`] below put it.
fn carried_by<'e>(error: &'e (dyn StdError + 'static)) -> Option<&'e InboxError> {
    match error.downcast_ref::<diesel::result::Error>()? {
        diesel::result::Error::SerializationError(inner) => inner.downcast_ref(),
        _ => None,
    }
}

impl fmt::Display for InboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidKey(error) => error.fmt(f),
            Self::InvalidBatchKey(error) => error.fmt(f),
            Self::Claim(error) => error.fmt(f),
            Self::FingerprintMismatch(error) => error.fmt(f),
            Self::InvalidOutboxMessage(error) => error.fmt(f),
            Self::KeyCollision(error) => error.fmt(f),
            Self::Nested(error) => error.fmt(f),
        }
    }
}

impl StdError for InboxError {
    // The variant's own source, since this error only names which one it is.
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Self::InvalidKey(error) => error.source(),
            Self::InvalidBatchKey(error) => error.source(),
            Self::Claim(error) => error.source(),
            Self::FingerprintMismatch(error) => error.source(),
            Self::InvalidOutboxMessage(error) => error.source(),
            Self::KeyCollision(error) => error.source(),
            Self::Nested(error) => error.source(),
        }
    }
}

/// The crate's errors travel to a handler's caller as a diesel error: the only one its
/// error type converts from. diesel has no variant for a library's own error, so they
/// ride in `SerializationError`; [`InboxError::find`] is how to read them.
impl From<InboxError> for diesel::result::Error {
    fn from(error: InboxError) -> Self {
        Self::SerializationError(Box::new(error))
    }
}

macro_rules! carried_as {
    ($($error:ident => $variant:ident),*) => {$(
        impl From<$error> for InboxError {
            fn from(error: $error) -> Self {
                Self::$variant(error)
            }
        }

        impl From<$error> for diesel::result::Error {
            fn from(error: $error) -> Self {
                InboxError::$variant(error).into()
            }
        }
    )*};
}

carried_as!(
    InvalidKey => InvalidKey,
    InvalidBatchKey => InvalidBatchKey,
    ClaimError => Claim,
    FingerprintMismatch => FingerprintMismatch,
    InvalidOutboxMessage => InvalidOutboxMessage,
    KeyCollision => KeyCollision,
    NestedHandler => Nested
);

/// Why an outbox message cannot be stored: [`enqueue`](crate::outbox::enqueue) refuses
/// it before writing anything, rather than truncate or drop it. Carried inside the
/// `diesel::result::Error` it returns (read it with [`InboxError::find`]); permanent,
/// since the same message is refused again.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidOutboxMessage {
    /// A field that must say something is empty.
    Empty {
        /// The field: `destination`, `id`, `ordering_key` or `header name`.
        field: &'static str,
    },
    /// A field is longer than its column.
    TooLong {
        /// The field.
        field: &'static str,
        /// Its length, in bytes.
        len: usize,
        /// The column's length, in bytes.
        max: usize,
    },
    /// A field holds a NUL character, which PostgreSQL's `text` cannot store.
    Nul {
        /// The field.
        field: &'static str,
        /// Where the first NUL is, in bytes.
        at: usize,
    },
}

impl fmt::Display for InvalidOutboxMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty { field } => write!(f, "outbox message's {field} is empty"),
            Self::TooLong { field, len, max } => write!(
                f,
                "outbox message's {field} is {len} bytes, longer than its {max}-byte column; \
                 it is refused rather than truncated"
            ),
            Self::Nul { field, at } => write!(
                f,
                "outbox message's {field} holds a NUL character at byte {at}, which \
                 PostgreSQL cannot store in text"
            ),
        }
    }
}

impl StdError for InvalidOutboxMessage {}

/// Why a claim-mode delivery did not run its body, or could not complete it. Carried
/// inside the handler's `diesel::result::Error` (read it with [`InboxError::find`]);
/// [`classify`](crate::classify) tells what it means for the message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimError {
    /// The body returned `Ok`, but its claim no longer held when it came to complete
    /// it (or to [renew](crate::Claim::renew) it): its lease had ended and another delivery
    /// took it over (which repeats the external call with the same idempotency key), or
    /// an operator settled it.
    /// [`Transient`](crate::ErrorClass::Transient): the redelivery finds the message
    /// completed or in progress.
    Lost {
        /// The attempt that lost its claim.
        attempt: u32,
    },
    /// The claim has been attempted `max_attempts` times. The body did not run again.
    /// [`Permanent`](crate::ErrorClass::Permanent): dead-letter the message; the claim
    /// stays in [`list_stale`](crate::claims::list_stale) for a person.
    AttemptsExhausted {
        /// How many times the body was started.
        attempts: u32,
    },
    /// The claim's lease ended without the claim being completed or released (its
    /// holder crashed, or outlived the lease), and the handler has `takeover = false`:
    /// the body must not run twice without a person. The body did not run.
    /// [`Permanent`](crate::ErrorClass::Permanent): dead-letter the message; the claim
    /// stays in [`list_stale`](crate::claims::list_stale).
    Quarantined {
        /// How many times the body was started.
        attempts: u32,
    },
    /// The handler's `lease` is zero or longer than a week. Nothing was written.
    /// [`Permanent`](crate::ErrorClass::Permanent), like the configuration mistake it is.
    InvalidLease {
        /// The lease given.
        lease: Duration,
    },
    /// The body returned with its connection still inside a transaction: one it began
    /// and dropped unfinished, a `tokio::time::timeout` around `conn.transaction(…)` or
    /// around a transactional handler it called. Nothing written there will commit, so
    /// the claim was neither completed nor released on that connection, and the session
    /// was left as it is. The claim stays held until its lease ends; the redelivery then
    /// takes it over, as after a crash, and calls again with the same idempotency key.
    /// [`ConnectionUnusable`](crate::ErrorClass::ConnectionUnusable): discard the
    /// connection (pools do) and redeliver the message.
    TransactionLeftOpen {
        /// The attempt whose body left it open.
        attempt: u32,
    },
    /// The claim's statement took so long to commit (a Galera node waiting out a dead
    /// peer, a stalled synchronous replica) that little of its lease was left, and
    /// renewing it took as long: the body did not run, since another delivery could
    /// take the claim over while it ran. The claim is released, and the attempt not
    /// counted toward `max_attempts`, as the body never started.
    /// [`Transient`](crate::ErrorClass::Transient): redeliver the message.
    LeaseUsedUp {
        /// The attempt that did not run its body.
        attempt: u32,
    },
    /// A transactional or batch handler met its message's marker as a claim that a
    /// claim-mode handler of the same consumer has not completed: one running now, or
    /// one that failed or crashed (a consumer moved out of claim mode, with claims of
    /// the old release unfinished). Whether that body made its call is not known, so the
    /// message is neither processed here nor a duplicate. The body did not run.
    /// [`Transient`](crate::ErrorClass::Transient): redeliver the message; it is a
    /// duplicate once the claim completes, or once a person settles it
    /// ([`complete_by_hand`](crate::claims::complete_by_hand)).
    Unfinished,
}

impl ClaimError {
    /// Whether a later delivery can succeed: [`ClaimError::Lost`],
    /// [`ClaimError::LeaseUsedUp`] and [`ClaimError::Unfinished`].
    pub(crate) fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Lost { .. } | Self::LeaseUsedUp { .. } | Self::Unfinished
        )
    }

    /// Whether the connection it happened on must be discarded.
    pub(crate) fn leaves_connection_unusable(&self) -> bool {
        matches!(self, Self::TransactionLeftOpen { .. })
    }
}

/// Whether `text` is one of this crate's errors that a later delivery gets past, known
/// by its words alone (see [`classify_text`](crate::classify::classify_text)): the
/// transient [`ClaimError`]s, and the database errors the crate reports for a
/// transaction rolled back underneath the body, a marker pruned while it was compared,
/// and a COMMIT whose outcome was not confirmed. Tests hold each text to these words.
pub(crate) fn is_transient(text: &str) -> bool {
    const OPENINGS: &[&str] = &[
        "the handler's transaction was rolled back by the database before it could commit",
        "the marker this message's insert met was deleted (pruned)",
        "the marker this message's insert met is its own, but reading it back",
        "the handler's COMMIT went through, but the statement after it failed",
        "the message's marker is a claim that a claim-mode handler of this consumer has not \
         completed",
    ];
    const WITHIN: &[&str] = &[
        // `ClaimError::Lost` and `LeaseUsedUp`, after "attempt {n}".
        " finished its body after its claim's lease ended, and the claim had been taken over",
        "'s claim took so long to commit that too little of its lease was left",
    ];
    OPENINGS.iter().any(|opening| text.starts_with(opening))
        || (text.starts_with("attempt ") && WITHIN.iter().any(|words| text.contains(words)))
}

/// Whether `text` is one of this crate's errors that leave the connection unusable,
/// known by its words alone: [`ClaimError::TransactionLeftOpen`].
pub(crate) fn leaves_connection_unusable(text: &str) -> bool {
    text.starts_with("attempt ")
        && text.contains("'s body returned with its connection still inside a transaction")
}

impl fmt::Display for ClaimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Lost { attempt } => write!(
                f,
                "attempt {attempt} finished its body after its claim's lease ended, and \
                 the claim had been taken over or settled by then: it was not completed \
                 by this delivery (the downstream system sees the same idempotency key \
                 again from whoever holds it)"
            ),
            Self::AttemptsExhausted { attempts } => write!(
                f,
                "the claim was attempted {attempts} times, the handler's `max_attempts`: \
                 the body did not run again; settle it by hand (diesel_inbox::claims)"
            ),
            Self::Quarantined { attempts } => write!(
                f,
                "the claim's lease ended during attempt {attempts} without it completing, \
                 and the handler does not take claims over (`takeover = false`): the body \
                 did not run again; reconcile the message with the downstream system, then \
                 settle it by hand (diesel_inbox::claims)"
            ),
            Self::InvalidLease { lease } => write!(
                f,
                "the handler's claim lease is {lease:?}: a lease must be at least 1 ms, \
                 and at most a week, beyond which nothing would ever take a claim over"
            ),
            Self::TransactionLeftOpen { attempt } => write!(
                f,
                "attempt {attempt}'s body returned with its connection still inside a \
                 transaction (a transaction, or a handler, it dropped unfinished): nothing \
                 written there will commit, so the claim was not settled on it; discard \
                 the connection, and the redelivery takes the claim over once its lease \
                 has ended"
            ),
            Self::LeaseUsedUp { attempt } => write!(
                f,
                "attempt {attempt}'s claim took so long to commit that too little of its \
                 lease was left to run the body, and renewing it took as long: the body \
                 did not run, and the claim was released for the redelivery"
            ),
            Self::Unfinished => write!(
                f,
                "the message's marker is a claim that a claim-mode handler of this \
                 consumer has not completed (running now, or failed or crashed): this \
                 handler cannot tell whether that body made its call, so it did not run; \
                 the redelivery is a duplicate once the claim completes or is settled by \
                 hand (diesel_inbox::claims)"
            ),
        }
    }
}

impl StdError for ClaimError {}

/// A delivery's key matched a marker whose payload fingerprint differs: the producer
/// reused a message id for another message. Classified
/// [`Permanent`](crate::ErrorClass::Permanent); the body did not run, and nothing was
/// written. Never a duplicate: acknowledging it would lose the other message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FingerprintMismatch {
    /// The stored key.
    pub message_id: String,
    /// The consumer.
    pub consumer: String,
    /// The fingerprint stored with the marker.
    pub stored: String,
    /// The fingerprint of this delivery's payload.
    pub delivered: String,
}

impl fmt::Display for FingerprintMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "message {:?} for consumer {:?} was already seen with another payload \
             (fingerprint {} stored, {} delivered): the producer reused the message id, \
             and this delivery was not processed",
            self.message_id, self.consumer, self.stored, self.delivered
        )
    }
}

impl StdError for FingerprintMismatch {}

/// A delivery's marker met another message's in the unique index: on PostgreSQL the
/// index holds a 128-bit digest of (consumer, key), and two different keys gave the same
/// one. At 10^12 markers the chance that any two do is about 10^-15; a key chosen to
/// collide would have to break SHA-256. The crate compares the stored key whenever an
/// insert meets a marker, so a collision is this error, never a duplicate: the body did
/// not run, nothing was written, and the message must not be acknowledged as processed.
///
/// Classified [`Permanent`](crate::ErrorClass::Permanent): every delivery of the message
/// meets the same marker. Dead-letter it and report it, with both keys.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyCollision {
    /// The delivery's key.
    pub message_id: String,
    /// The consumer.
    pub consumer: String,
    /// The key of the marker that holds the digest.
    pub stored_message_id: String,
    /// The consumer of the marker that holds the digest.
    pub stored_consumer: String,
}

impl fmt::Display for KeyCollision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "message {:?} for consumer {:?} has the same digest in the inbox's unique \
             index as message {:?} for consumer {:?}: it was not processed, and is not \
             a duplicate; set it aside and report it",
            self.message_id, self.consumer, self.stored_message_id, self.stored_consumer
        )
    }
}

impl StdError for KeyCollision {}

/// A handler called inside another handler's body where it cannot run. A mistake in the
/// code, which no redelivery mends: classified [`Permanent`](crate::ErrorClass::Permanent).
/// Nothing of the inner call was written.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NestedHandler {
    /// On a connection inside a transaction, the calling body's: the inner handler's
    /// transaction would open inside the caller's. (Outside any handler's body, a
    /// connection left inside a transaction is `AlreadyInTransaction`, classified
    /// `ConnectionUnusable`: a pool's broken connection, which the next one replaces.)
    InATransaction {
        /// The inner handler's consumer.
        consumer: &'static str,
    },
    /// By a transactional or batch handler's body, for the message it is processing, under
    /// the same consumer: the inner call would wait for the marker its caller holds, on
    /// another connection, until the caller ends, which is never.
    SameMessage {
        /// The consumer.
        consumer: &'static str,
        /// The message's key.
        message_id: String,
    },
}

impl fmt::Display for NestedHandler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InATransaction { consumer } => write!(
                f,
                "handler {consumer:?} was called inside another handler's body on a \
                 connection inside a transaction: handlers do not nest on the body's \
                 connection; give the inner call a connection of its own"
            ),
            Self::SameMessage {
                consumer,
                message_id,
            } => write!(
                f,
                "handler {consumer:?} was called for message {message_id:?} inside its own \
                 delivery of that message, which would wait forever for the marker its \
                 caller holds"
            ),
        }
    }
}

impl StdError for NestedHandler {}

/// A message of the batch whose key cannot be stored. The whole batch is rejected before
/// anything is written, so that the caller can set that message aside (dead-letter it)
/// and deliver the others again. With several such keys it names the first that cannot
/// be encoded (empty, too long), else the first the backend cannot store (a NUL on
/// PostgreSQL); delivering the others again names the next.
///
/// Classified `Permanent`; [`InboxError::find`] takes it out of the handler's error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidBatchKey {
    /// Index of the message in the batch.
    pub index: usize,
    /// What is wrong with its key.
    pub reason: InvalidKey,
}

impl fmt::Display for InvalidBatchKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "message {} of the batch: {}; nothing of the batch was written",
            self.index, self.reason
        )
    }
}

impl StdError for InvalidBatchKey {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.reason)
    }
}
