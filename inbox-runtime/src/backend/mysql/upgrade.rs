//! MySQL and MariaDB: the unique index on the key's digest, a virtual column, and the
//! upgrade of 0.2's index on both texts while handlers run.
//!
//! The statements work with either index (see `markers.rs`), so an inbox can run on
//! 0.2's until [`upgrade_unique_index`] swaps it.

use diesel::QueryResult;
use diesel::mysql::Mysql;
use diesel::sql_types::Bool;
use diesel_async::{AsyncConnection, RunQueryDsl};

use super::ddl;
use crate::backend::{InFlight, outside_a_transaction};
use crate::schema::{INDEX_NAME, IndexUpgrade};

const ADD_DIGEST_COLUMN: &str =
    include_str!("../../../migrations/mysql/2026-12-05-000000_key_digest/up.sql");

const SWAP_INDEX: &str =
    include_str!("../../../migrations/mysql/2026-12-05-000001_key_digest_index/up.sql");

/// What the session sees of the digest: its column, and whether the unique index is on
/// it.
#[derive(diesel::QueryableByName)]
struct DigestState {
    #[diesel(sql_type = Bool)]
    column: bool,
    #[diesel(sql_type = Bool)]
    index: bool,
}

async fn digest_state<C>(conn: &mut C) -> QueryResult<DigestState>
where
    C: AsyncConnection<Backend = Mysql>,
{
    diesel::sql_query(format!(
        "SELECT EXISTS (SELECT 1 FROM information_schema.columns \
         WHERE table_schema = DATABASE() AND table_name = 'inbox' \
         AND column_name = 'key_digest') AS `column`, \
         EXISTS (SELECT 1 FROM information_schema.statistics \
         WHERE table_schema = DATABASE() AND table_name = 'inbox' \
         AND index_name = '{INDEX_NAME}' AND column_name = 'key_digest') AS `index` LIMIT 1"
    ))
    .get_result(conn)
    .await
}

/// Adds the digest's column where it is missing, and swaps the unique index onto it
/// where the inbox is empty. One with markers keeps 0.2's index, which only
/// [`upgrade_unique_index`] replaces while handlers run.
pub(super) async fn migrate_key_digest<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend = Mysql>,
{
    let state = digest_state(conn).await?;
    if !state.column {
        // A concurrent migration's 1060 "Duplicate column name" is success for us.
        match ddl::with_short_lock_waits(conn, ADD_DIGEST_COLUMN).await {
            Err(_) if digest_state(conn).await?.column => {}
            result => result?,
        }
    }
    if state.index {
        return Ok(());
    }
    let any = "SELECT COUNT(*) AS value FROM (SELECT 1 FROM inbox LIMIT 1) AS any LIMIT 1";
    if ddl::number(conn, any).await? == Some(0) {
        swap(conn).await
    } else {
        crate::backend::warn_of_the_index_of_0_2(86, 43);
        Ok(())
    }
}

/// Replaces 0.2's unique index by the digest's while handlers run, one upgrade at a
/// time, by one online `ALTER TABLE`.
pub(super) async fn upgrade_unique_index<C>(conn: &mut C) -> QueryResult<IndexUpgrade>
where
    C: AsyncConnection<Backend = Mysql>,
{
    // Marked as `migrate` is.
    outside_a_transaction(conn)?;
    let in_flight = InFlight::mark(conn)?;
    let upgrade = upgrade_marked(conn).await;
    in_flight.answered(conn);
    upgrade
}

async fn upgrade_marked<C>(conn: &mut C) -> QueryResult<IndexUpgrade>
where
    C: AsyncConnection<Backend = Mysql>,
{
    migrate_key_digest(conn).await?;
    if digest_state(conn).await?.index {
        return Ok(IndexUpgrade::Current);
    }
    ddl::take_upgrade_lock(conn).await?;
    let upgrade = upgrade_locked(conn).await;
    let released = ddl::release_upgrade_lock(conn).await;
    let upgrade = upgrade?;
    released.map(|()| upgrade)
}

async fn upgrade_locked<C>(conn: &mut C) -> QueryResult<IndexUpgrade>
where
    C: AsyncConnection<Backend = Mysql>,
{
    // Another upgrade may have finished while this one waited for the lock.
    if digest_state(conn).await?.index {
        return Ok(IndexUpgrade::Current);
    }
    swap(conn).await?;
    Ok(IndexUpgrade::Rebuilt)
}

/// [`SWAP_INDEX`], one online `ALTER TABLE`, which builds the new index while inserts go
/// on. It waits for the table's metadata lock at its start and end, and statements on
/// the table queue behind it while it waits: a one-second `lock_wait_timeout` bounds
/// that wait, and the swap is tried again.
async fn swap<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend = Mysql>,
{
    match ddl::with_short_lock_waits(conn, SWAP_INDEX).await {
        // A concurrent swap got there first.
        Err(_) if digest_state(conn).await?.index => Ok(()),
        result => result,
    }
}
