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
//!
//! The unique index holds a digest of (consumer, key) (`inbox_key_digest`, see the
//! `key_digest` migration), or, in an inbox not yet upgraded, both texts. Every lookup
//! by key names the digest and both texts, so that it finds its row through either
//! index; and a conflict is confirmed by reading the key back, so that two keys with one
//! digest are an error, never a duplicate.

use diesel::QueryResult;
use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{Array, Bytea, Text, Untyped};
use diesel_async::{AsyncConnectionCore, RunQueryDsl as _};

use crate::backend::met_another_marker;
use crate::backend::prepared::Prepared;
use crate::backend::sealed::Marker;

/// The condition a pipelined insert must meet to insert: the BEGIN batch sent ahead of
/// it began the transaction (see `pipeline.rs`). `current_setting(…, true)` is NULL where
/// the flag was never set, and empty after the transaction that set it has ended.
const BEHIND_FLAGGED_BEGIN: &str =
    " WHERE current_setting('diesel_inbox.marker_transaction', true) = 'open'";

/// The BEGIN batch that sets the flag [`BEHIND_FLAGGED_BEGIN`] looks for. A batch stops at
/// its first error, so one whose BEGIN failed never sets it.
pub(super) const BEGIN_FLAGGED: &str = "BEGIN; SET LOCAL diesel_inbox.marker_transaction = 'open'";

/// Without a conflict target, so that it holds for either index: 0.2's on both texts, or
/// the digest's.
const ON_CONFLICT: &str = " ON CONFLICT DO NOTHING";

/// A column of the crate's inbox that the inserts name, set as a transactional marker
/// has it. Without a conflict target, an insert into another table called `inbox` (an
/// application's own, first on `search_path`) that has no unique index would insert
/// every time: every redelivery processed again. Naming the column fails there instead,
/// and the session check says which table was found.
const OWN_COLUMN: &str = "lease_ends_at";

/// The row of the key whose UTF-8 bytes are bound as `$1`, and the consumer's as `$2`,
/// found through the digest's index or 0.2's.
pub(super) const BY_KEY: &str = "WHERE inbox_key_digest(consumer, message_id) = \
     inbox_key_digest(pg_catalog.convert_from($2, 'UTF8'), pg_catalog.convert_from($1, 'UTF8')) \
     AND message_id = pg_catalog.convert_from($1, 'UTF8') AND consumer = pg_catalog.convert_from($2, 'UTF8')";

/// Whether the row of `inbox` is processed: not a claim that claim mode has yet to
/// complete. On a table of 0.1, which `migrate` has not reached yet while handlers of
/// this version run against it, the column is missing, and the statement fails
/// retryably (see `lacks_claim_columns`), as one naming the digest does.
const PROCESSED: &str = "lease_ends_at IS NULL";

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

/// The marker's insert; the row it returns, named, says the marker is new. (A row count
/// would also count a row of whatever other statement a pooler that mixes up prepared
/// statements ran in its place.)
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

impl Query for MarkerInsert<'_> {
    type SqlType = Untyped;
}

impl QueryFragment<Pg> for MarkerInsert<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        let Marker {
            message_id,
            consumer,
            fingerprint,
        } = self.marker;
        // 0.1's table has no fingerprint column: a marker without one names none.
        out.push_sql("INSERT INTO inbox (message_id, consumer, ");
        out.push_sql(OWN_COLUMN);
        if fingerprint.is_some() {
            out.push_sql(", fingerprint");
        }
        out.push_sql(") SELECT pg_catalog.convert_from(");
        out.push_bind_param::<Bytea, [u8]>(message_id.as_bytes())?;
        out.push_sql(", 'UTF8'), pg_catalog.convert_from(");
        out.push_bind_param::<Bytea, [u8]>(consumer.as_bytes())?;
        out.push_sql(", 'UTF8'), NULL");
        if let Some(fingerprint) = fingerprint {
            // Hex digits, the same in every encoding.
            out.push_sql(", ");
            out.push_bind_param::<Text, String>(fingerprint)?;
        }
        out.push_sql(self.behind.condition());
        out.push_sql(ON_CONFLICT);
        out.push_sql(" RETURNING TRUE AS new_marker");
        Ok(())
    }
}

