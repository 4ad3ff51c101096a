//! The exactly-once transaction that every `#[idempotent]` handler runs.

use diesel::result::Error;
use diesel_async::AsyncConnection;
use diesel_async::TransactionManager;

use crate::backend::InboxBackend;
use crate::backend::sealed::{Backend as _, Marker};
use crate::fast_path::{DuplicateShare, FastPath};
use crate::key::InvalidKey;
use crate::outcome::Outcome;
use crate::registry::RegisteredHandler;
use crate::test_transaction;

/// One `#[idempotent]` handler as [`run`] sees it: its registration, and the recent
/// outcomes its adaptive fast path goes by.
#[doc(hidden)]
#[derive(Debug)]
pub struct Handler {
    registration: RegisteredHandler,
    recent_duplicates: DuplicateShare,
}

impl Handler {
    #[doc(hidden)]
    pub const fn new(registration: RegisteredHandler) -> Self {
        Self {
            registration,
            recent_duplicates: DuplicateShare::new(),
        }
    }
}

/// The error type of an `#[idempotent]` handler: one that database errors convert into.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the error type of an `#[idempotent]` handler",
    label = "this error type has no `From<diesel::result::Error>`",
    note = "the inbox's own database errors are returned through it: implement \
            `From<diesel::result::Error>` for `{Self}` (with thiserror, a `#[from]` variant)"
)]
pub trait HandlerError: Sized {
    /// Wraps a database error.
    fn from_diesel(error: Error) -> Self;
}

impl<E: From<Error>> HandlerError for E {
    fn from_diesel(error: Error) -> Self {
        Self::from(error)
    }
}

/// Why a call ended without committing.
pub(crate) enum Stop<E> {
    Duplicate,
    Database(Error),
    Handler(E),
}

impl<E> From<Error> for Stop<E> {
    fn from(error: Error) -> Self {
        Self::Database(error)
    }
}

impl<E> From<InvalidKey> for Stop<E> {
    fn from(invalid: InvalidKey) -> Self {
        Self::Database(invalid.into())
    }
}

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
/// 3. In one transaction: inserts the marker (waiting for any transaction that holds the
///    same key), runs `body` on the transaction's connection, and commits once it has
///    checked that the database did not roll the transaction back underneath `body`. A
///    marker already there rolls back and returns [`Outcome::Duplicate`]; `Err` from
///    `body` rolls back everything and is returned.
///
/// The returned future is `Send` exactly when `body`'s is, so a handler can be spawned
/// whenever its body could.
///
/// Database errors reach the caller through `into_error`, which the macro spells as the
/// handler's `From<diesel::result::Error>` conversion so that a missing impl is reported
/// at the handler's signature.
pub async fn run<C, T, E, F>(
    conn: &mut C,
    handler: &'static Handler,
    message_id: Result<String, InvalidKey>,
    fast_path: FastPath,
    into_error: fn(Error) -> E,
    body: F,
) -> Result<Outcome<T>, E>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    F: for<'r> AsyncFnOnce(&'r mut C) -> Result<T, E>,
{
    let read_first = fast_path.reads_first(&handler.recent_duplicates);
    match process(
        conn,
        handler.registration.consumer,
        message_id,
        read_first,
        body,
    )
    .await
    {
        Ok(value) => {
            handler.recent_duplicates.record(false);
            Ok(Outcome::Processed(value))
        }
        Err(Stop::Duplicate) => {
            handler.recent_duplicates.record(true);
            Ok(Outcome::Duplicate)
        }
        Err(Stop::Handler(error)) => Err(error),
        Err(Stop::Database(error)) => Err(into_error(error)),
    }
}

async fn process<C, T, E, F>(
    conn: &mut C,
    consumer: &'static str,
    message_id: Result<String, InvalidKey>,
    read_first: bool,
    body: F,
) -> Result<T, Stop<E>>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    F: for<'r> AsyncFnOnce(&'r mut C) -> Result<T, E>,
{
    let marker = Marker {
        message_id: message_id?,
        consumer,
    };
    let enclosing = enclosing_transaction(conn)?;
    if read_first && C::Backend::already_processed(conn, &marker).await? {
        return Err(Stop::Duplicate);
    }
    match enclosing {
        Enclosing::Nothing => process_in_own_transaction(conn, &marker, body).await,
        Enclosing::TestTransaction => test_transaction::process(conn, &marker, body).await,
    }
}

async fn process_in_own_transaction<C, T, E, F>(
    conn: &mut C,
    marker: &Marker,
    body: F,
) -> Result<T, Stop<E>>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    F: for<'r> AsyncFnOnce(&'r mut C) -> Result<T, E>,
{
    // Driven through the transaction manager rather than `AsyncConnection::transaction`,
    // which requires the closure's future to be `Send` for every lifetime: rustc cannot
    // prove that for concrete connection types (rust-lang/rust#100013), and a handler
    // must be spawnable whenever its body is.
    C::TransactionManager::begin_transaction(conn).await?;
    match C::Backend::insert_marker(conn, marker).await {
        Ok(true) => {}
        Ok(false) => return Err(roll_back(conn, Stop::Duplicate).await),
        Err(error) => return Err(roll_back(conn, Stop::Database(error)).await),
    }
    match body(&mut *conn).await {
        Ok(value) => {
            C::Backend::commit(conn, marker).await?;
            Ok(value)
        }
        Err(error) => match C::Backend::abandon(conn).await {
            Ok(()) => Err(Stop::Handler(error)),
            // A failure explains more than the broken rollback after it.
            Err(Error::BrokenTransactionManager) => Err(Stop::Handler(error)),
            Err(better) => Err(Stop::Database(better)),
        },
    }
}

/// Rolls back a transaction that the body never ran in.
async fn roll_back<C, E>(conn: &mut C, stop: Stop<E>) -> Stop<E>
where
    C: AsyncConnection,
{
    match C::TransactionManager::rollback_transaction(conn).await {
        Ok(()) => stop,
        Err(Error::BrokenTransactionManager) if !matches!(stop, Stop::Duplicate) => stop,
        Err(rollback) => Stop::Database(rollback),
    }
}

/// The transaction a call finds its connection in, where it can run.
enum Enclosing {
    Nothing,
    /// Opened by `begin_test_transaction`, and nothing open inside it.
    TestTransaction,
}

/// Refuses a connection inside any other transaction, or whose transaction state is
/// unknown.
fn enclosing_transaction<C: AsyncConnection>(conn: &mut C) -> Result<Enclosing, Error> {
    if test_transaction::is_open(conn) {
        return Ok(Enclosing::TestTransaction);
    }
    let status = C::TransactionManager::transaction_manager_status_mut(conn);
    if status.transaction_depth()?.is_some() {
        return Err(Error::AlreadyInTransaction);
    }
    // Set when a future was dropped while BEGIN, COMMIT or ROLLBACK was in flight.
    if C::TransactionManager::is_broken_transaction_manager(conn) {
        return Err(Error::BrokenTransactionManager);
    }
    Ok(Enclosing::Nothing)
}
