//! The exactly-once transaction that every `#[idempotent]` handler runs.

use std::convert::Infallible;
use std::time::Instant;

use diesel::result::Error;
use diesel_async::AsyncConnection;
use tracing::Instrument as _;

use crate::backend::InboxBackend;
use crate::backend::sealed::{Marker, Sealed as _};
use crate::begin::Begin;
use crate::body_scope::{DropScope, Scope};
use crate::call;
use crate::enclosing::{Enclosing, enclosing_for_delivery};
use crate::fast_path::FastPath;
use crate::fingerprint::Fingerprint;
use crate::handler::Handler;
use crate::key::InvalidKey;
use crate::outcome::{Outcome, Stop};
use crate::report;
use crate::step::{Begun, Ended, Step};
use crate::test_transaction;
use crate::verdict::HandlerErrorType;

/// Begins a delivery that runs its body exactly once per (`message_id`, `consumer`), in
/// one transaction with the marker row. The `#[idempotent]` expansion awaits this, then
/// its body in [`InTransaction::body`], then [`InTransaction::close`].
///
/// 1. Refuses a connection that is already inside a transaction or whose transaction
///    state is unknown: committing there would not be a real commit, so
///    [`Outcome::Processed`] would be a lie. Inside a test transaction
///    (`begin_test_transaction`) and nothing else, the call runs on a savepoint instead
///    of a transaction of its own.
/// 2. When `fast_path` says to read first, a committed marker stops the delivery as
///    [`Outcome::Duplicate`] without a transaction.
/// 3. Begins the transaction (as `begin` says) with the marker inserted, waiting for any
///    transaction that holds the same key. A marker already there rolls back and stops
///    the delivery as [`Outcome::Duplicate`].
/// 4. With a `fingerprint`, it is stored with the marker, and a duplicate whose stored
///    fingerprint differs is an error ([`FingerprintMismatch`]) instead.
///
/// [`FingerprintMismatch`]: crate::FingerprintMismatch
///
/// The steps before and after the body are generic over the connection alone and boxed,
/// so that they are compiled once per connection type, not once per handler; they are
/// `Send`, so the handler's future is `Send` exactly when its body's is.
pub fn begin_transaction<'c, C>(
    begin: Begin<C>,
    conn: &'c mut C,
    handler: &'static Handler,
    message_id: Result<String, InvalidKey>,
    fast_path: FastPath,
    fingerprint: Option<Fingerprint>,
) -> Step<'c, Result<InTransaction<C>, Stopped>>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let delivery = Delivery::start(handler, message_id.as_deref().ok(), fast_path);
    Step::new(async move {
        let opened = open(
            conn,
            begin,
            handler,
            message_id,
            delivery.read_first,
            fingerprint,
            &delivery.span,
        );
        match opened.await {
            Ok((enclosing, scope)) => {
                let scope = DropScope::new(scope, &delivery.span);
                let closing = Closing {
                    delivery,
                    enclosing,
                };
                Ok(Begun::new(closing, scope, close::<C>))
            }
            Err(stop) => Err(Stopped { delivery, stop }),
        }
    })
}

/// A delivery whose transaction holds its marker: what the handler's future holds while
/// its body runs. Its `close` commits the transaction when the body succeeded, once it
/// has checked that the database did not roll the transaction back underneath the body;
/// it rolls it back otherwise, with everything the body wrote.
pub type InTransaction<C> = Begun<C, Closing, Closed>;

/// What the close step needs.
#[doc(hidden)]
pub struct Closing {
    delivery: Delivery,
    enclosing: Enclosing,
}

fn close<C>(conn: &mut C, closing: Closing, succeeded: bool) -> Step<'_, Closed>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let Closing {
        delivery,
        enclosing,
    } = closing;
    Step::new(async move {
        let closed = call::close(conn, enclosing, succeeded, &delivery.span).await;
        Closed { delivery, closed }
    })
}

/// A delivery whose transaction has ended.
pub struct Closed {
    delivery: Delivery,
    closed: Result<(), Error>,
}

impl Ended for Closed {
    type Outcome<T> = Outcome<T>;

    /// The handler's result: the body's, unless the transaction failed to end, whose
    /// error then replaces it.
    ///
    /// Database errors reach the caller through `error_type.from_diesel`, which the
    /// expansion spells as the handler's `From<diesel::result::Error>` conversion, so
    /// that a missing impl is reported at the handler's signature. A handler error that
    /// holds a database error (the body's own constraint violation) marks the span's
    /// `error.type` with its class.
    fn finish<T, E>(
        self,
        result: Result<T, E>,
        error_type: &HandlerErrorType<E>,
    ) -> Result<Outcome<T>, E> {
        let stopped = call::after_close(result, self.closed);
        self.delivery.finish(stopped, error_type)
    }
}

