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
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use futures_util::future::join;

use super::markers::{self, BEGIN_FLAGGED, Behind};
use crate::backend::sealed::Marker;
use crate::backend::{end_unless_inserted, enter_transaction, roll_back_for};

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
    let (begun, inserted) = {
        let pipelined = shared(conn);
        let (mut for_begin, mut for_insert) = (pipelined, pipelined);
        join(
            for_begin.batch_execute(BEGIN_FLAGGED),
            markers::insert_marker(
                &mut for_insert,
                markers::marker(marker, Behind::FlaggedBegin),
            ),
        )
        .await
    };
    if let Err(error) = begun {
        return Err(roll_back_for(conn, error).await);
    }
    end_unless_inserted(conn, inserted).await
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
    let (begun, inserted) = {
        let pipelined = shared(conn);
        let (mut for_begin, mut for_insert) = (pipelined, pipelined);
        join(
            for_begin.batch_execute(BEGIN_FLAGGED),
            markers::insert_markers(
                &mut for_insert,
                markers::markers(consumer, &message_ids, Behind::FlaggedBegin),
                &message_ids,
            ),
        )
        .await
    };
    let new = match (begun, inserted) {
        (Err(error), _) | (Ok(()), Err(error)) => return Err(roll_back_for(conn, error).await),
        (Ok(()), Ok(new)) => new,
    };
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

    use super::{BEGIN_FLAGGED, Behind, Marker, markers};
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
            let alone = marker("alone", fingerprint);
            let alone = markers::marker(&alone, Behind::FlaggedBegin);
            assert_eq!(
                alone.execute(&mut conn).await.unwrap(),
                0,
                "{fingerprint:?}"
            );

            conn.batch_execute(BEGIN_FLAGGED).await.unwrap();
            let behind = marker("behind", fingerprint);
            let behind = markers::marker(&behind, Behind::FlaggedBegin);
            assert_eq!(
                behind.execute(&mut conn).await.unwrap(),
                1,
                "{fingerprint:?}"
            );
            conn.batch_execute("ROLLBACK").await.unwrap();

            let after = marker("after", fingerprint);
            let after = markers::marker(&after, Behind::FlaggedBegin);
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
