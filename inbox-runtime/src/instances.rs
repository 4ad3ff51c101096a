//! The steps around a handler's body, compiled here for the standard connection types.
//!
//! Those steps are generic over the connection alone. A debug build reuses the generic
//! code that its dependencies have already compiled (rustc shares generics below
//! opt-level 2), so with the instances below a crate whose handlers use these
//! connections links the steps instead of compiling its own copy. The functions are
//! never called: they exist to be compiled.

use std::pin::Pin;

use diesel_async::AsyncConnection;

use crate::backend::InboxBackend;
use crate::batch;
use crate::begin::Begin;
use crate::claims::ClaimPolicy;
use crate::claims::protocol;
use crate::fast_path::FastPath;
use crate::handler::{Handler, RegisteredHandler};
use crate::transaction;
use crate::verdict::HandlerErrorType;

/// A boxed future that polls every step once, on a connection of one type.
type Steps<'c> = Pin<Box<dyn Future<Output = ()> + 'c>>;

/// The steps, instantiated for `AsyncPgConnection`.
#[cfg(feature = "postgres")]
pub fn postgres(conn: &mut diesel_async::AsyncPgConnection) -> Steps<'_> {
    Box::pin(steps(conn))
}

/// The steps, instantiated for `AsyncMysqlConnection`.
#[cfg(feature = "mysql")]
pub fn mysql(conn: &mut diesel_async::AsyncMysqlConnection) -> Steps<'_> {
    Box::pin(steps(conn))
}

/// The steps, instantiated for diesel-async's wrapper of `SqliteConnection`.
#[cfg(feature = "sqlite")]
pub fn sqlite(
    conn: &mut diesel_async::sync_connection_wrapper::SyncConnectionWrapper<
        diesel::sqlite::SqliteConnection,
    >,
) -> Steps<'_> {
    Box::pin(steps(conn))
}

async fn steps<C>(conn: &mut C)
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    static HANDLER: Handler = Handler::new(RegisteredHandler::new("", ""));
    let begin = Begin::in_sequence();
    let id = || Ok(String::new());
    let error_type = || HandlerErrorType {
        from_diesel: |error| error,
        database_class: |_| None,
    };
    let begun =
        transaction::begin_transaction(begin, conn, &HANDLER, id(), FastPath::Adaptive, None);
    if let Ok(transaction) = begun.await {
        let _ = transaction.close(conn, Ok(()), error_type()).await;
    }
    let keys = batch::BatchKeys::new(&[()]).finish();
    let begun = batch::begin_batch(Begin::in_sequence(), keys, conn, &HANDLER);
    if let Ok(batch) = begun.await {
        let _ = batch.close(conn, Ok(()), error_type()).await;
    }
    let policy = ClaimPolicy::new(None, None, false);
    if let Ok(claimed) = protocol::claim_delivery(conn, &HANDLER, id(), policy, None).await {
        let _ = claimed.close(conn, Ok(()), error_type()).await;
    }
}
