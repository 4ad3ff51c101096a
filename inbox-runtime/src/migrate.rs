use diesel::QueryResult;
use diesel_async::AsyncConnection;

use crate::backend::InboxBackend;
use crate::backend::sealed::Sealed as _;

/// Creates the inbox table and its unique index where they are missing.
///
/// Idempotent, and safe to call from several instances at once: each instance can call
/// it at start-up. It runs the same SQL as the migration folders shipped in
/// `migrations/<backend>/`, which you can copy into your own diesel migrations instead.
///
/// Each schema change waits at most a second at a time for its table's lock, and is
/// tried again after a pause, for about half a minute: handlers wait behind a schema
/// change while it waits, so a transaction left open on the table holds up `migrate`,
/// not them.
pub async fn migrate<C>(conn: &mut C) -> QueryResult<()>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    C::Backend::migrate(conn).await
}

/// Replaces the unique index of an inbox that diesel-inbox 0.2 created by the current
/// one, while handlers run. Call it once, from one instance, after every instance runs
/// this version: until then the inbox works on the old index as before.
///
/// 0.2's index holds both texts of each marker, about 88 bytes a marker filled by random
/// keys on PostgreSQL; the current one holds a 16-byte digest of them, about 41. On
/// PostgreSQL the new index is built `CONCURRENTLY` beside the old one, the two are
/// swapped in a transaction that waits at most a second for its lock (and tries again),
/// then the old one is dropped `CONCURRENTLY`. Handlers go on inserting throughout. The
/// build reads the whole table (19 s for 10 million markers on a 2-core machine), and
/// waits for transactions already open on the table to end. Run it on a connection of
/// its own, outside any transaction: inside one it returns
/// `Error::AlreadyInTransaction`, on MySQL/MariaDB too.
///
/// On MySQL/MariaDB the digest is a virtual column, `key_digest`, that `migrate` adds
/// (instantly); the index on it takes about 43 bytes a marker against 86. The upgrade is
/// one online `ALTER TABLE … ALGORITHM = INPLACE, LOCK = NONE`, which builds the new
/// index while inserts go on. It waits for the table's metadata lock at its start and
/// end, and statements on the table queue behind it meanwhile, so it runs with a
/// one-second `lock_wait_timeout`, and tries again. At the end of the build InnoDB applies
/// the inserts made during it to the new index while every insert into the table waits:
/// on an inbox whose index outgrows the buffer pool that is a page read per insert made
/// meanwhile (handlers stalled for 4.5 s at 10 million markers with the default 128 MiB
/// pool). On a Galera cluster the `ALTER` runs in total order (`wsrep_OSU_method =
/// TOI`) and holds up writes to the table on every node while it builds. Upgrade a large
/// inbox, and any inbox on a cluster, at a quiet time.
///
/// One upgrade runs at a time on a server: a second call waits for the first, an hour at
/// most. A call cut short is finished by the next one, which waits for what the server
/// still runs of the first: a statement whose client is gone runs to its end, and a
/// connection kept open after a call cut short holds the upgrade's lock until its next
/// call, or until it closes.
///
/// SQLite keeps its index on both texts: there is nothing to upgrade.
pub async fn upgrade_unique_index<C>(conn: &mut C) -> QueryResult<crate::schema::IndexUpgrade>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    C::Backend::upgrade_unique_index(conn).await
}
