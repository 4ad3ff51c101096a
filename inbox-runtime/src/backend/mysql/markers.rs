//! MySQL and MariaDB: a marker found by its key, and a duplicate told from a collision.
//!
//! The unique index holds the virtual column `key_digest`, a digest of (consumer, key)
//! (see the `key_digest` migrations), or, in an inbox not yet upgraded, both texts.
//! Every lookup by key names the digest and both texts, so that it finds its row
//! through either index; and a 1062 on the index is confirmed by reading the key back,
//! so that two keys with one digest are an error, never a duplicate.

use diesel::QueryResult;
use diesel::mysql::Mysql;
use diesel::sql_types::{Binary, Bool, Text};
use diesel_async::{AsyncConnection, RunQueryDsl};

use crate::backend::met_another_marker;
use crate::backend::prepared::Prepared;
use crate::schema::INDEX_NAME;

/// The digest of the consumer and the key bound in the next two placeholders.
macro_rules! digest_of_placeholders {
    () => {
        "UNHEX(LEFT(SHA2(CONCAT(?, 0x00, ?), 256), 32))"
    };
}

/// A key's row, by four placeholders that [`bind_key!`] fills: the key and the consumer,
/// then the two again for the digest.
pub(super) const BY_KEY: &str = concat!(
    "WHERE message_id = ? AND consumer = ? AND key_digest = ",
    digest_of_placeholders!()
);

/// Binds `$query`'s four placeholders of [`BY_KEY`] to the key and consumer, `String`s.
macro_rules! bind_key {
    ($query:expr, $message_id:expr, $consumer:expr) => {{
        let (message_id, consumer): (String, String) = ($message_id, $consumer);
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

/// Confirms that an insert which failed with 1062 on the inbox's index met the key's own
/// marker (`Ok`): the index may hold a digest, which another key can share. Another
/// key's marker is a [`KeyCollision`](crate::KeyCollision), never a duplicate.
///
/// A locking read: it sees the latest committed marker at every isolation level, as
/// the insert did, whatever snapshot the transaction holds.
pub(super) async fn confirm_duplicate<C>(
    conn: &mut C,
    message_id: &str,
    consumer: &str,
) -> QueryResult<()>
where
    C: AsyncConnection<Backend = Mysql>,
{
    let query = Prepared(bind_key!(
        diesel::sql_query(format!(
            "SELECT EXISTS (SELECT 1 FROM inbox {BY_KEY} LOCK IN SHARE MODE) AS found"
        )),
        message_id.to_owned(),
        consumer.to_owned()
    ));
    let Found { found } = query.get_result(conn).await?;
    if found {
        return Ok(());
    }
    Err(collision(conn, message_id, consumer).await)
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
         AND index_name = '{INDEX_NAME}' AND column_name = 'key_digest') AS found"
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
            " LOCK IN SHARE MODE"
        ))
        .bind::<Text, _>(consumer)
        .bind::<Text, _>(message_id),
    )
    .load(conn)
    .await?;
    Ok(holders.into_iter().next())
}
