//! MySQL/MariaDB: the statements a call sends outside any transaction of the crate's.

use diesel::QueryResult;
use diesel::mysql::Mysql;
use diesel_async::AsyncConnection;

use crate::backend::InFlight;
use crate::enclosing::{Enclosing, enclosing_transaction};

/// A call's statements sent outside any transaction of the crate's (claim mode's, the
/// fast path's read): whether what they do commits on its own, and the connection
/// marked in flight until their answers are in ([`InFlight`]: a call dropped before
/// then would leave the next user of the connection reading this one's answers).
pub(super) struct Call {
    /// No transaction encloses the call: what it does commits on its own. Inside a test
    /// transaction, or an operator's call inside the caller's transaction, it is part
    /// of that transaction instead.
    pub(super) commits: bool,
    in_flight: InFlight,
}

impl Call {
    pub(super) fn start<C: AsyncConnection>(conn: &mut C) -> QueryResult<Self> {
        let commits = matches!(enclosing_transaction(conn), Ok(Enclosing::Nothing));
        Ok(Self {
            commits,
            in_flight: InFlight::mark(conn)?,
        })
    }

    /// `statement`'s result, once what it did is committed. Where the session has
    /// autocommit off (a server's `autocommit = 0`, an `init_connect`, a body's `SET
    /// autocommit = 0`), the statement opened a transaction that nobody would commit:
    /// other deliveries would never see a claim, or its completion, and a read would
    /// keep its locks while the connection idles. With
    /// autocommit on there is no transaction, and the `COMMIT` does nothing. Turning
    /// autocommit on for the delivery instead would have to be undone on every way out
    /// of it, a cancellation included, and claims nested on one connection would undo
    /// each other's.
    pub(super) async fn committed<T, C>(
        self,
        conn: &mut C,
        statement: QueryResult<T>,
    ) -> QueryResult<T>
    where
        C: AsyncConnection<Backend = Mysql>,
    {
        let committed = if self.commits {
            committed(conn, statement).await
        } else {
            statement
        };
        self.answered(conn, committed)
    }

    /// `result`, the call's answers all in.
    pub(super) fn answered<T, C: AsyncConnection>(
        self,
        conn: &mut C,
        result: QueryResult<T>,
    ) -> QueryResult<T> {
        self.in_flight.answered(conn);
        result
    }
}

/// `statement`'s result, once what it did is committed, for a statement sent where no
/// transaction is open: where the session has autocommit off, it opened one, which
/// nothing else would end (see [`Call::committed`]). One that failed is rolled back:
/// what it locked before it failed would stay locked otherwise.
pub(super) async fn committed<T, C>(conn: &mut C, statement: QueryResult<T>) -> QueryResult<T>
where
    C: AsyncConnection<Backend = Mysql>,
{
    match statement {
        Ok(result) => conn.batch_execute("COMMIT").await.map(|()| result),
        Err(error) => {
            let _explained_by_error = conn.batch_execute("ROLLBACK").await;
            Err(error)
        }
    }
}
