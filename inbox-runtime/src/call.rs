//! The steps a transactional or batch call takes after its body, whatever the body's
//! types: compiled once per connection type rather than once per handler.

use diesel::result::Error;
use diesel_async::AsyncConnection;
use tracing::Instrument as _;

use crate::backend::InboxBackend;
use crate::backend::sealed::Sealed as _;
use crate::classify::classify;
use crate::enclosing::Enclosing;
use crate::outcome::Stop;
use crate::session_check;
use crate::test_transaction;

/// Commits what the call began when its body `succeeded`, rolls it back otherwise.
/// `Err` is a database error, explained, that replaces the body's result: a failed
/// commit, or a rollback that failed in a way that explains more than the body's own
/// error.
pub(crate) fn close<'c, C>(
    conn: &'c mut C,
    enclosing: Enclosing,
    succeeded: bool,
    span: &tracing::Span,
) -> impl Future<Output = Result<(), Error>> + Send + 'c
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let explained_in = span.clone();
    let closed = async move {
        match close_unexplained(&mut *conn, enclosing, succeeded).await {
            Ok(()) => Ok(()),
            Err(error) => Err(explain(conn, error, &explained_in).await),
        }
    };
    closed.instrument(span.clone())
}

/// The call's result once [`close`] has ended its transaction: the body's, unless the
/// close failed, whose error then replaces it.
pub(crate) fn after_close<T, E>(
    result: Result<T, E>,
    closed: Result<(), Error>,
) -> Result<T, Stop<E>> {
    closed.map_err(Stop::Database)?;
    result.map_err(Stop::Handler)
}

async fn close_unexplained<C>(
    conn: &mut C,
    enclosing: Enclosing,
    succeeded: bool,
) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    match (enclosing, succeeded) {
        (Enclosing::Nothing, true) => C::Backend::commit(conn).await,
        (Enclosing::Nothing, false) => match C::Backend::abandon(conn).await {
            Ok(()) | Err(Error::BrokenTransactionManager) => Ok(()),
            Err(better) => Err(better),
        },
        (Enclosing::TestTransaction, true) => test_transaction::release(conn).await,
        (Enclosing::TestTransaction, false) => {
            let _explained_by_error = test_transaction::roll_back(conn).await;
            Ok(())
        }
    }
}

/// A step's result, with the database error that ended it explained (see [`explain`]).
pub(crate) async fn explained<C, T, E>(
    conn: &mut C,
    result: Result<T, Stop<E>>,
    span: &tracing::Span,
) -> Result<T, Stop<E>>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    match result {
        Err(Stop::Database(error)) => Err(Stop::Database(explain(conn, error, span).await)),
        result => result,
    }
}

/// A database error that ends the call, explained where the session's settings are the
/// cause, and recorded on the call's span.
async fn explain<C>(conn: &mut C, error: Error, span: &tracing::Span) -> Error
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let error = session_check::explain(conn, error).await;
    span.record("error.type", tracing::field::debug(classify(&error)));
    tracing::debug!(
        target: "diesel_inbox",
        parent: span,
        error = %error,
        "nothing was committed"
    );
    error
}
