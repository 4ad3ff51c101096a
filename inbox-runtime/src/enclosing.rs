//! Where a handler finds its connection: outside any transaction, inside a test
//! transaction (`begin_test_transaction`), or somewhere it must not run. Every mode asks
//! before it writes.

use diesel::result::Error;
use diesel_async::{AsyncConnection, TransactionManager};

use crate::NestedHandler;
use crate::body_scope;

/// The transaction a call finds its connection in, where it can run.
#[derive(Clone, Copy)]
pub(crate) enum Enclosing {
    Nothing,
    /// Opened by `begin_test_transaction`, and nothing open inside it.
    TestTransaction,
}

/// Refuses a connection inside any other transaction, or whose transaction state is
/// unknown.
pub(crate) fn enclosing_transaction<C: AsyncConnection>(conn: &mut C) -> Result<Enclosing, Error> {
    if in_test_transaction(conn) {
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

/// Whether `conn` is inside a test transaction and in nothing else.
pub(crate) fn in_test_transaction<C: AsyncConnection>(conn: &mut C) -> bool {
    // diesel keeps the test flag private. It shows as an open transaction that
    // `is_broken_transaction_manager`, which pools ask before reusing a connection,
    // accepts. Depth 1 leaves out the savepoints of `conn.transaction` and of a handler
    // running inside it.
    let depth = C::TransactionManager::transaction_manager_status_mut(conn).transaction_depth();
    matches!(depth, Ok(Some(depth)) if depth.get() == 1)
        && !C::TransactionManager::is_broken_transaction_manager(conn)
}

/// [`enclosing_transaction`], for a handler of `consumer` about to begin its delivery of
/// `message_ids`. Inside another handler's body on this thread, an open transaction is
/// that body's, and the same message under the same consumer is the caller's own: each
/// a mistake of the code, [`NestedHandler`], which no redelivery mends. (Outside any
/// body, an open transaction is a pool's broken connection, or the caller's.)
pub(crate) fn enclosing_for_delivery<'k, C: AsyncConnection>(
    conn: &mut C,
    consumer: &'static str,
    message_ids: impl IntoIterator<Item = &'k String>,
) -> Result<Enclosing, Error> {
    if let Some(message_id) = message_ids
        .into_iter()
        .find(|message_id| body_scope::holds_the_marker_of(consumer, message_id))
    {
        return Err(NestedHandler::SameMessage {
            consumer,
            message_id: message_id.clone(),
        }
        .into());
    }
    match enclosing_transaction(conn) {
        Err(Error::AlreadyInTransaction) if body_scope::in_a_body() => {
            Err(NestedHandler::InATransaction { consumer }.into())
        }
        enclosing => enclosing,
    }
}
