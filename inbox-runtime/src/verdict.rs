//! What a handler's error means for its delivery, however the handler's code wraps it.
//!
//! [`Disposition::of`](crate::Disposition::of), `Disposition::of_batch` and `retry` ask
//! one question of an error, [`Classify`]. Errors that carry a database error are
//! answered by [`classify`]; a connection that cannot be opened, a pool that timed out,
//! a lost socket and a cancelled handler are retryable; an error of the handler's own is
//! permanent unless it says otherwise ([`Classified`], or its own [`Classify`] impl).

use std::error::Error as StdError;
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use diesel::result::{ConnectionError, Error};

use crate::classify::{ErrorClass, classify, classify_text};

/// What an error means for the delivery that failed with it: whether the message is
/// retried, and after how long. [`Disposition::of`](crate::Disposition::of),
/// `Disposition::of_batch` and `retry` read a handler's error through this trait, so
/// an impl for your error type is the one place that decides its verdicts.
///
/// Implemented for `diesel::result::Error`, `diesel::ConnectionError`,
/// `std::io::Error`, boxed errors, [`Classified`], the pools' errors (diesel-async's,
/// and with the `deadpool` or `bb8` feature theirs) and, with the `anyhow` feature,
/// `anyhow::Error`. For your own error type, [`class_of`] finds the verdict anywhere in
/// its [`source`](StdError::source) chain; match first on what you know better:
///
/// ```
/// # use inbox_runtime as diesel_inbox;
/// use std::time::Duration;
/// use diesel_inbox::{Classify, ErrorClass};
///
/// #[derive(Debug)]
/// enum AppError {
///     Db(diesel::result::Error),
///     /// The e-mail provider answered 503, perhaps with a `Retry-After`.
///     MailUnavailable { retry_after: Option<Duration> },
///     Rejected(String),
/// }
/// # impl std::fmt::Display for AppError {
/// #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{self:?}") }
/// # }
/// # impl std::error::Error for AppError {}
///
/// impl Classify for AppError {
///     fn class(&self) -> ErrorClass {
///         match self {
///             AppError::Db(error) => error.class(),
///             AppError::MailUnavailable { .. } => ErrorClass::Transient,
///             AppError::Rejected(_) => ErrorClass::Permanent,
///         }
///     }
///
///     fn retry_after(&self) -> Option<Duration> {
///         match self {
///             AppError::MailUnavailable { retry_after } => *retry_after,
///             _ => None,
///         }
///     }
/// }
/// ```
pub trait Classify {
    /// What the error means for its message: deliver it again
    /// ([`ErrorClass::Transient`], [`ErrorClass::ConnectionUnusable`]) or dead-letter it
    /// ([`ErrorClass::Permanent`]; [`Disposition`](crate::Disposition) dead-letters an
    /// [`ErrorClass::InboxDuplicate`] too, which no handler's own marker gives).
    fn class(&self) -> ErrorClass;

    /// For a retryable error, how long to wait before the next delivery, when the error
    /// knows (a `Retry-After`, a rate limit's window). `None` leaves it to the retry
    /// policy or the broker.
    fn retry_after(&self) -> Option<Duration> {
        None
    }
}

