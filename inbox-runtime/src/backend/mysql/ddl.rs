//! MySQL and MariaDB: schema changes of the inbox while handlers run. A statement that
//! waits for the inbox's metadata lock holds up every statement on the inbox behind it,
//! so it waits a second at a time; and one upgrade runs at a time.

use std::time::Duration;

use diesel::QueryResult;
use diesel::mysql::Mysql;
use diesel::result::Error;
use diesel::sql_types::{BigInt, Nullable};
use diesel_async::{AsyncConnection, RunQueryDsl};

/// Attempts at a statement that waits for a lock, each for a second at most, before the
/// time-out is reported.
const LOCK_ATTEMPTS: u32 = 30;

/// The named lock that lets one upgrade run at a time on a server.
const UPGRADE_LOCK: &str = "diesel_inbox_upgrade";

/// `statement`, which waits for the inbox's metadata lock while statements on the
/// inbox queue behind it: under a one-second `lock_wait_timeout`, tried again after a
/// pause that lets the queue drain. Called with the connection marked (see
/// [`InFlight`](crate::backend::InFlight)), which keeps a call dropped midway from
/// handing the one-second setting to a pool's next user.
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

/// Takes the upgrade's named lock, waiting an hour at most for another upgrade to end.
/// Taken again by the session that holds it, from a call cut short on this connection.
pub(super) async fn take_upgrade_lock<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend = Mysql>,
{
    let lock = format!("SELECT GET_LOCK('{UPGRADE_LOCK}', 3600) AS value LIMIT 1");
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
    let release = format!("SELECT RELEASE_LOCK('{UPGRADE_LOCK}') AS value LIMIT 1");
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
