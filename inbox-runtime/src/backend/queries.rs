//! The statements every backend issues, as typed diesel queries.

use std::future::Future;

use diesel::dsl::{exists, insert_into, select};
use diesel::prelude::*;
use diesel_async::methods::LoadQuery;
use diesel_async::{AsyncConnection, RunQueryDsl};

use super::sealed::Marker;
use crate::schema::inbox;

#[diesel::dsl::auto_type]
pub(super) fn marker_row(message_id: String, consumer: &'static str) -> _ {
    inbox::table.filter(
        inbox::message_id
            .eq(message_id)
            .and(inbox::consumer.eq(consumer)),
    )
}

#[diesel::dsl::auto_type]
pub(super) fn marker_exists(message_id: String, consumer: &'static str) -> _ {
    let row: marker_row = marker_row(message_id, consumer);
    select(exists(row))
}

#[diesel::dsl::auto_type]
pub(super) fn plain_insert(message_id: String, consumer: &'static str) -> _ {
    insert_into(inbox::table).values((
        inbox::message_id.eq(message_id),
        inbox::consumer.eq(consumer),
    ))
}

/// The queries every backend shares, generic so that each backend module states only
/// what differs. Their bounds hold for every supported backend.
pub(super) mod shared {
    use super::*;

    pub(in crate::backend) fn already_processed<'c, C>(
        conn: &'c mut C,
        marker: &Marker,
    ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, C>
    where
        C: AsyncConnection,
        marker_exists: LoadQuery<'static, C, bool> + Send + 'static,
    {
        marker_exists(marker.message_id.clone(), marker.consumer).get_result(conn)
    }

    /// Commits, once the marker is seen still there: that proves the transaction is the
    /// one it was inserted in, not a fresh one after the database rolled that back.
    /// (PostgreSQL commits its own way.)
    #[cfg(any(feature = "mysql", feature = "sqlite"))]
    pub(in crate::backend) fn commit_if_marker_there<'c, C>(
        conn: &'c mut C,
        marker: &Marker,
    ) -> impl Future<Output = QueryResult<()>> + Send + use<'c, C>
    where
        C: AsyncConnection,
        marker_exists: LoadQuery<'static, C, bool> + Send + 'static,
    {
        use diesel_async::TransactionManager;

        use crate::backend::{roll_back_for, rolled_back_underneath};

        let marker_there = marker_exists(marker.message_id.clone(), marker.consumer);
        async move {
            match marker_there.get_result(&mut *conn).await {
                Ok(true) => C::TransactionManager::commit_transaction(conn).await,
                Ok(false) => Err(roll_back_for(conn, rolled_back_underneath()).await),
                Err(error) => Err(roll_back_for(conn, error).await),
            }
        }
    }
}
