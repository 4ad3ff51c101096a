//! MySQL and MariaDB: schema changes of the inbox while handlers run. A statement that
//! waits for the inbox's metadata lock holds up every statement on the inbox behind it,
//! so it waits a second at a time; and one upgrade runs at a time.

use std::time::Duration;

use diesel::QueryResult;
use diesel::mysql::Mysql;
use diesel::result::Error;
use diesel::sql_types::{BigInt, Nullable};
use diesel_async::{AsyncConnection, RunQueryDsl};

use crate::backend::InFlight;

/// Attempts at a statement that waits for a lock, each for a second at most, before the
/// upgrade reports the time-out.
const LOCK_ATTEMPTS: u32 = 30;

/// The named lock that lets one upgrade run at a time on a server.
const UPGRADE_LOCK: &str = "diesel_inbox_upgrade";

/// Refuses a connection inside a transaction, a test transaction's included: MySQL
/// commits the open transaction before each schema change, so the caller's (the test's
/// business writes and markers) would end unseen, and a handler's after it commit for
/// real.
fn outside_any_transaction<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend = Mysql>,
{
    use diesel_async::TransactionManager as _;

    let status = C::TransactionManager::transaction_manager_status_mut(conn);
    match status.transaction_depth()? {
        Some(_) => Err(Error::AlreadyInTransaction),
        None => Ok(()),
    }
}

/// `statement`, which waits for the inbox's metadata lock while statements on the
/// inbox queue behind it: under a one-second `lock_wait_timeout`, tried again after a
/// pause that lets the queue drain. Called within [`marked`], which keeps a call dropped
/// midway from handing the one-second setting to a pool's next user.
pub(super) async fn with_short_lock_waits<C>(conn: &mut C, statement: &str) -> QueryResult<()>
where
    C: AsyncConnection<Backend = Mysql>,
{
    conn.batch_execute(
        "SET @diesel_inbox_lock_wait_timeout = @@SESSION.lock_wait_timeout, \
         SESSION lock_wait_timeout = 1",
    )
    .await?;
    let mut attempt = 1;
    let done = loop {
        match conn.batch_execute(statement).await {
            Err(Error::DatabaseError(_, info))
                if attempt < LOCK_ATTEMPTS && super::is_transient(info.message()) => {}
            result => break result,
        }
        attempt += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let restored = conn
        .batch_execute(
            "SET SESSION lock_wait_timeout = @diesel_inbox_lock_wait_timeout, \
             @diesel_inbox_lock_wait_timeout = NULL",
        )
        .await;
    done.and(restored)
}

/// Marks `conn` as broken (see [`InFlight`]) for a schema change's whole call, after
/// refusing one inside a transaction ([`outside_any_transaction`]): a call dropped
/// midway leaves a statement's answer in flight, which the connection's next statement
/// would read as its own ("packet out of order"), or the session's `lock_wait_timeout`
/// at a second ([`with_short_lock_waits`]). Pools discard a connection so marked. Pass
/// the result of the call to [`Marked::done`].
pub(super) fn marked<C>(conn: &mut C) -> QueryResult<Marked>
where
    C: AsyncConnection<Backend = Mysql>,
{
    outside_any_transaction(conn)?;
    InFlight::mark(conn).map(Marked)
}

/// A schema change's call under way; see [`marked`].
#[must_use = "the connection reads as broken until the call is `done`"]
pub(super) struct Marked(InFlight);

impl Marked {
    /// The call has ended with `result`, every statement answered: the connection is as
    /// it was.
    pub(super) fn done<C, T>(self, conn: &mut C, result: QueryResult<T>) -> QueryResult<T>
    where
        C: AsyncConnection<Backend = Mysql>,
    {
        self.0.answered(conn);
        result
    }
}

/// Takes the upgrade's named lock, waiting an hour at most for another upgrade to end.
/// Taken again by the session that holds it, from a call cut short on this connection.
pub(super) async fn take_upgrade_lock<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend = Mysql>,
{
    let lock = format!("SELECT GET_LOCK('{UPGRADE_LOCK}', 3600) AS value");
    if number(conn, &lock).await? == Some(1) {
        Ok(())
    } else {
        Err(Error::QueryBuilderError(
            "another diesel-inbox upgrade held the inbox's upgrade lock for an hour".into(),
        ))
    }
}

/// Releases the upgrade's named lock as often as this session holds it: a call cut
/// short on this connection left it taken once more.
pub(super) async fn release_upgrade_lock<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend = Mysql>,
{
    let release = format!("SELECT RELEASE_LOCK('{UPGRADE_LOCK}') AS value");
    while number(conn, &release).await? == Some(1) {}
    Ok(())
}

/// A number a query selects as `value`.
#[derive(diesel::QueryableByName)]
struct Number {
    #[diesel(sql_type = Nullable<BigInt>)]
    value: Option<i64>,
}

pub(super) async fn number<C>(conn: &mut C, query: &str) -> QueryResult<Option<i64>>
where
    C: AsyncConnection<Backend = Mysql>,
{
    Ok(diesel::sql_query(query)
        .get_result::<Number>(conn)
        .await?
        .value)
}