/// The verdict on any error, from its whole [`source`](StdError::source) chain.
///
/// The outermost error whose type says something decides: a [`Classified`] error, a
/// diesel error ([`classify`]), a connection that could not be opened, a pool's error
/// or time-out, a lost socket (`std::io::Error` of a connection kind, also looked
/// through when it wraps another error), a handler cut short by `tokio::time::timeout`.
/// A wrapper that forwards `source()` past the diesel error, as thiserror's
/// `#[error(transparent)]` and `std::io::Error::other` do, still shows the database's
/// message as its text, which is recognised for the retryable classes only. Anything
/// else is the handler's own verdict on the message: [`ErrorClass::Permanent`].
pub fn class_of(error: &(dyn StdError + 'static)) -> ErrorClass {
    verdict_of(error).class
}

/// How long to wait before the next delivery, as the outermost [`Classified`] error in
/// `error`'s chain says; `None` when none says.
pub fn retry_after_of(error: &(dyn StdError + 'static)) -> Option<Duration> {
    verdict_of(error).retry_after
}

/// An error that carries its own verdict, for handlers whose errors are boxed or
/// `anyhow::Error`: wrap the error where it happens, and [`class_of`] finds the verdict
/// through any wrapping around it.
///
/// ```
/// # use inbox_runtime as diesel_inbox;
/// use std::time::Duration;
/// use diesel_inbox::{Classified, Disposition, Outcome};
///
/// type BoxError = Box<dyn std::error::Error + Send + Sync>;
///
/// fn send_receipt(status: u16) -> Result<Outcome<()>, BoxError> {
///     if status == 503 {
///         let unavailable = format!("the mail provider answered {status}");
///         return Err(Classified::retry_after(unavailable, Duration::from_millis(300)).into());
///     }
///     Ok(Outcome::Processed(()))
/// }
///
/// assert_eq!(
///     Disposition::of(&send_receipt(503)),
///     Disposition::Retry {
///         after: Some(Duration::from_millis(300)),
///         reason: String::from("the mail provider answered 503"),
///     }
/// );
/// ```
pub struct Classified {
    class: ErrorClass,
    retry_after: Option<Duration>,
    error: Box<dyn StdError + Send + Sync>,
}

impl Classified {
    /// `error` can be retried: [`ErrorClass::Transient`].
    pub fn retryable(error: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self {
            class: ErrorClass::Transient,
            retry_after: None,
            error: error.into(),
        }
    }

    /// `error` can be retried, not before `after`.
    pub fn retry_after(error: impl Into<Box<dyn StdError + Send + Sync>>, after: Duration) -> Self {
        Self {
            retry_after: Some(after),
            ..Self::retryable(error)
        }
    }

    /// No retry helps `error`, whatever it wraps: [`ErrorClass::Permanent`].
    pub fn permanent(error: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self {
            class: ErrorClass::Permanent,
            retry_after: None,
            error: error.into(),
        }
    }

    /// The error that was classified.
    pub fn into_inner(self) -> Box<dyn StdError + Send + Sync> {
        self.error
    }
}

impl fmt::Debug for Classified {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Classified")
            .field("class", &self.class)
            .field("retry_after", &self.retry_after)
            .field("error", &self.error)
            .finish()
    }
}

impl fmt::Display for Classified {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl StdError for Classified {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(self.error.as_ref())
    }
}

/// An error's class and, when it says, the delay before its retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Verdict {
    class: ErrorClass,
    retry_after: Option<Duration>,
}

impl From<ErrorClass> for Verdict {
    fn from(class: ErrorClass) -> Self {
        Self {
            class,
            retry_after: None,
        }
    }
}

