use diesel::QueryResult;
use diesel_async::AsyncConnection;

use crate::backend::InboxBackend;
use crate::backend::sealed::Sealed as _;

/// Creates the inbox table and its unique index where they are missing.
///
/// Idempotent, and safe to call from several instances at once: each instance can call
/// it at start-up. It runs the same SQL as the migration folders shipped in
/// `migrations/<backend>/`, which you can copy into your own diesel migrations instead.
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
/// On PostgreSQL, 0.2's index holds both texts of each marker, about 88 bytes a marker
/// filled by random keys; the current one holds a 16-byte digest of them, about 40. The
/// new index is built `CONCURRENTLY` beside the old one, the two are swapped in a
/// transaction that waits at most a second for its lock (and tries again), then the old
/// one is dropped `CONCURRENTLY`. Handlers go on inserting throughout. The build reads
/// the whole table: about a minute per 10 million markers, and it waits for
/// transactions already open on the table to end. Run it on a connection of its own,
/// outside any transaction. A call cut short is finished by the next one.
///
/// MySQL/MariaDB and SQLite keep their index on both texts: for them there is nothing to
/// upgrade.
pub async fn upgrade_unique_index<C>(conn: &mut C) -> QueryResult<crate::schema::IndexUpgrade>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    C::Backend::upgrade_unique_index(conn).await
}