/// The key's marker: `None` where there is none, else whether it is processed (not a
/// claim that claim mode has yet to complete). The fast path's read, and a conflict's
/// check.
pub(super) async fn marker_processed<C>(
    conn: &mut C,
    message_id: &str,
    consumer: &str,
) -> QueryResult<Option<bool>>
where
    C: AsyncConnectionCore<Backend = Pg>,
{
    #[derive(diesel::QueryableByName)]
    struct Found {
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Bool>)]
        processed: Option<bool>,
    }
    let Found { processed } = Prepared(
        diesel::sql_query(format!(
            "SELECT (SELECT {PROCESSED} FROM inbox {BY_KEY}) AS processed"
        ))
        .bind::<Bytea, _>(message_id.as_bytes())
        .bind::<Bytea, _>(consumer.as_bytes()),
    )
    .get_result(conn)
    .await?;
    Ok(processed)
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
        out.push_sql("INSERT INTO inbox (message_id, consumer, ");
        out.push_sql(OWN_COLUMN);
        out.push_sql(
            ") SELECT pg_catalog.convert_from(message_id, 'UTF8'), pg_catalog.convert_from(",
        );
        out.push_bind_param::<Bytea, [u8]>(self.consumer.as_bytes())?;
        out.push_sql(", 'UTF8'), NULL FROM pg_catalog.unnest(");
        out.push_bind_param::<Array<Bytea>, Vec<&[u8]>>(&self.message_ids)?;
        out.push_sql("::bytea[]) AS batch (message_id)");
        out.push_sql(self.behind.condition());
        out.push_sql(ON_CONFLICT);
        out.push_sql(" RETURNING pg_catalog.convert_to(message_id, 'UTF8') AS message_id");
        Ok(())
    }
}

/// A marker that a batch insert's `RETURNING` reports as new: its key's UTF-8 bytes.
#[derive(diesel::QueryableByName)]
pub(super) struct NewMarker {
    #[diesel(sql_type = Bytea)]
    message_id: Vec<u8>,
}

