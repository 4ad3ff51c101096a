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

/// `UPDATE inbox SET processed_at = <clock> WHERE <marker>`.
pub(super) type StampProcessed<Clock> = diesel::dsl::Update<
    marker_row,
    diesel::dsl::Eq<inbox::processed_at, diesel::dsl::Nullable<Clock>>,
>;

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

    /// Stamps `processed_at` with `clock`, each backend's expression for the current
    /// time at the precision of its column.
    pub(in crate::backend) fn mark_processed<'c, C, Clock>(
        conn: &'c mut C,
        marker: &Marker,
        clock: Clock,
    ) -> impl Future<Output = QueryResult<usize>> + Send + use<'c, C, Clock>
    where
        C: AsyncConnection,
        Clock: Expression<SqlType = diesel::sql_types::Timestamp> + AppearsOnTable<inbox::table>,
        StampProcessed<Clock>: diesel_async::methods::ExecuteDsl<C> + Send + 'static,
    {
        diesel::update(marker_row(marker.message_id.clone(), marker.consumer))
            .set(inbox::processed_at.eq(clock.nullable()))
            .execute(conn)
    }
}
