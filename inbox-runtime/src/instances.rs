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
use crate::call;
use crate::claims::ClaimPolicy;
use crate::claims::protocol;
use crate::enclosing::Enclosing;
use crate::handler::{Handler, RegisteredHandler};
use crate::transaction;

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
    let span = tracing::Span::none();
    let message_id = Ok(String::new());
    let begin = Begin::in_sequence();
    let _ = transaction::open(conn, begin, &HANDLER, message_id, false, None, &span).await;
    let _ = batch::open(conn, Begin::in_sequence(), "", Ok(Vec::new()), &span).await;
    let _ = call::close(conn, Enclosing::Nothing, true, &span).await;
    let policy = ClaimPolicy::new(None, None, false);
    if let Ok(held) = protocol::claim(conn, "", Ok(String::new()), policy, None, &span).await {
        let _ = protocol::settle(conn, held, true, &span).await;
    }
}
