//! The statements several backends issue, as typed diesel queries.

use diesel::dsl::insert_into;
use diesel::prelude::*;

use crate::schema::inbox;

/// The marker's id, when there is one. Selecting the id alone keeps the statement to
/// 0.1's columns, which a table not yet upgraded has.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[diesel::dsl::auto_type]
pub(super) fn marker_row(message_id: String, consumer: &'static str) -> _ {
    inbox::table.select(inbox::id).filter(
        inbox::message_id
            .eq(message_id)
            .and(inbox::consumer.eq(consumer)),
    )
}

#[cfg(feature = "postgres")]
#[diesel::dsl::auto_type]
pub(super) fn marker_exists(message_id: String, consumer: &'static str) -> _ {
    let row: marker_row = marker_row(message_id, consumer);
    diesel::dsl::select(diesel::dsl::exists(row))
}

#[diesel::dsl::auto_type]
pub(super) fn plain_insert(message_id: String, consumer: &'static str) -> _ {
    insert_into(inbox::table).values((
        inbox::message_id.eq(message_id),
        inbox::consumer.eq(consumer),
    ))
}

#[diesel::dsl::auto_type]
pub(super) fn fingerprinted_insert(
    message_id: String,
    consumer: &'static str,
    fingerprint: String,
) -> _ {
    insert_into(inbox::table).values((
        inbox::message_id.eq(message_id),
        inbox::consumer.eq(consumer),
        inbox::fingerprint.eq(fingerprint),
    ))
}

/// `text`'s bytes as hex digits, for a literal `X'…'` in a text batch: no byte of the
/// caller's key can end the literal or change what the statement does.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(super) fn hex_digits(text: &str) -> String {
    use std::fmt::Write as _;

    text.bytes()
        .fold(String::with_capacity(2 * text.len()), |mut hex, byte| {
            write!(hex, "{byte:02X}").expect("writing to a String cannot fail");
            hex
        })
}
