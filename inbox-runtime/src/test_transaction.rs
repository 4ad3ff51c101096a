//! Handlers called inside a test transaction.
//!
//! `begin_test_transaction` opens a transaction that never commits, so that a test leaves
//! nothing behind, and diesel's transaction manager marks it as such. A handler called
//! directly inside one runs on a savepoint instead of a transaction of its own: releasing
//! the savepoint stands in for COMMIT and rolling back to it for ROLLBACK, so the test
//! sees what a committed, duplicate or failed call leaves, and the connection stays in
//! its test transaction. Every other open transaction is still refused, a handler called
//! inside a handler's body or a `conn.transaction` in the test included: committing
//! there would not be a real commit.

use std::convert::Infallible;

use diesel::QueryResult;
use diesel::connection::{TransactionDepthChange, TransactionManagerStatus};
use diesel::result::{DatabaseErrorKind, Error};
use diesel_async::{AsyncConnection, TransactionManager};

use crate::backend::InboxBackend;
use crate::backend::sealed::{Marker, Sealed as _};
use crate::outcome::Stop;

/// Set where a call's transaction would begin.
macro_rules! savepoint {
    () => {
        "diesel_inbox_test_call"
    };
}

/// Ends the call's savepoint as a ROLLBACK would, leaving the test transaction as the
/// call found it.
const ROLL_BACK_TO_SAVEPOINT: &str = concat!(
    "ROLLBACK TO SAVEPOINT ",
    savepoint!(),
    "; RELEASE SAVEPOINT ",
    savepoint!()
);

/// Begins the call as [`crate::begin_transaction`] does, on a savepoint of the test transaction with
/// the marker in it; [`release`] or [`roll_back`] ends it.
pub(crate) async fn open<C>(conn: &mut C, marker: &Marker) -> Result<(), Stop<Infallible>>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    begin(conn).await?;
    match C::Backend::insert_marker(conn, marker).await {
        Ok(true) => Ok(()),
        Ok(false) => {
            roll_back(conn).await?;
            Err(Stop::Duplicate)
        }
        Err(error) => {
            let _explained_by_error = roll_back(conn).await;
            Err(Stop::Database(error))
        }
    }
}

/// Sets the savepoint where the call's transaction would begin.
pub(crate) async fn begin<C: AsyncConnection>(conn: &mut C) -> QueryResult<()> {
    conn.batch_execute(concat!("SAVEPOINT ", savepoint!()))
        .await?;
    // Counted as a level of transaction, as diesel counts its own savepoints: a handler
    // inside the body is then refused, as it would be outside a test.
    change_depth(conn, TransactionDepthChange::IncreaseDepth)
}

/// Releases the savepoint, as COMMIT would end the call's transaction. That fails where
/// the database aborted the transaction under a body that swallowed the error
/// (PostgreSQL), and where the test transaction itself ended (a deadlock on MySQL,
/// `OR ROLLBACK` on SQLite, DDL on MySQL): the savepoint is gone with it.
pub(crate) async fn release<C: AsyncConnection>(conn: &mut C) -> QueryResult<()> {
    match conn
        .batch_execute(concat!("RELEASE SAVEPOINT ", savepoint!()))
        .await
    {
        Ok(()) => change_depth(conn, TransactionDepthChange::DecreaseDepth),
        // Rolling back to the savepoint recovers an aborted transaction.
        Err(_) => Err(match roll_back(conn).await {
            Ok(()) => crate::backend::rolled_back_underneath(),
            Err(_) => test_transaction_ended(),
        }),
    }
}

/// Rolls back to the savepoint. Where it is gone, so is the test transaction, and the
/// connection's transaction manager is marked broken: its count of open transactions
/// no longer holds.
pub(crate) async fn roll_back<C: AsyncConnection>(conn: &mut C) -> QueryResult<()> {
    match conn.batch_execute(ROLL_BACK_TO_SAVEPOINT).await {
        Ok(()) => change_depth(conn, TransactionDepthChange::DecreaseDepth),
        Err(error) => {
            C::TransactionManager::transaction_manager_status_mut(conn).set_in_error();
            Err(error)
        }
    }
}

fn change_depth<C: AsyncConnection>(
    conn: &mut C,
    change: TransactionDepthChange,
) -> QueryResult<()> {
    match C::TransactionManager::transaction_manager_status_mut(conn) {
        TransactionManagerStatus::Valid(status) => status.change_transaction_depth(change),
        TransactionManagerStatus::InError => Err(Error::BrokenTransactionManager),
    }
}

/// The savepoint and the test transaction around it are gone: the database rolled the
/// test transaction back, or a statement committed it.
fn test_transaction_ended() -> Error {
    Error::DatabaseError(
        DatabaseErrorKind::Unknown,
        Box::new(String::from(
            "the test transaction ended before the handler returned: the database rolled \
             it back (a deadlock, SQLite's OR ROLLBACK) or a statement committed it (DDL \
             on MySQL/MariaDB); this connection's transaction state is unknown",
        )),
    )
}
