//! How MySQL/MariaDB and SQLite prove, at COMMIT, that the transaction is still the one
//! that inserted this call's marker.
//!
//! A savepoint set in the transaction that holds the marker (on SQLite right after the
//! insert, on MySQL/MariaDB with `BEGIN`, ahead of it) lives exactly as long as that
//! transaction. Whatever ends the transaction underneath the body takes the savepoint
//! with it: InnoDB rolling it back after a deadlock, a lock wait timeout or a Galera
//! conflict, SQLite's `OR ROLLBACK`, an implicit commit by DDL on MySQL. So
//! `RELEASE SAVEPOINT …; COMMIT`, sent as one batch that the server abandons at its first
//! error, commits only that transaction, in one round trip. Asking instead whether *a*
//! marker with this key exists is fooled once the transaction is gone: another delivery,
//! which was waiting for the key, may have committed its own marker by then.
//!
//! A transaction can also end *without an error*. On a Galera node, another node's
//! commit aborts a local transaction from outside; when the abort lands on a statement
//! of a multi-statement batch that takes no row locks, the server reports a warning, not
//! the error, and runs the rest of the batch in a new transaction. So MySQL/MariaDB sets
//! the savepoint ahead of the marker insert, where it can only name the marker's
//! transaction, and on such a node checks its own marker row after the COMMIT, which an
//! abort landing on `RELEASE SAVEPOINT` leaves with nothing to commit. The check fails
//! quoting [`lost_marker!`].

use std::future::Future;

use diesel::QueryResult;
use diesel::result::Error;
use diesel_async::AsyncConnection;

use super::sealed::Sealed;
use super::{committed_early, leave_transaction, rolled_back_underneath};

/// Names the transaction that holds the marker.
macro_rules! savepoint {
    () => {
        "diesel_inbox_marker"
    };
}
pub(super) use savepoint;

/// Quoted by the error of a check that finds this call's marker row gone. It must not
/// contain the savepoint's name, which the same error would then seem to quote.
macro_rules! lost_marker {
    () => {
        "diesel_inbox_lost_marker"
    };
}
#[cfg(feature = "mysql")]
pub(super) use lost_marker;

/// A backend whose commit check is the savepoint.
pub(super) trait SavepointBackend: Sealed {
    /// Sends `RELEASE SAVEPOINT …; COMMIT`, then whatever restores the session, in one
    /// round trip where it can. A check that finds this call's marker gone fails with an
    /// error quoting [`lost_marker!`].
    fn release_and_commit<'c, C>(
        conn: &'c mut C,
    ) -> impl Future<Output = QueryResult<()>> + Send + use<'c, Self, C>
    where
        C: AsyncConnection<Backend = Self>;

    /// `RELEASE SAVEPOINT …; ROLLBACK`, then whatever restores the session.
    const RELEASE_AND_ROLLBACK: &'static str;

    /// `ROLLBACK`, then whatever restores the session.
    const ROLLBACK_AND_RESTORE: &'static str;

    /// Restores what the marker insert changed in the session, once the transaction is
    /// over by another way than the two batches above.
    fn restore_session<'c, C>(
        conn: &'c mut C,
    ) -> impl Future<Output = QueryResult<()>> + Send + use<'c, Self, C>
    where
        C: AsyncConnection<Backend = Self>;

    /// Once the savepoint was found gone and the transaction manager has been brought
    /// back outside a transaction: whether this call's marker is committed, which only
    /// an early commit does. A rollback leaves no marker of this call, though another
    /// delivery's marker for the same key may be there by now.
    fn own_marker_committed<'c, C>(
        conn: &'c mut C,
    ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, Self, C>
    where
        C: AsyncConnection<Backend = Self>;
}

/// [`Sealed::commit`] for a savepoint backend.
pub(super) async fn commit<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend: SavepointBackend>,
{
    match C::Backend::release_and_commit(conn).await {
        Ok(()) => leave_transaction(conn),
        Err(error) if quotes(&error, savepoint!()) => Err(match ended_early(conn).await {
            Ok(true) => committed_early(),
            Ok(false) => rolled_back_underneath(),
            Err(unknown) => unknown,
        }),
        // Whatever the COMMIT ended, it was not this call's transaction.
        Err(error) if quotes(&error, lost_marker!()) => {
            Err(roll_back_and_restore(conn, rolled_back_underneath()).await)
        }
        Err(error) => Err(roll_back_and_restore(conn, error).await),
    }
}

