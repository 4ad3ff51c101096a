//! MySQL and MariaDB: a marker found by its key, and a duplicate told from a collision.
//!
//! The unique index holds the virtual column `key_digest`, a digest of (consumer, key)
//! (see the `key_digest` migrations), or, in an inbox not yet upgraded, both texts.
//! Every lookup by key names the digest and both texts, so that it finds its row
//! through either index; and a 1062 on the index is confirmed by reading the key back,
//! so that two keys with one digest are an error, never a duplicate.
//!
//! Keys and consumers go in as the hex digits of their UTF-8 bytes, turned back into
//! bytes by the statement (`UNHEX(?)`), as the inserts' `X'…'` literals do: the server
//! converts a text parameter from the session's `character_set_client` to its
//! `character_set_connection`, which a session may set apart (`SET collation_connection
//! = latin1_swedish_ci`), and the `VARBINARY` columns would then be compared with other
//! bytes than they store. Hex digits are the same bytes in every character set.

use diesel::QueryResult;
use diesel::mysql::Mysql;
use diesel::result::Error;
use diesel::sql_types::{Binary, Bool, Text};
use diesel_async::{AsyncConnection, RunQueryDsl};

use crate::backend::met_another_marker;
use crate::backend::prepared::Prepared;
use crate::backend::queries::hex_digits;
use crate::schema::INDEX_NAME;

/// A placeholder for text bound as [`hex_digits`]: the text's bytes. The digits are
/// taken as ASCII first: the server converts a text parameter into the session's
/// `character_set_connection`, and in UTF-16, UCS-2 or UTF-32 `UNHEX` reads the digits'
/// zero bytes and answers NULL (every lookup by key then found nothing).
macro_rules! bytes_of_placeholder {
    () => {
        "UNHEX(CONVERT(? USING ascii))"
    };
}
pub(super) use bytes_of_placeholder;

/// The digest of the consumer and the key bound in the next two placeholders, as
/// [`hex_digits`].
macro_rules! digest_of_placeholders {
    () => {
        concat!(
            "UNHEX(LEFT(CONVERT(SHA2(CONCAT(",
            bytes_of_placeholder!(),
            ", 0x00, ",
            bytes_of_placeholder!(),
            "), 256) USING ascii), 32))"
        )
    };
}

/// A key's row, by four placeholders that [`bind_key!`] fills: the key and the consumer,
/// then the two again for the digest.
pub(super) const BY_KEY: &str = concat!(
    "WHERE message_id = ",
    bytes_of_placeholder!(),
    " AND consumer = ",
    bytes_of_placeholder!(),
    " AND key_digest = ",
    digest_of_placeholders!()
);

/// Binds `$query`'s four placeholders of [`BY_KEY`] to the key and consumer.
macro_rules! bind_key {
    ($query:expr, $message_id:expr, $consumer:expr) => {{
        let message_id = $crate::backend::queries::hex_digits(&$message_id);
        let consumer = $crate::backend::queries::hex_digits(&$consumer);
        $query
            .bind::<::diesel::sql_types::Text, _>(message_id.clone())
            .bind::<::diesel::sql_types::Text, _>(consumer.clone())
            .bind::<::diesel::sql_types::Text, _>(consumer)
            .bind::<::diesel::sql_types::Text, _>(message_id)
    }};
}
pub(super) use bind_key;

#[derive(diesel::QueryableByName)]
struct Found {
    #[diesel(sql_type = Bool)]
    found: bool,
}

/// What [`committed_marker`] reads: whether the key's marker is there, committed, and
/// whether the read opened a transaction of the session's, as it does with autocommit
/// off outside any transaction (the fast path's read commits it).
#[derive(diesel::QueryableByName)]
pub(super) struct MarkerRead {
    /// `None` where there is no marker, else whether it is processed (not a claim that
    /// claim mode has yet to complete).
    #[diesel(sql_type = diesel::sql_types::Nullable<Bool>)]
    pub(super) processed: Option<bool>,
    #[diesel(sql_type = Bool)]
    pub(super) opened_transaction: bool,
}

