//! PostgreSQL: BEGIN and the marker insert in one round trip.
//!
//! `AsyncPgConnection` pipelines statements issued through a shared borrow: the insert
//! goes out right behind `BEGIN` instead of after its answer, so a new message costs
//! the round trips of the bare transaction (BEGIN with the insert, the body, COMMIT).
//! Only a connection seen as `&AsyncPgConnection` can do this, which code generic over
//! the connection cannot get to: [`Begin`](crate::begin::Begin) carries the way there,
//! picked where the handler names its connection's type.
//!
//! A pipelined insert runs whether or not the `BEGIN` ahead of it worked. Should that
//! batch fail while the connection lives on, the insert would run on its own and commit a
//! marker for a body that never ran: the message would be lost as a duplicate. So the
//! batch also sets a transaction-local flag, and the insert inserts only where it sees
//! it: a failed batch stops at its first error and never sets it.

use diesel::QueryResult;
use diesel::pg::Pg;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{Array, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use futures_util::future::join;

use crate::backend::queries::NewMarker;
use crate::backend::sealed::Marker;
use crate::backend::{end_unless_inserted, enter_transaction, roll_back_for};

/// What [`begin_with_marker`] sends ahead of the insert: the transaction, in UTF-8 as
/// every call's (see `begin_in_utf8`), and the flag the insert looks for.
const BEGIN_FLAGGED: &str = "BEGIN; SET LOCAL client_encoding = 'UTF8'; \
     SET LOCAL diesel_inbox.marker_transaction = 'open'";

/// The condition under which a pipelined insert inserts: the batch ahead of it began
/// the transaction. `current_setting(…, true)` is NULL where the flag was never set, and
/// empty after a transaction that set it has ended.
macro_rules! behind_begin {
    () => {
        "current_setting('diesel_inbox.marker_transaction', true) = 'open'"
    };
}

/// The shared connection that pipelines, reached from the handler's own.
pub(crate) type Shared<C> = for<'c> fn(&'c mut C) -> &'c AsyncPgConnection;

/// [`Sealed::begin_with_marker`](crate::backend::sealed::Sealed::begin_with_marker),
/// pipelined.
pub(crate) async fn begin_with_marker<C>(
    conn: &mut C,
    shared: Shared<C>,
    marker: &Marker,
) -> QueryResult<bool>
where
    C: AsyncConnection,
{
    enter_transaction(conn)?;
    let insert = marker_insert(marker);
    let (begun, inserted) = {
        let pipelined = shared(conn);
        let (mut for_begin, mut for_insert) = (pipelined, pipelined);
        join(
            for_begin.batch_execute(BEGIN_FLAGGED),
            insert.execute(&mut for_insert),
        )
        .await
    };
    if let Err(error) = begun {
        return Err(roll_back_for(conn, error).await);
    }
    end_unless_inserted(conn, inserted.map(|rows| rows > 0)).await
}

/// The marker's insert, which inserts only behind [`BEGIN_FLAGGED`].
fn marker_insert(marker: &Marker) -> BoxedSqlQuery<'static, Pg, SqlQuery> {
    match &marker.fingerprint {
        Some(fingerprint) => diesel::sql_query(concat!(
            "INSERT INTO inbox (message_id, consumer, fingerprint) SELECT $1, $2, $3 WHERE ",
            behind_begin!(),
            " ON CONFLICT (message_id, consumer) DO NOTHING"
        ))
        .into_boxed()
        .bind::<Text, _>(marker.message_id.clone())
        .bind::<Text, _>(marker.consumer)
        .bind::<Text, _>(fingerprint.clone()),
        // 0.1's table has no fingerprint column: a marker without one names none.
        None => diesel::sql_query(concat!(
            "INSERT INTO inbox (message_id, consumer) SELECT $1, $2 WHERE ",
            behind_begin!(),
            " ON CONFLICT (message_id, consumer) DO NOTHING"
        ))
        .into_boxed()
        .bind::<Text, _>(marker.message_id.clone())
        .bind::<Text, _>(marker.consumer),
    }
}