/// Runs [`marker`]'s insert: whether the marker is new, a conflict confirmed as the
/// key's own marker (see [`confirm_duplicate`]).
pub(super) async fn insert_marker<C>(conn: &mut C, insert: MarkerInsert<'_>) -> QueryResult<bool>
where
    C: AsyncConnectionCore<Backend = Pg>,
{
    #[derive(diesel::QueryableByName)]
    struct Inserted {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        #[expect(dead_code, reason = "the column's name is what is checked")]
        new_marker: bool,
    }
    let marker = insert.marker;
    let inserted: Vec<Inserted> = insert.load(conn).await?;
    if !inserted.is_empty() {
        return Ok(true);
    }
    let processed = confirm_duplicate(conn, &marker.message_id, marker.consumer).await?;
    crate::backend::processed_or_unfinished(processed)?;
    Ok(false)
}

/// Runs [`markers`]' insert: for each of the batch's sorted, distinct `message_ids`,
/// whether its marker is new, the others confirmed as their keys' own markers.
pub(super) async fn insert_markers<C>(
    conn: &mut C,
    insert: MarkersInsert<'_>,
    message_ids: &[String],
) -> QueryResult<Vec<bool>>
where
    C: AsyncConnectionCore<Backend = Pg>,
{
    let consumer = insert.consumer;
    let inserted: Vec<NewMarker> = insert.load(conn).await?;
    let new = which_are_new(message_ids, inserted);
    let met: Vec<&[u8]> = message_ids
        .iter()
        .zip(&new)
        .filter(|(_, new)| !**new)
        .map(|(message_id, _)| message_id.as_bytes())
        .collect();
    if !met.is_empty() {
        confirm_duplicates(conn, consumer, met).await?;
    }
    Ok(new)
}

/// Confirms that an insert which met a marker met the key's own, and says whether it is
/// processed (not a claim that claim mode has yet to complete): the unique index may
/// hold a digest, which another key can share. Another key's marker is a
/// [`KeyCollision`](crate::KeyCollision), never a duplicate.
///
/// Run in the insert's transaction: the marker it met is committed (the insert waited
/// for it) or its own, so this read finds it.
pub(super) async fn confirm_duplicate<C>(
    conn: &mut C,
    message_id: &str,
    consumer: &str,
) -> QueryResult<bool>
where
    C: AsyncConnectionCore<Backend = Pg>,
{
    match marker_processed(conn, message_id, consumer).await? {
        Some(processed) => Ok(processed),
        None => Err(collision(conn, message_id, consumer).await),
    }
}

/// [`confirm_duplicate`] for a batch's markers that met one, in one statement.
async fn confirm_duplicates<C>(conn: &mut C, consumer: &str, met: Vec<&[u8]>) -> QueryResult<()>
where
    C: AsyncConnectionCore<Backend = Pg>,
{
    // The keys whose marker is missing (`processed` NULL) or a claim that claim mode
    // has yet to complete.
    #[derive(diesel::QueryableByName)]
    struct Unconfirmed {
        #[diesel(sql_type = Bytea)]
        message_id: Vec<u8>,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Bool>)]
        processed: Option<bool>,
    }
    let unconfirmed: Vec<Unconfirmed> = Prepared(
        diesel::sql_query(
            "SELECT batch.message_id, (SELECT lease_ends_at IS NULL FROM inbox \
             WHERE inbox_key_digest(consumer, message_id) \
             = inbox_key_digest(pg_catalog.convert_from($2, 'UTF8'), pg_catalog.convert_from(batch.message_id, 'UTF8')) \
             AND message_id = pg_catalog.convert_from(batch.message_id, 'UTF8') \
             AND consumer = pg_catalog.convert_from($2, 'UTF8')) AS processed \
             FROM pg_catalog.unnest($1::bytea[]) AS batch (message_id)",
        )
        .bind::<Array<Bytea>, _>(met)
        .bind::<Bytea, _>(consumer.as_bytes()),
    )
    .load(conn)
    .await?;
    let Some(Unconfirmed {
        message_id,
        processed,
    }) = unconfirmed
        .into_iter()
        .find(|marker| marker.processed != Some(true))
    else {
        return Ok(());
    };
    if processed.is_some() {
        return crate::backend::processed_or_unfinished(false);
    }
    let message_id = String::from_utf8_lossy(&message_id).into_owned();
    Err(collision(conn, &message_id, consumer).await)
}

/// The error for a key whose insert met a marker that is not its own (see
/// [`met_another_marker`]): the marker holding its digest, read by the digest alone
/// (only ever needed on an upgraded index, where that read has an index: 0.2's meets
/// nothing but the key's own marker).
async fn collision<C>(conn: &mut C, message_id: &str, consumer: &str) -> diesel::result::Error
where
    C: AsyncConnectionCore<Backend = Pg>,
{
    let holder: QueryResult<Vec<Holder>> = Prepared(
        diesel::sql_query(
            "SELECT pg_catalog.convert_to(message_id, 'UTF8') AS message_id, \
             pg_catalog.convert_to(consumer, 'UTF8') AS consumer FROM inbox \
             WHERE inbox_key_digest(consumer, message_id) \
             = inbox_key_digest(pg_catalog.convert_from($2, 'UTF8'), pg_catalog.convert_from($1, 'UTF8'))",
        )
        .bind::<Bytea, _>(message_id.as_bytes())
        .bind::<Bytea, _>(consumer.as_bytes()),
    )
    .load(conn)
    .await;
    match holder {
        Ok(rows) => met_another_marker(
            message_id,
            consumer,
            rows.into_iter()
                .next()
                .map(|holder| (holder.message_id, holder.consumer)),
        ),
        Err(error) => error,
    }
}

/// What [`collision`] reads: the key and consumer of the marker holding a digest.
#[derive(diesel::QueryableByName)]
struct Holder {
    #[diesel(sql_type = Bytea)]
    message_id: Vec<u8>,
    #[diesel(sql_type = Bytea)]
    consumer: Vec<u8>,
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