/// The key's committed marker: the fast path's read, and a duplicate's confirmation. A
/// locking read sees only committed rows at every isolation level, whatever snapshot the
/// transaction holds, and waits for a transaction that holds the key; a plain read at
/// READ UNCOMMITTED would see another delivery's marker before that delivery commits,
/// or rolls back. (MariaDB has no `FOR SHARE`, which diesel's `for_share()` writes.)
pub(super) async fn committed_marker<C>(
    conn: &mut C,
    message_id: &str,
    consumer: &str,
) -> QueryResult<MarkerRead>
where
    C: AsyncConnection<Backend = Mysql>,
{
    let read = Prepared(bind_key!(
        diesel::sql_query(format!(
            "SELECT (SELECT lease_ends_at IS NULL FROM inbox {BY_KEY} LOCK IN SHARE MODE) \
             AS processed, @@autocommit = 0 AS opened_transaction LIMIT 1"
        )),
        message_id,
        consumer
    ))
    .get_result(conn)
    .await;
    match read {
        // A table of 0.1, which `migrate` has not reached yet while handlers of this
        // version run against it, has no claim columns, and holds no claims. (The
        // statement fails where it is prepared, and the transaction goes on. Error 1054
        // quotes the column's name in every `lc_messages` language.)
        Err(Error::DatabaseError(_, info)) if info.message().contains("'lease_ends_at'") => {
            Prepared(bind_key!(
                diesel::sql_query(format!(
                    "SELECT IF(EXISTS (SELECT 1 FROM inbox {BY_KEY} LOCK IN SHARE MODE), \
                     TRUE, NULL) AS processed, @@autocommit = 0 AS opened_transaction LIMIT 1"
                )),
                message_id,
                consumer
            ))
            .get_result(conn)
            .await
        }
        read => read,
    }
}

/// Confirms that an insert which failed with 1062 on the inbox's index met the key's own
/// marker, and says whether it is processed (not a claim that claim mode has yet to
/// complete): the index may hold a digest, which another key can share. Another key's
/// marker is a [`KeyCollision`](crate::KeyCollision), never a duplicate.
pub(super) async fn confirm_duplicate<C>(
    conn: &mut C,
    message_id: &str,
    consumer: &str,
) -> QueryResult<bool>
where
    C: AsyncConnection<Backend = Mysql>,
{
    match committed_marker(conn, message_id, consumer)
        .await?
        .processed
    {
        Some(processed) => Ok(processed),
        None => Err(collision(conn, message_id, consumer).await),
    }
}

/// Whether a one-row marker insert (`inserted`, its result) made a new marker: a 1062 is
/// confirmed as the key's own processed marker, an unfinished claim of it being
/// [`ClaimError::Unfinished`](crate::ClaimError::Unfinished). Our own statement on our
/// own table: its only unique index besides the auto-increment key is the inbox's,
/// whatever language the message is in.
pub(super) async fn new_or_processed<C>(
    conn: &mut C,
    inserted: QueryResult<usize>,
    message_id: &str,
    consumer: &str,
) -> QueryResult<bool>
where
    C: AsyncConnection<Backend = Mysql>,
{
    match inserted {
        Ok(_) => Ok(true),
        Err(Error::DatabaseError(diesel::result::DatabaseErrorKind::UniqueViolation, _)) => {
            let processed = confirm_duplicate(conn, message_id, consumer).await?;
            crate::backend::processed_or_unfinished(processed)?;
            Ok(false)
        }
        Err(other) => Err(other),
    }
}

/// The error for a key whose insert met a marker that is not its own (see
/// [`met_another_marker`]). Only the digest's index can hold another key's marker, and
/// only it can find one by the digest alone: on 0.2's index the marker met was deleted.
async fn collision<C>(conn: &mut C, message_id: &str, consumer: &str) -> diesel::result::Error
where
    C: AsyncConnection<Backend = Mysql>,
{
    match holder(conn, message_id, consumer).await {
        Ok(holder) => met_another_marker(
            message_id,
            consumer,
            holder.map(|holder| (holder.message_id, holder.consumer)),
        ),
        Err(error) => error,
    }
}

/// The key and consumer of a marker holding a digest.
#[derive(diesel::QueryableByName)]
struct Holder {
    #[diesel(sql_type = Binary)]
    message_id: Vec<u8>,
    #[diesel(sql_type = Binary)]
    consumer: Vec<u8>,
}

async fn holder<C>(conn: &mut C, message_id: &str, consumer: &str) -> QueryResult<Option<Holder>>
where
    C: AsyncConnection<Backend = Mysql>,
{
    let Found { found: on_digest } = diesel::sql_query(format!(
        "SELECT EXISTS (SELECT 1 FROM information_schema.statistics \
         WHERE table_schema = DATABASE() AND table_name = 'inbox' \
         AND index_name = '{INDEX_NAME}' AND column_name = 'key_digest') AS found LIMIT 1"
    ))
    .get_result(conn)
    .await?;
    if !on_digest {
        return Ok(None);
    }
    let holders: Vec<Holder> = Prepared(
        diesel::sql_query(concat!(
            "SELECT message_id, consumer FROM inbox WHERE key_digest = ",
            digest_of_placeholders!(),
            " LIMIT 1 LOCK IN SHARE MODE"
        ))
        .bind::<Text, _>(hex_digits(consumer))
        .bind::<Text, _>(hex_digits(message_id)),
    )
    .load(conn)
    .await?;
    Ok(holders.into_iter().next())
}
