//! PostgreSQL: the marker's statements: its insert, for a transaction begun in sequence
//! (`statements.rs`) or pipelined (`pipeline.rs`), a batch's insert, and the fast
//! path's read. Each is prepared once per connection, as diesel's typed queries are: a
//! `sql_query` is prepared again on every execution, a round trip of its own.
//!
//! Keys go in as their UTF-8 bytes (`bytea`, turned into `text` by the server), which no
//! `client_encoding` converts on their way in: a session in LATIN1 stores the bytes a
//! session in UTF-8 does, so a key is found whatever either session's setting. New keys
//! come back the same way. A duplicate waits for the transaction holding its key, then
//! inserts nothing, without raising an error (`ON CONFLICT DO NOTHING`).

use diesel::QueryResult;
use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{Array, Bytea, Text, Untyped};
use diesel_async::{AsyncConnectionCore, RunQueryDsl as _};

use crate::backend::sealed::Marker;

/// The condition a pipelined insert must meet to insert: the BEGIN batch sent ahead of
/// it began the transaction (see `pipeline.rs`). `current_setting(…, true)` is NULL where
/// the flag was never set, and empty after the transaction that set it has ended.
const BEHIND_FLAGGED_BEGIN: &str =
    " WHERE current_setting('diesel_inbox.marker_transaction', true) = 'open'";

/// The BEGIN batch that sets the flag [`BEHIND_FLAGGED_BEGIN`] looks for. A batch stops at
/// its first error, so one whose BEGIN failed never sets it.
pub(super) const BEGIN_FLAGGED: &str = "BEGIN; SET LOCAL diesel_inbox.marker_transaction = 'open'";

const ON_CONFLICT: &str = " ON CONFLICT (message_id, consumer) DO NOTHING";

/// Which transaction a marker insert runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Behind {
    /// A BEGIN whose answer came back first, or a test transaction's savepoint.
    Begun,
    /// The BEGIN batch sent just ahead of it, which sets the flag.
    FlaggedBegin,
}

impl Behind {
    fn condition(self) -> &'static str {
        match self {
            Self::Begun => "",
            Self::FlaggedBegin => BEHIND_FLAGGED_BEGIN,
        }
    }
}

/// The marker's insert; its row count says whether the marker is new.
pub(super) struct MarkerInsert<'m> {
    marker: &'m Marker,
    behind: Behind,
}

pub(super) fn marker(marker: &Marker, behind: Behind) -> MarkerInsert<'_> {
    MarkerInsert { marker, behind }
}

impl QueryId for MarkerInsert<'_> {
    type QueryId = ();
    // Four texts: the statement cache keys them by text.
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl QueryFragment<Pg> for MarkerInsert<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        let Marker {
            message_id,
            consumer,
            fingerprint,
        } = self.marker;
        // 0.1's table has no fingerprint column: a marker without one names none.
        out.push_sql(match fingerprint {
            None => "INSERT INTO inbox (message_id, consumer)",
            Some(_) => "INSERT INTO inbox (message_id, consumer, fingerprint)",
        });
        out.push_sql(" SELECT convert_from(");
        out.push_bind_param::<Bytea, [u8]>(message_id.as_bytes())?;
        out.push_sql(", 'UTF8'), convert_from(");
        out.push_bind_param::<Bytea, [u8]>(consumer.as_bytes())?;
        out.push_sql(", 'UTF8')");
        if let Some(fingerprint) = fingerprint {
            // Hex digits, the same in every encoding.
            out.push_sql(", ");
            out.push_bind_param::<Text, String>(fingerprint)?;
        }
        out.push_sql(self.behind.condition());
        out.push_sql(ON_CONFLICT);
        Ok(())
    }
}

/// Whether the marker is committed: the fast path's read, one row with `found`.
pub(super) struct MarkerExists<'m>(pub(super) &'m Marker);

impl QueryId for MarkerExists<'_> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl Query for MarkerExists<'_> {
    type SqlType = Untyped;
}

impl QueryFragment<Pg> for MarkerExists<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("SELECT EXISTS (SELECT 1 FROM inbox WHERE message_id = convert_from(");
        out.push_bind_param::<Bytea, [u8]>(self.0.message_id.as_bytes())?;
        out.push_sql(", 'UTF8') AND consumer = convert_from(");
        out.push_bind_param::<Bytea, [u8]>(self.0.consumer.as_bytes())?;
        out.push_sql(", 'UTF8')) AS found");
        Ok(())
    }
}

/// What [`MarkerExists`] reads.
#[derive(diesel::QueryableByName)]
pub(super) struct Found {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub(super) found: bool,
}

/// A batch's markers in one statement, `RETURNING` the new ones: the ids bound as one
/// array, so one statement and one prepared plan whatever the batch's size, and no
/// bind-parameter limit to split it for. The insert takes the rows in the order `unnest`
/// yields them, the array's.
pub(super) struct MarkersInsert<'m> {
    consumer: &'static str,
    message_ids: Vec<&'m [u8]>,
    behind: Behind,
}

pub(super) fn markers<'m>(
    consumer: &'static str,
    message_ids: &'m [String],
    behind: Behind,
) -> MarkersInsert<'m> {
    MarkersInsert {
        consumer,
        message_ids: message_ids.iter().map(String::as_bytes).collect(),
        behind,
    }
}

impl QueryId for MarkersInsert<'_> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl Query for MarkersInsert<'_> {
    type SqlType = Untyped;
}

impl QueryFragment<Pg> for MarkersInsert<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql(
            "INSERT INTO inbox (message_id, consumer) \
             SELECT convert_from(message_id, 'UTF8'), convert_from(",
        );
        out.push_bind_param::<Bytea, [u8]>(self.consumer.as_bytes())?;
        out.push_sql(", 'UTF8') FROM unnest(");
        out.push_bind_param::<Array<Bytea>, Vec<&[u8]>>(&self.message_ids)?;
        out.push_sql("::bytea[]) AS batch (message_id)");
        out.push_sql(self.behind.condition());
        out.push_sql(ON_CONFLICT);
        out.push_sql(" RETURNING convert_to(message_id, 'UTF8') AS message_id");
        Ok(())
    }
}

/// A marker that a batch insert's `RETURNING` reports as new: its key's UTF-8 bytes.
#[derive(diesel::QueryableByName)]
pub(super) struct NewMarker {
    #[diesel(sql_type = Bytea)]
    message_id: Vec<u8>,
}

/// Runs [`markers`]' insert: for each of the batch's sorted, distinct `message_ids`,
/// whether its marker is new.
pub(super) async fn insert_markers<C>(
    conn: &mut C,
    insert: MarkersInsert<'_>,
    message_ids: &[String],
) -> QueryResult<Vec<bool>>
where
    C: AsyncConnectionCore<Backend = Pg>,
{
    let inserted: Vec<NewMarker> = insert.load(conn).await?;
    Ok(which_are_new(message_ids, inserted))
}

/// For each of the batch's sorted `message_ids`, whether `inserted` reports it new.
fn which_are_new(message_ids: &[String], inserted: Vec<NewMarker>) -> Vec<bool> {
    let mut new = vec![false; message_ids.len()];
    for marker in inserted {
        if let Ok(at) =
            message_ids.binary_search_by(|id| id.as_bytes().cmp(marker.message_id.as_slice()))
        {
            new[at] = true;
        }
    }
    new
}
