//! PostgreSQL: the unique index on the key's digest, and the upgrade of 0.2's index on
//! both texts while handlers run.
//!
//! The statements work with either index (see `markers.rs`), so an inbox can run on
//! 0.2's until [`upgrade_unique_index`] swaps it.

use std::time::Duration;

use diesel::QueryResult;
use diesel::sql_types::Bool;
use diesel_async::{AsyncConnection, RunQueryDsl};

use super::{MIGRATE_LOCK, ddl};
use crate::schema::IndexUpgrade;

/// The `key_digest` migration: the digest function, and its index where the inbox is
/// empty.
const KEY_DIGEST: &str =
    include_str!("../../../migrations/postgres/2026-12-05-000000_key_digest/up.sql");

/// The new index's name while it is built beside 0.2's.
const BUILDING: &str = "ux_inbox_key_digest";

/// 0.2's index's name between the swap and its drop.
const RETIRED: &str = "ux_inbox_message_consumer_0_2";

/// Lets one upgrade run at a time, and a call after one cut short wait for the server to
/// end the statement the first left running (a build whose client is gone runs to its
/// end): two builds, or a build and the drop of the other's unfinished index, wait for
/// each other until PostgreSQL aborts one as a deadlock. The value spells "inboxupg".
const UPGRADE_LOCK: i64 = 0x696e_626f_7875_7067;

/// What the session sees of the digest: its function, and whether the unique index is on
/// it.
#[derive(diesel::QueryableByName)]
struct DigestState {
    #[diesel(sql_type = Bool)]
    function: bool,
    #[diesel(sql_type = Bool)]
    index: bool,
}

async fn digest_state<C>(conn: &mut C) -> QueryResult<DigestState>
where
    C: AsyncConnection<Backend = diesel::pg::Pg>,
{
    diesel::sql_query(
        // pg_depend, read in the statement's snapshot: pg_get_indexdef reads the catalog
        // caches, and fails on an index that a concurrent migration drops.
        "SELECT to_regprocedure('inbox_key_digest(text,text)') IS NOT NULL AS function, \
         EXISTS (SELECT FROM pg_depend WHERE classid = 'pg_class'::regclass \
         AND objid = to_regclass('ux_inbox_message_consumer') \
         AND refclassid = 'pg_proc'::regclass \
         AND refobjid = to_regprocedure('inbox_key_digest(text,text)')) AS index",
    )
    .get_result(conn)
    .await
}

/// Runs the `key_digest` migration where its function or index is missing. An empty
/// inbox gets the digest's index at once; one with markers keeps 0.2's, which only
/// [`upgrade_unique_index`] replaces without stopping the handlers.
pub(super) async fn migrate_key_digest<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend = diesel::pg::Pg>,
{
    let state = digest_state(conn).await?;
    if state.function && state.index {
        return Ok(());
    }
    // With markers the migration would only define the function again: an inbox of
    // 0.2 that has it gets no DDL, which a role without the right to create runs on.
    let markers = "SELECT EXISTS (SELECT FROM inbox) AS value";
    if !state.function || !flag(conn, markers).await? {
        ddl::with_short_lock_waits(conn, Some(MIGRATE_LOCK), KEY_DIGEST).await?;
    }
    if !digest_state(conn).await?.index {
        crate::backend::warn_of_the_index_of_0_2(88, 41);
    }
    Ok(())
}

/// Replaces 0.2's unique index by the digest's, without stopping the handlers:
///
/// 1. builds the new index `CONCURRENTLY` beside the old one, so that inserts go on
///    while it reads the table and both indexes guard them once it is done;
/// 2. swaps the names in a transaction that waits at most a second for its locks, and
///    tries again after a pause when it times out;
/// 3. drops the old index `CONCURRENTLY`.
///
/// Each step can be run again: an upgrade cut short is finished by the next call, once
/// the server has ended what the first left running ([`UPGRADE_LOCK`]).
pub(super) async fn upgrade_unique_index<C>(conn: &mut C) -> QueryResult<IndexUpgrade>
where
    C: AsyncConnection<Backend = diesel::pg::Pg>,
{
    // Its concurrent builds cannot run in a transaction, and a failed statement there
    // would abort the lock's release too, leaving the connection holding the lock.
    crate::backend::outside_a_transaction(conn)?;
    take_upgrade_lock(conn).await?;
    let upgrade = upgrade_locked(conn).await;
    let unlocked = release_upgrade_lock(conn).await;
    let upgrade = upgrade?;
    unlocked.map(|()| upgrade)
}