/// [`Sealed::abandon`] for a savepoint backend.
pub(super) async fn abandon<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend: SavepointBackend>,
{
    match conn.batch_execute(C::Backend::RELEASE_AND_ROLLBACK).await {
        Ok(()) => leave_transaction(conn),
        Err(error) if quotes(&error, savepoint!()) => {
            if ended_early(conn).await? {
                Err(committed_early())
            } else {
                // Rolled back underneath the body: its own error tells why.
                Ok(())
            }
        }
        Err(error) => Err(roll_back_and_restore(conn, error).await),
    }
}

/// Rolls back the transaction that `error` ended the use of, restores the session, and
/// returns `error`, which explains more than a failure of either.
pub(super) async fn roll_back_and_restore<C>(conn: &mut C, error: Error) -> Error
where
    C: AsyncConnection<Backend: SavepointBackend>,
{
    let _explained_by_error = roll_back_with_restore(conn).await;
    error
}

/// Rolls back and restores the session in one round trip: a call cancelled between two
/// would leave the session changed (autocommit off, on MySQL/MariaDB) on a connection
/// that looks idle. Where that batch fails (on SQLite, a ROLLBACK with no transaction
/// left to end), the transaction manager rolls back, then the session is restored.
pub(super) async fn roll_back_with_restore<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend: SavepointBackend>,
{
    use diesel_async::TransactionManager;

    if conn
        .batch_execute(C::Backend::ROLLBACK_AND_RESTORE)
        .await
        .is_ok()
    {
        return leave_transaction(conn);
    }
    match C::TransactionManager::rollback_transaction(conn).await {
        // The connection noticed the end itself (SQLite reports its autocommit state).
        Ok(()) | Err(Error::NotInTransaction) => {}
        Err(error) => return Err(error),
    }
    C::Backend::restore_session(conn).await
}

/// The transaction ended before the handler returned. Brings the transaction manager
/// back outside a transaction (the ROLLBACK finds none to end, or ends the one that the
/// statements after the end opened), restores the session, then says whether this
/// call's marker was committed.
async fn ended_early<C>(conn: &mut C) -> QueryResult<bool>
where
    C: AsyncConnection<Backend: SavepointBackend>,
{
    roll_back_with_restore(conn).await?;
    C::Backend::own_marker_committed(conn).await
}

/// Whether the batch failed at one of our own statements: at `RELEASE SAVEPOINT`
/// because the savepoint was gone, or at a check of the marker. The server quotes the
/// savepoint's name, and the value a check sets, in every language it reports errors in.
/// Only the name where it ends counts: a longer name that starts with it, such as
/// `diesel_inbox_marker_id` in a statement an error quotes, is not the savepoint
/// `diesel_inbox_marker`. (What comes before it may
/// be a letter: the Chinese message runs the kind and the name together.)
pub(super) fn quotes(error: &Error, ours: &str) -> bool {
    let Error::DatabaseError(_, info) = error else {
        return false;
    };
    let message = info.message();
    message.match_indices(ours).any(|(at, _)| {
        let after = message[at + ours.len()..].chars().next();
        !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

#[cfg(test)]
mod tests {
    use diesel::result::{DatabaseErrorKind, Error};

    use super::quotes;

    fn error(message: &str) -> Error {
        Error::DatabaseError(DatabaseErrorKind::Unknown, Box::new(message.to_owned()))
    }

    /// Each of our errors is told by the text it quotes, so neither text holds the other.
    #[test]
    fn a_lost_marker_is_not_taken_for_a_lost_savepoint() {
        assert!(!lost_marker!().contains(savepoint!()));
        assert!(!savepoint!().contains(lost_marker!()));
    }

    /// A name counts where the server quotes it, in any language's wording, and not as
    /// the start of a longer name, such as the variable that holds the marker's id.
    #[test]
    fn only_the_whole_name_is_quoted() {
        let ours = savepoint!();
        for quoted in [
            "SAVEPOINT diesel_inbox_marker does not exist",
            "SAVEPOINT diesel_inbox_marker existiert nicht",
            "SAVEPOINTdiesel_inbox_marker不存在",
        ] {
            assert!(quotes(&error(quoted), ours), "{quoted}");
        }
        for unquoted in [
            "You have an error in your SQL syntax near '@diesel_inbox_marker_id = 1'",
            "Deadlock found when trying to get lock",
        ] {
            assert!(!quotes(&error(unquoted), ours), "{unquoted}");
        }
    }
}
