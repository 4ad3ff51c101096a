//! The statements every backend issues, as typed diesel queries.

use std::future::Future;

use diesel::dsl::{exists, insert_into, now, select, update};
use diesel::prelude::*;
use diesel_async::methods::{ExecuteDsl, LoadQuery};
use diesel_async::{AsyncConnection, RunQueryDsl};

use super::sealed::Marker;
use crate::schema::inbox;

#[diesel::dsl::auto_type]
pub(super) fn marker_row<'a>(message_id: &'a str, consumer: &'a str) -> _ {
    inbox::table.filter(
        inbox::message_id
            .eq(message_id)
            .and(inbox::consumer.eq(consumer)),
    )
}

#[diesel::dsl::auto_type]
pub(super) fn marker_exists<'a>(message_id: &'a str, consumer: &'a str) -> _ {
    let row: marker_row<'a> = marker_row(message_id, consumer);
    select(exists(row))
}

#[diesel::dsl::auto_type]
pub(super) fn plain_insert<'a>(message_id: &'a str, consumer: &'a str) -> _ {
    insert_into(inbox::table).values((
        inbox::message_id.eq(message_id),
        inbox::consumer.eq(consumer),
    ))
}

#[diesel::dsl::auto_type]
pub(super) fn stamp_processed<'a>(message_id: &'a str, consumer: &'a str) -> _ {
    let row: marker_row<'a> = marker_row(message_id, consumer);
    update(row).set(inbox::processed_at.eq(now.nullable()))
}

/// The queries every backend shares, generic so that each backend module states only
/// what differs. Their bounds hold for every supported backend.
pub(super) mod shared {
    use super::*;

    pub(in crate::backend) fn already_processed<'q, C>(
        conn: &'q mut C,
        marker: Marker<'q>,
    ) -> impl Future<Output = QueryResult<bool>> + Send + 'q
    where
        C: AsyncConnection,
        marker_exists<'q>: LoadQuery<'q, C, bool> + Send + 'q,
    {
        marker_exists(marker.message_id, marker.consumer).get_result(conn)
    }

    pub(in crate::backend) fn mark_processed<'q, C>(
        conn: &'q mut C,
        marker: Marker<'q>,
    ) -> impl Future<Output = QueryResult<usize>> + Send + 'q
    where
        C: AsyncConnection,
        stamp_processed<'q>: ExecuteDsl<C> + Send + 'q,
    {
        stamp_processed(marker.message_id, marker.consumer).execute(conn)
    }
}