/// [`Sealed::begin_with_markers`](crate::backend::sealed::Sealed::begin_with_markers),
/// pipelined; the insert is `insert_markers`' with the flag's condition.
pub(crate) async fn begin_with_markers<C>(
    conn: &mut C,
    shared: Shared<C>,
    consumer: &'static str,
    message_ids: Vec<String>,
) -> QueryResult<Vec<bool>>
where
    C: AsyncConnection,
{
    use diesel_async::TransactionManager as _;

    enter_transaction(conn)?;
    let insert = diesel::sql_query(concat!(
        "INSERT INTO inbox (message_id, consumer) \
         SELECT message_id, $2 FROM unnest($1::text[]) AS batch (message_id) WHERE ",
        behind_begin!(),
        " ON CONFLICT (message_id, consumer) DO NOTHING RETURNING message_id"
    ))
    .bind::<Array<Text>, _>(&message_ids)
    .bind::<Text, _>(consumer);
    let (begun, inserted) = {
        let pipelined = shared(conn);
        let (mut for_begin, mut for_insert) = (pipelined, pipelined);
        join(
            for_begin.batch_execute(BEGIN_FLAGGED),
            insert.load::<NewMarker>(&mut for_insert),
        )
        .await
    };
    let inserted = match (begun, inserted) {
        (Err(error), _) | (Ok(()), Err(error)) => return Err(roll_back_for(conn, error).await),
        (Ok(()), Ok(inserted)) => inserted,
    };
    let new = super::statements::which_are_new(&message_ids, inserted);
    if new.contains(&true) {
        Ok(new)
    } else {
        C::TransactionManager::rollback_transaction(conn)
            .await
            .map(|()| new)
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use diesel_async::{RunQueryDsl as _, SimpleAsyncConnection as _};

    use super::{BEGIN_FLAGGED, Marker, marker_insert};
    use crate::testing::{TestDatabase, select_i64};

    /// The flag keeps a marker from committing without its body: an insert that does not
    /// run behind the BEGIN batch, in the transaction that batch opened, inserts nothing.
    #[tokio::test]
    async fn an_insert_not_behind_its_begin_inserts_nothing() {
        let Some(url) = std::env::var("POSTGRES_URL")
            .ok()
            .filter(|url| !url.is_empty())
        else {
            assert!(
                std::env::var_os("CI").is_none(),
                "POSTGRES_URL is not set, and CI runs every suite"
            );
            return;
        };
        let db = TestDatabase::postgres(&url, "pipeline_flag").await.unwrap();
        let mut conn = db.connect().await.unwrap();
        let marker = |message_id: &str, fingerprint: Option<&str>| Marker {
            message_id: message_id.to_owned(),
            consumer: "flag",
            fingerprint: fingerprint.map(str::to_owned),
        };
        for fingerprint in [None, Some("f")] {
            let alone = marker_insert(&marker("alone", fingerprint));
            assert_eq!(
                alone.execute(&mut conn).await.unwrap(),
                0,
                "{fingerprint:?}"
            );

            conn.batch_execute(BEGIN_FLAGGED).await.unwrap();
            let behind = marker_insert(&marker("behind", fingerprint));
            assert_eq!(
                behind.execute(&mut conn).await.unwrap(),
                1,
                "{fingerprint:?}"
            );
            conn.batch_execute("ROLLBACK").await.unwrap();

            let after = marker_insert(&marker("after", fingerprint));
            assert_eq!(
                after.execute(&mut conn).await.unwrap(),
                0,
                "{fingerprint:?}"
            );
        }
        let markers = select_i64(&mut conn, "SELECT COUNT(*) FROM inbox").await;
        assert_eq!(markers.unwrap(), 0);
        db.cleanup().await.unwrap();
    }
}
