//! The exactly-once transaction that every `#[idempotent]` handler runs.

use std::convert::Infallible;
use std::pin::Pin;
use std::time::Instant;

use diesel_async::AsyncConnection;
use tracing::Instrument as _;

use crate::backend::InboxBackend;
use crate::backend::sealed::{Marker, Sealed as _};
use crate::begin::Begin;
use crate::body_scope::{InBody, Scope};
use crate::call;
use crate::enclosing::{Enclosing, enclosing_transaction};
use crate::fast_path::FastPath;
use crate::fingerprint::Fingerprint;
use crate::handler::Handler;
use crate::key::InvalidKey;
use crate::outcome::{Outcome, Stop};
use crate::report;
use crate::test_transaction;
use crate::verdict::HandlerErrorType;

/// Runs `body` exactly once per (`message_id`, `consumer`), in one transaction with the
/// marker row. This is what `#[idempotent]` expands to.
///
/// 1. Refuses a connection that is already inside a transaction or whose transaction
///    state is unknown: committing there would not be a real commit, so
///    [`Outcome::Processed`] would be a lie. Inside a test transaction
///    (`begin_test_transaction`) and nothing else, the call runs on a savepoint instead
///    of a transaction of its own.
/// 2. When `fast_path` says to read first, a committed marker returns
///    [`Outcome::Duplicate`] without a transaction.
/// 3. In one transaction (begun as `begin` says): inserts the marker (waiting for any transaction that holds the
///    same key), runs `body` on the transaction's connection, and commits once it has
///    checked that the database did not roll the transaction back underneath `body`. A
///    marker already there rolls back and returns [`Outcome::Duplicate`]; `Err` from
///    `body` rolls back everything and is returned.
/// 4. With a `fingerprint`, it is stored with the marker, and a duplicate whose stored
///    fingerprint differs is an error ([`FingerprintMismatch`]) instead.
///
/// [`FingerprintMismatch`]: crate::FingerprintMismatch
///
/// The returned future is `Send` exactly when `body`'s is, so a handler can be spawned
/// whenever its body could.
///
/// Database errors reach the caller through `error_type.from_diesel`, which the macro
/// spells as the handler's `From<diesel::result::Error>` conversion so that a missing impl
/// is reported at the handler's signature. A handler error that holds a database error
/// (the body's own constraint violation) marks the span's `error.type` with its class.
#[allow(
    clippy::too_many_arguments,
    reason = "the expansion's entry point: one argument for each thing the attribute decides"
)]
pub async fn run<C, T, E, F>(
    conn: &mut C,
    begin: Begin<C>,
    handler: &'static Handler,
    message_id: Result<String, InvalidKey>,
    fast_path: FastPath,
    fingerprint: Option<Fingerprint>,
    error_type: HandlerErrorType<E>,
    body: F,
) -> Result<Outcome<T>, E>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    F: for<'r> AsyncFnOnce(&'r mut C) -> Result<T, E>,
{
    // Only what depends on the body's types is written here, compiled once per handler;
    // the rest is generic over the connection alone, compiled once per connection type,
    // and boxed so that the handler's future holds a pointer to it, not its states.
    let read_first = fast_path.reads_first(&handler.recent_duplicates);
    let span = report::delivery_span(
        handler.registration,
        message_id.as_deref().ok(),
        "transaction",
        read_first,
    );
    let started = Instant::now();
    // Kept for the body's scope: the outbox derives its messages' default ids from it.
    let key = message_id.as_deref().unwrap_or_default().to_owned();
    let opened = open(
        conn,
        begin,
        handler,
        message_id,
        read_first,
        fingerprint,
        &span,
    );
    let stopped = match opened.await {
        Ok(enclosing) => {
            let scope = Scope::delivery(handler.registration.consumer, key);
            let result = InBody::new(body(&mut *conn), scope, &span).await;
            let closed = call::close(conn, enclosing, result.is_ok(), &span);
            match (result, closed.await) {
                (Ok(value), Ok(())) => Ok(value),
                (Err(error), Ok(())) => Err(Stop::Handler(error)),
                (_, Err(error)) => Err(Stop::Database(error)),
            }
        }
        Err(stop) => Err(stop.widen()),
    };
    let (result, outcome) = match stopped {
        Ok(value) => {
            handler.recent_duplicates.record(false);
            (Ok(Outcome::Processed(value)), "processed")
        }
        Err(Stop::Duplicate) => {
            handler.recent_duplicates.record(true);
            report::duplicate(&span);
            (Ok(Outcome::Duplicate), "duplicate")
        }
        Err(Stop::Handler(error)) => {
            report::handler_error(&span, (error_type.database_class)(&error));
            (Err(error), "handler_error")
        }
        Err(Stop::Database(error)) => (Err((error_type.from_diesel)(error)), "database_error"),
    };
    report::finished(&span, handler.registration, outcome, started.elapsed());
    result
}

/// Everything before the body: the key checked, the fast path's read, then the call's
/// transaction begun with the marker in it (or a test transaction's savepoint). `Ok`
/// says what the call runs in; a duplicate whose fingerprint differs is an error, and a
/// database error comes explained (see [`call::explained`]).
pub(crate) fn open<'c, C>(
    conn: &'c mut C,
    begin: Begin<C>,
    handler: &'static Handler,
    message_id: Result<String, InvalidKey>,
    read_first: bool,
    fingerprint: Option<Fingerprint>,
    span: &tracing::Span,
) -> Pin<Box<impl Future<Output = Result<Enclosing, Stop<Infallible>>> + 'c>>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let explained_in = span.clone();
    let opened = async move {
        let opened = open_unboxed(
            &mut *conn,
            begin,
            handler,
            message_id,
            read_first,
            fingerprint,
        )
        .await;
        call::explained(conn, opened, &explained_in).await
    };
    Box::pin(opened.instrument(span.clone()))
}

async fn open_unboxed<C>(
    conn: &mut C,
    begin: Begin<C>,
    handler: &'static Handler,
    message_id: Result<String, InvalidKey>,
    read_first: bool,
    fingerprint: Option<Fingerprint>,
) -> Result<Enclosing, Stop<Infallible>>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let consumer = handler.registration.consumer;
    let message_id = message_id?;
    C::Backend::check_storable(&message_id)?;
    let marker = Marker {
        message_id,
        consumer,
        fingerprint: fingerprint.clone().map(Fingerprint::into_string),
    };
    let enclosing = enclosing_transaction(conn)?;
    let opened = if read_first && C::Backend::already_processed(conn, &marker).await? {
        Err(Stop::Duplicate)
    } else {
        match enclosing {
            // Driven through the transaction manager rather than
            // `AsyncConnection::transaction`, which requires the closure's future to be
            // `Send` for every lifetime: rustc cannot prove that for concrete connection
            // types (rust-lang/rust#100013), and a handler must be spawnable whenever its
            // body is.
            Enclosing::Nothing => match begin.with_marker(conn, &marker).await? {
                true => Ok(enclosing),
                false => Err(Stop::Duplicate),
            },
            Enclosing::TestTransaction => test_transaction::open(conn, &marker)
                .await
                .map(|()| enclosing),
        }
    };
    // A duplicate with another payload is the producer's bug, not a duplicate.
    if let (Err(Stop::Duplicate), Some(delivered)) = (&opened, &fingerprint) {
        crate::fingerprint::check_stored(conn, marker.message_id, consumer, delivered).await?;
    }
    opened
}