/// A delivery that ended before its body: a duplicate, or a database error.
pub struct Stopped {
    delivery: Delivery,
    stop: Stop<Infallible>,
}

impl Stopped {
    /// The handler's result.
    pub fn finish<T, E>(self, error_type: &HandlerErrorType<E>) -> Result<Outcome<T>, E> {
        self.delivery.finish(Err(self.stop.widen()), error_type)
    }
}

/// One delivery's report: its span, its start, and whether it read first.
struct Delivery {
    handler: &'static Handler,
    span: tracing::Span,
    started: Instant,
    read_first: bool,
}

impl Delivery {
    fn start(handler: &'static Handler, message_id: Option<&str>, fast_path: FastPath) -> Self {
        let read_first = fast_path.reads_first(&handler.recent_duplicates);
        Self {
            handler,
            span: report::delivery_span(
                handler.registration,
                message_id,
                "transaction",
                read_first,
            ),
            started: Instant::now(),
            read_first,
        }
    }

    /// The caller's result for how the delivery `stopped`, reported.
    fn finish<T, E>(
        self,
        stopped: Result<T, Stop<E>>,
        error_type: &HandlerErrorType<E>,
    ) -> Result<Outcome<T>, E> {
        match stopped {
            Ok(value) => {
                self.report(Ending::Processed);
                Ok(Outcome::Processed(value))
            }
            Err(Stop::Duplicate) => {
                self.report(Ending::Duplicate);
                Ok(Outcome::Duplicate)
            }
            Err(Stop::Handler(error)) => {
                self.report(Ending::HandlerError((error_type.database_class)(&error)));
                Err(error)
            }
            Err(Stop::Database(error)) => {
                self.report(Ending::DatabaseError);
                Err((error_type.from_diesel)(error))
            }
        }
    }

    fn report(self, ending: Ending) {
        let outcome = match ending {
            Ending::Processed => {
                self.handler.recent_duplicates.record(false);
                "processed"
            }
            Ending::Duplicate => {
                self.handler.recent_duplicates.record(true);
                report::duplicate(&self.span);
                "duplicate"
            }
            Ending::HandlerError(database_class) => {
                report::handler_error(&self.span, database_class);
                "handler_error"
            }
            Ending::DatabaseError => "database_error",
        };
        let elapsed = self.started.elapsed();
        report::finished(&self.span, self.handler.registration, outcome, elapsed);
    }
}

/// How a delivery ended, without the body's value or error.
enum Ending {
    Processed,
    Duplicate,
    HandlerError(Option<crate::classify::ErrorClass>),
    DatabaseError,
}

/// What [`open`] leaves for the body: the transaction the call runs in and the body's
/// scope, or why the body does not run.
type Opened = Result<(Enclosing, Scope), Stop<Infallible>>;

/// Everything before the body: the key checked, the fast path's read, then the call's
/// transaction begun with the marker in it (or a test transaction's savepoint). A
/// duplicate whose fingerprint differs is an error, and a database error comes
/// explained (see [`call::explained`]).
pub(crate) fn open<'c, C>(
    conn: &'c mut C,
    begin: Begin<C>,
    handler: &'static Handler,
    message_id: Result<String, InvalidKey>,
    read_first: bool,
    fingerprint: Option<Fingerprint>,
    span: &tracing::Span,
) -> impl Future<Output = Opened> + Send + 'c
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let explained_in = span.clone();
    let opened = async move {
        let opened = open_unexplained(
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
    opened.instrument(span.clone())
}

async fn open_unexplained<C>(
    conn: &mut C,
    begin: Begin<C>,
    handler: &'static Handler,
    message_id: Result<String, InvalidKey>,
    read_first: bool,
    fingerprint: Option<Fingerprint>,
) -> Opened
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
    let enclosing = enclosing_for_delivery(conn, consumer, [&marker.message_id])?;
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
    match (opened, fingerprint) {
        // The key is kept for the body's scope: the outbox derives its messages'
        // default ids from it.
        (Ok(enclosing), _) => Ok((enclosing, Scope::delivery(consumer, marker.message_id))),
        // A duplicate with another payload is the producer's bug, not a duplicate.
        (Err(Stop::Duplicate), Some(delivered)) => {
            crate::fingerprint::check_stored(conn, marker.message_id, consumer, &delivered).await?;
            Err(Stop::Duplicate)
        }
        (Err(stop), _) => Err(stop),
    }
}