/// Releases [`UPGRADE_LOCK`] as often as this session holds it: a call cut short on
/// this connection left it taken once more.
async fn release_upgrade_lock<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend = diesel::pg::Pg>,
{
    let unlock = format!("SELECT pg_advisory_unlock({UPGRADE_LOCK}) AS value");
    while flag(conn, &unlock).await? {}
    Ok(())
}

/// Takes [`UPGRADE_LOCK`], trying every second for an hour at most. Tried rather than
/// waited for: a statement waiting for it would hold a snapshot, which the build it
/// waits for waits for in turn.
async fn take_upgrade_lock<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend = diesel::pg::Pg>,
{
    let try_lock = format!("SELECT pg_try_advisory_lock({UPGRADE_LOCK}) AS value");
    for _ in 0..3600 {
        if flag(conn, &try_lock).await? {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Err(diesel::result::Error::QueryBuilderError(
        "another diesel-inbox upgrade held the inbox's upgrade lock for an hour".into(),
    ))
}

async fn upgrade_locked<C>(conn: &mut C) -> QueryResult<IndexUpgrade>
where
    C: AsyncConnection<Backend = diesel::pg::Pg>,
{
    migrate_key_digest(conn).await?;
    let upgrade = if digest_state(conn).await?.index {
        IndexUpgrade::Current
    } else {
        build(conn).await?;
        swap(conn).await?;
        IndexUpgrade::Rebuilt
    };
    // Dropped only where it is there: a read-only session finds nothing to do.
    let retired = format!("SELECT to_regclass('{RETIRED}') IS NOT NULL AS value");
    if flag(conn, &retired).await? {
        conn.batch_execute(&format!("DROP INDEX CONCURRENTLY IF EXISTS {RETIRED}"))
            .await?;
    }
    Ok(upgrade)
}

/// Builds the digest's index under [`BUILDING`], beside 0.2's. A build cut short leaves
/// an invalid index behind, which is dropped and built again.
async fn build<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend = diesel::pg::Pg>,
{
    let invalid = format!(
        "SELECT COALESCE((SELECT NOT indisvalid FROM pg_index \
         WHERE indexrelid = to_regclass('{BUILDING}')), false) AS value"
    );
    if flag(conn, &invalid).await? {
        conn.batch_execute(&format!("DROP INDEX CONCURRENTLY IF EXISTS {BUILDING}"))
            .await?;
    }
    conn.batch_execute(&format!(
        "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {BUILDING} \
         ON inbox (inbox_key_digest(consumer, message_id))"
    ))
    .await
}

/// Gives the digest's index the contract's name, and 0.2's the name [`RETIRED`], in one
/// transaction: `ALTER INDEX … RENAME` takes no lock that blocks inserts, only one that
/// waits for other schema changes, for a second at a time.
async fn swap<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection<Backend = diesel::pg::Pg>,
{
    let swap = format!(
        "ALTER INDEX ux_inbox_message_consumer RENAME TO {RETIRED}; \
         ALTER INDEX {BUILDING} RENAME TO ux_inbox_message_consumer"
    );
    ddl::with_short_lock_waits(conn, None, &swap).await
}

/// A truth a query selects as `value`.
#[derive(diesel::QueryableByName)]
struct Flag {
    #[diesel(sql_type = Bool)]
    value: bool,
}

async fn flag<C>(conn: &mut C, query: &str) -> QueryResult<bool>
where
    C: AsyncConnection<Backend = diesel::pg::Pg>,
{
    Ok(diesel::sql_query(query)
        .get_result::<Flag>(conn)
        .await?
        .value)
}
