//! Sessions the crate cannot work in. When one of the crate's own statements fails in a
//! way that no message can cause, the session is examined: if it is the cause, the call
//! fails with an error that says what to change, which is retried rather than
//! dead-lettered, and reported once at `ERROR`.

use std::sync::Once;

use diesel::result::{DatabaseErrorKind, Error};
use diesel_async::AsyncConnection;

use crate::backend::sealed::{InboxSeen, Sealed as _};
use crate::backend::{InboxBackend, UNSUPPORTED_SESSION};
use crate::classify::classify_message;
use crate::schema::INDEX_NAME;

/// `error`, which one of the crate's own statements failed with, or, when the session is
/// why, an error that says what to change.
pub(crate) async fn explain<C>(conn: &mut C, error: Error) -> Error
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    // Only an error that would otherwise be dead-lettered is worth a look.
    let Error::DatabaseError(DatabaseErrorKind::Unknown, info) = &error else {
        return error;
    };
    if classify_message(info.message()).is_some() {
        return error;
    }
    let unsupported = match C::Backend::inbox_seen(conn).await {
        Ok(InboxSeen::Missing) => format!(
            "{UNSUPPORTED_SESSION}it finds no `inbox` table ({}). Run `diesel_inbox::migrate` \
             at start-up on a connection set up as the handlers' are (the same database, \
             the same `search_path`), or apply the migration shipped for your backend there",
            info.message()
        ),
        // Another table of that name, which the crate's statements fail on (or, on
        // PostgreSQL, one found first on the session's `search_path`).
        Ok(InboxSeen::Foreign) => format!(
            "{UNSUPPORTED_SESSION}the `inbox` table it finds is not the crate's: it has no \
             unique index `{INDEX_NAME}` ({}). Give the crate's inbox a database or schema \
             of its own and point the handlers' connections there (on PostgreSQL, the \
             first schema of their `search_path` that has an `inbox`)",
            info.message()
        ),
        Ok(InboxSeen::Ours) | Err(_) => return error,
    };
    static REPORTED: Once = Once::new();
    REPORTED.call_once(|| {
        tracing::error!(
            target: "diesel_inbox",
            error = %unsupported,
            "messages are retried, not processed, until the session is fixed"
        );
    });
    Error::DatabaseError(DatabaseErrorKind::Unknown, Box::new(unsupported))
}