fn verdict_of(error: &(dyn StdError + 'static)) -> Verdict {
    if let Some(verdict) = chain(error).find_map(known_verdict) {
        return verdict;
    }
    // Only the text is left where a wrapper forwarded `source()` past the diesel error.
    // A text can say "retry", never "duplicate": acknowledging on a text could lose a
    // message whose own error merely quotes the inbox's index.
    chain(error)
        .find_map(|link| classify_text(&link.to_string()))
        .filter(|class| class.is_retryable())
        .unwrap_or(ErrorClass::Permanent)
        .into()
}

/// The first diesel error in `error`'s [`source`](StdError::source) chain, `error`
/// itself included.
pub fn find_database_error<'e>(error: &'e (dyn StdError + 'static)) -> Option<&'e Error> {
    chain(error).find_map(|link| link.downcast_ref::<Error>())
}

/// How a mode handles a handler's error type: database errors convert into it, and a
/// database error raised by the body is read back out of it for the delivery's span.
/// The `#[idempotent]` expansion fills it in for the handler's declared error type.
#[doc(hidden)]
pub struct HandlerErrorType<E> {
    /// `E`'s `From<diesel::result::Error>`.
    pub from_diesel: fn(Error) -> E,
    /// The class of the database error in an `E` the body returned, when `E` is a
    /// `std::error::Error` whose chain holds one: a check or unique violation of the
    /// body's own writes is then reported as such, not only as a handler error.
    pub database_class: fn(&E) -> Option<ErrorClass>,
}

/// Picks [`HandlerErrorType::database_class`] for a handler's error type by autoref: the
/// expansion calls `(&&DatabaseClassOf::<E>::new()).reader()`, which finds
/// [`ReadsErrorChain`] where `E` is a `std::error::Error` and [`OpaqueError`] where not.
#[doc(hidden)]
pub struct DatabaseClassOf<E>(PhantomData<fn(&E)>);

impl<E> DatabaseClassOf<E> {
    #[doc(hidden)]
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

#[doc(hidden)]
pub trait ReadsErrorChain<E> {
    fn reader(&self) -> fn(&E) -> Option<ErrorClass>;
}

impl<E: StdError + 'static> ReadsErrorChain<E> for &DatabaseClassOf<E> {
    fn reader(&self) -> fn(&E) -> Option<ErrorClass> {
        |error| find_database_error(error).map(classify)
    }
}

#[doc(hidden)]
pub trait OpaqueError<E> {
    fn reader(&self) -> fn(&E) -> Option<ErrorClass>;
}

impl<E> OpaqueError<E> for DatabaseClassOf<E> {
    fn reader(&self) -> fn(&E) -> Option<ErrorClass> {
        |_| None
    }
}

/// `error`, then each error it wraps. `std::io::Error::source` skips the error it wraps
/// (it returns that error's source), so an io error is looked through with `get_ref`.
fn chain<'e>(
    error: &'e (dyn StdError + 'static),
) -> impl Iterator<Item = &'e (dyn StdError + 'static)> {
    std::iter::successors(Some(error), |&link| {
        match link.downcast_ref::<std::io::Error>() {
            Some(io) => match io.get_ref() {
                Some(inner) => Some(inner as &(dyn StdError + 'static)),
                None => io.source(),
            },
            None => link.source(),
        }
    })
}

/// The verdict of an error whose type says what it means; `None` for any other.
fn known_verdict(link: &(dyn StdError + 'static)) -> Option<Verdict> {
    if let Some(classified) = link.downcast_ref::<Classified>() {
        return Some(Verdict {
            class: classified.class,
            retry_after: classified.retry_after,
        });
    }
    if let Some(database) = link.downcast_ref::<Error>() {
        return Some(classify(database).into());
    }
    if link.is::<ConnectionError>()
        || link.is::<diesel_async::pooled_connection::PoolError>()
        || is_pool_error(link)
        || link.is::<tokio::time::error::Elapsed>()
    {
        return Some(ErrorClass::ConnectionUnusable.into());
    }
    let io = link.downcast_ref::<std::io::Error>()?;
    is_connection_kind(io.kind()).then_some(ErrorClass::ConnectionUnusable.into())
}

/// A pool's own error: a time-out waiting for a connection, a pool closed or not set
/// up, or a connection that failed to open or to pass its check. None of these is the
/// message's fault.
fn is_pool_error(link: &(dyn StdError + 'static)) -> bool {
    #[cfg(feature = "deadpool")]
    if link.is::<diesel_async::pooled_connection::deadpool::PoolError>() {
        return true;
    }
    #[cfg(feature = "bb8")]
    if link.is::<diesel_async::pooled_connection::bb8::RunError>() {
        return true;
    }
    let _ = link;
    false
}

/// The kinds of a socket error that say the connection, not the message, failed.
fn is_connection_kind(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        kind,
        ConnectionRefused
            | ConnectionReset
            | ConnectionAborted
            | NotConnected
            | BrokenPipe
            | TimedOut
            | UnexpectedEof
            | AddrNotAvailable
            | HostUnreachable
            | NetworkUnreachable
            | NetworkDown
    )
}

impl Classify for Error {
    fn class(&self) -> ErrorClass {
        classify(self)
    }
}

impl Classify for ConnectionError {
    fn class(&self) -> ErrorClass {
        ErrorClass::ConnectionUnusable
    }
}

impl Classify for diesel_async::pooled_connection::PoolError {
    fn class(&self) -> ErrorClass {
        ErrorClass::ConnectionUnusable
    }
}

#[cfg(feature = "deadpool")]
impl Classify for diesel_async::pooled_connection::deadpool::PoolError {
    fn class(&self) -> ErrorClass {
        ErrorClass::ConnectionUnusable
    }
}

#[cfg(feature = "bb8")]
impl Classify for diesel_async::pooled_connection::bb8::RunError {
    fn class(&self) -> ErrorClass {
        ErrorClass::ConnectionUnusable
    }
}

impl Classify for Classified {
    fn class(&self) -> ErrorClass {
        self.class
    }

    fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
}

/// Classifies through the whole chain, by [`class_of`].
macro_rules! classify_by_chain {
    ($($error:ty),+) => {$(
        impl Classify for $error {
            fn class(&self) -> ErrorClass {
                class_of(self.as_chain())
            }

            fn retry_after(&self) -> Option<Duration> {
                retry_after_of(self.as_chain())
            }
        }
    )+};
}

/// An error as the start of its chain.
trait AsChain {
    fn as_chain(&self) -> &(dyn StdError + 'static);
}

impl AsChain for std::io::Error {
    fn as_chain(&self) -> &(dyn StdError + 'static) {
        self
    }
}

impl AsChain for Box<dyn StdError + Send + Sync> {
    fn as_chain(&self) -> &(dyn StdError + 'static) {
        self.as_ref()
    }
}

impl AsChain for Box<dyn StdError> {
    fn as_chain(&self) -> &(dyn StdError + 'static) {
        self.as_ref()
    }
}

#[cfg(feature = "anyhow")]
impl AsChain for anyhow::Error {
    fn as_chain(&self) -> &(dyn StdError + 'static) {
        self.as_ref()
    }
}

classify_by_chain!(
    std::io::Error,
    Box<dyn StdError + Send + Sync>,
    Box<dyn StdError>
);
#[cfg(feature = "anyhow")]
classify_by_chain!(anyhow::Error);

#[cfg(test)]
mod tests {
    use diesel::result::DatabaseErrorKind;

    use super::*;

    fn database(kind: DatabaseErrorKind, message: &str) -> Error {
        Error::DatabaseError(kind, Box::new(message.to_owned()))
    }

    fn deadlock() -> Error {
        database(DatabaseErrorKind::Unknown, "deadlock detected")
    }

    /// A wrapper that forwards `Display` and `source()` to the error it wraps, as
    /// thiserror's `#[error(transparent)]` does: the diesel error is never a link.
    #[derive(Debug)]
    struct Transparent(Error);

    impl fmt::Display for Transparent {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            fmt::Display::fmt(&self.0, f)
        }
    }

    impl StdError for Transparent {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            self.0.source()
        }
    }

    #[test]
    fn a_diesel_error_decides_wherever_it_is() {
        assert_eq!(class_of(&deadlock()), ErrorClass::Transient);
        let io = std::io::Error::other(deadlock());
        assert_eq!(io.class(), ErrorClass::Transient);
        let boxed: Box<dyn StdError + Send + Sync> = Box::new(io);
        assert_eq!(boxed.class(), ErrorClass::Transient);
        let business = database(
            DatabaseErrorKind::CheckViolation,
            "balance must be positive",
        );
        assert_eq!(
            std::io::Error::other(business).class(),
            ErrorClass::Permanent
        );
    }

    #[test]
    fn a_transparent_wrapper_is_recognised_by_the_database_message() {
        for message in [
            "deadlock detected",
            "canceling statement due to lock timeout",
            "could not serialize access due to concurrent update",
            "Lock wait timeout exceeded; try restarting transaction",
            "database is locked",
            "terminating connection due to administrator command",
            "cannot execute INSERT in a read-only transaction",
            "Cannot execute statement in a READ ONLY transaction",
        ] {
            let wrapped = Transparent(database(DatabaseErrorKind::Unknown, message));
            assert!(class_of(&wrapped).is_retryable(), "{message}");
        }
        // A text never acknowledges: an inbox duplicate's text is not taken at its word.
        let duplicate = Transparent(database(
            DatabaseErrorKind::Unknown,
            "Duplicate entry 'm-1' for key 'ux_inbox_message_consumer'",
        ));
        assert_eq!(class_of(&duplicate), ErrorClass::Permanent);
        let business = Transparent(database(DatabaseErrorKind::Unknown, "division by zero"));
        assert_eq!(class_of(&business), ErrorClass::Permanent);
    }

    #[test]
    fn a_connection_that_cannot_be_had_is_retried() {
        let refused = ConnectionError::BadConnection(String::from("Connection refused"));
        assert_eq!(refused.class(), ErrorClass::ConnectionUnusable);
        let pool = diesel_async::pooled_connection::PoolError::ConnectionError(refused);
        let boxed: Box<dyn StdError + Send + Sync> = Box::new(pool);
        assert_eq!(boxed.class(), ErrorClass::ConnectionUnusable);
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(reset.class(), ErrorClass::ConnectionUnusable);
        let not_found = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(not_found.class(), ErrorClass::Permanent);
    }

    #[test]
    fn the_outermost_classified_error_decides() {
        let after = Duration::from_secs(2);
        let unavailable: Box<dyn StdError + Send + Sync> =
            Box::new(Classified::retry_after("503 Service Unavailable", after));
        assert_eq!(unavailable.class(), ErrorClass::Transient);
        assert_eq!(unavailable.retry_after(), Some(after));
        let permanent: Box<dyn StdError + Send + Sync> =
            Box::new(Classified::permanent(deadlock()));
        assert_eq!(permanent.class(), ErrorClass::Permanent);
        assert_eq!(permanent.to_string(), "deadlock detected");
        let own: Box<dyn StdError + Send + Sync> = "the order was cancelled".into();
        assert_eq!(own.class(), ErrorClass::Permanent);
        assert_eq!(own.retry_after(), None);
    }
}
