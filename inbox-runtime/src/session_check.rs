//! Sessions the crate cannot work in. When one of the crate's own statements fails in a
//! way that no message can cause, the session is examined: if it is the cause, the call
//! fails with an error that says what to change, which is retried rather than
//! dead-lettered, and reported once at `ERROR`.

use std::sync::Once;

use diesel::result::{DatabaseErrorKind, Error};
use diesel_async::AsyncConnection;

use crate::backend::sealed::{InboxSeen, Sealed as _};
use crate::backend::{InboxBackend, UNSUPPORTED_SESSION, lacks_inbox_column, postgres};
use crate::classify::classify_message;
use crate::schema::INDEX_NAME;

/// `error`, which one of the crate's own statements failed with, or, when the session is
/// why, an error that says what to change.
pub(crate) async fn explain<C>(conn: &mut C, error: Error) -> Error
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    // Only an error that would otherwise be dead-lettered is worth a look, and a missing
    // column of the crate's inbox: an inbox `migrate` has not reached yet, retried as it
    // is, or another table of that name, which no retry gets past.
    let Error::DatabaseError(DatabaseErrorKind::Unknown, info) = &error else {
        return error;
    };
    let unsupported = if postgres::is_shared_statements(info.message()) {
        format!(
            "{UNSUPPORTED_SESSION}its connection passes through a pooler that hands \
             prepared statements from one client to another, where a statement can run \
             as another ({}): PgBouncer's `pool_mode = transaction` (before 1.21, or \
             without `max_prepared_statements`) or `statement`. Connect the handlers to \
             the server directly, through session pooling, or through PgBouncer 1.21 or \
             later with `max_prepared_statements` set",
            info.message()
        )
    } else if classify_message(info.message()).is_some() && !lacks_inbox_column(info.message()) {
        return error;
    } else {
        match inbox_seen_unsupported(conn, info.message()).await {
            Some(unsupported) => unsupported,
            None => return error,
        }
    };
    report_once(&unsupported);
    Error::DatabaseError(DatabaseErrorKind::Unknown, Box::new(unsupported))
}

/// What is wrong with the `inbox` the session finds, if anything, for an error `message`
/// of the crate's statements.
async fn inbox_seen_unsupported<C>(conn: &mut C, message: &str) -> Option<String>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    Some(match C::Backend::inbox_seen(conn).await {
        Ok(InboxSeen::Missing) => format!(
            "{UNSUPPORTED_SESSION}it finds no `inbox` table ({}). Run `diesel_inbox::migrate` \
             at start-up on a connection set up as the handlers' are (the same database, \
             the same `search_path`), or apply the migration shipped for your backend there",
            message
        ),
        // Another table of that name, which the crate's statements fail on (or, on
        // PostgreSQL, one found first on the session's `search_path`).
        Ok(InboxSeen::Foreign) => format!(
            "{UNSUPPORTED_SESSION}the `inbox` table it finds is not the crate's: it has no \
             unique index `{INDEX_NAME}` ({}). Give the crate's inbox a database or schema \
             of its own and point the handlers' connections there (on PostgreSQL, the \
             first schema of their `search_path` that has an `inbox`)",
            message
        ),
        Ok(InboxSeen::Ours) | Err(_) => return None,
    })
}

/// Logs the first session the crate cannot work in at `ERROR`: later ones are retried
/// quietly, as each delivery's error says the same.
fn report_once(unsupported: &str) {
    static REPORTED: Once = Once::new();
    REPORTED.call_once(|| {
        tracing::error!(
            target: "diesel_inbox",
            error = %unsupported,
            "messages are retried, not processed, until the session is fixed"
        );
    });
}
