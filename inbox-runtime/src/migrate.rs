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
