//! The statements MySQL/MariaDB and SQLite both issue, as typed diesel queries.

#[cfg(feature = "sqlite")]
use diesel::dsl::insert_into;
use diesel::prelude::*;

#[cfg(feature = "sqlite")]
use crate::schema::inbox;

/// The marker's id, when there is one. Selecting the id alone keeps the statement to
/// 0.1's columns, which a table not yet upgraded has.
#[cfg(feature = "sqlite")]
#[diesel::dsl::auto_type]
pub(super) fn marker_row(message_id: String, consumer: &'static str) -> _ {
    inbox::table.select(inbox::id).filter(
        inbox::message_id
            .eq(message_id)
            .and(inbox::consumer.eq(consumer)),
    )
}

#[cfg(feature = "sqlite")]
#[diesel::dsl::auto_type]
pub(super) fn plain_insert(message_id: String, consumer: &'static str) -> _ {
    insert_into(inbox::table).values((
        inbox::message_id.eq(message_id),
        inbox::consumer.eq(consumer),
    ))
}

#[cfg(feature = "sqlite")]
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

/// `text`'s bytes as hex digits, for a literal `X'…'` in a text batch, where no byte of
/// the caller's key can end the literal or change what the statement does, or for a
/// parameter that the statement unhexes (see `mysql/markers.rs`).
#[cfg(feature = "mysql")]
pub(crate) fn hex_digits(text: impl AsRef<[u8]>) -> String {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    let bytes = text.as_ref();
    let mut hex = String::with_capacity(2 * bytes.len());
    for byte in bytes {
        hex.push(char::from(DIGITS[usize::from(byte >> 4)]));
        hex.push(char::from(DIGITS[usize::from(byte & 0x0F)]));
    }
    hex
}

/// `INSERT INTO inbox (message_id, consumer) VALUES (?, ?), …`, one row per id in the
/// order given, then `suffix`, for the backends without an array type to bind the ids
/// as one parameter.
///
/// Its SQL differs with the number of rows, so it is cached as a prepared statement per
/// row count: the callers cap that count ([`MARKERS_PER_STATEMENT`]), which bounds the
/// statements each connection keeps prepared (MySQL's `max_prepared_stmt_count` is
/// server-wide) and keeps far below every bind-parameter limit.
pub(super) struct InsertMarkers {
    /// The keys and the consumer as bound: as they are, or [`InsertMarkers::hex`]'s.
    message_ids: Vec<String>,
    consumer: String,
    /// Whether each placeholder takes its text's bytes as hex digits (`UNHEX(?)`).
    hex: bool,
    shape: &'static InsertShape,
    suffix: &'static str,
}

/// How a backend's marker insert begins, and what it names beyond the key's columns.
pub(super) struct InsertShape {
    /// `INSERT`, or what stands for it.
    pub(super) insert: &'static str,
    /// A column of the crate's inbox that each row also names, with its `DEFAULT`.
    pub(super) own_column: Option<&'static str>,
}

/// A plain `INSERT` of the key's columns.
#[cfg(feature = "sqlite")]
const PLAIN: InsertShape = InsertShape {
    insert: "INSERT",
    own_column: None,
};

impl InsertMarkers {
    /// The keys and the consumer bound as text.
    #[cfg(feature = "sqlite")]
    pub(super) fn new(message_ids: Vec<String>, consumer: &str, suffix: &'static str) -> Self {
        Self {
            message_ids,
            consumer: consumer.to_owned(),
            hex: false,
            shape: &PLAIN,
            suffix,
        }
    }

    /// The keys and the consumer bound as the hex digits of their bytes, which no
    /// character set conversion changes (see `mysql/markers.rs`), inserted as `shape`
    /// says.
    #[cfg(feature = "mysql")]
    pub(super) fn hex(
        message_ids: &[String],
        consumer: &str,
        shape: &'static InsertShape,
        suffix: &'static str,
    ) -> Self {
        Self {
            message_ids: message_ids.iter().map(hex_digits).collect(),
            consumer: hex_digits(consumer),
            hex: true,
            shape,
            suffix,
        }
    }
}

/// Most markers one [`InsertMarkers`] statement inserts: two bind parameters each, far
/// below SQLite's 32,766 and MySQL's 65,535.
pub(super) const MARKERS_PER_STATEMENT: usize = 64;

impl diesel::query_builder::QueryId for InsertMarkers {
    type QueryId = ();
    // The SQL depends on the row count: the statement cache must key it by its text.
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl diesel::query_builder::Query for InsertMarkers {
    type SqlType = diesel::sql_types::Text;
}

impl<DB> diesel::query_builder::QueryFragment<DB> for InsertMarkers
where
    DB: diesel::backend::Backend,
    String: diesel::serialize::ToSql<diesel::sql_types::Text, DB>,
{
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, DB>,
    ) -> QueryResult<()> {
        use diesel::sql_types::Text;

        // As MySQL's `bytes_of_placeholder!`: the digits taken as ASCII, whatever the
        // session's connection character set.
        let (open, close) = if self.hex {
            ("UNHEX(CONVERT(", " USING ascii))")
        } else {
            ("", "")
        };
        out.push_sql(self.shape.insert);
        out.push_sql(" INTO inbox (message_id, consumer");
        if let Some(column) = self.shape.own_column {
            out.push_sql(", ");
            out.push_sql(column);
        }
        out.push_sql(") VALUES ");
        for (n, message_id) in self.message_ids.iter().enumerate() {
            out.push_sql(if n == 0 { "(" } else { ", (" });
            out.push_sql(open);
            out.push_bind_param::<Text, String>(message_id)?;
            out.push_sql(close);
            out.push_sql(", ");
            out.push_sql(open);
            out.push_bind_param::<Text, String>(&self.consumer)?;
            out.push_sql(close);
            if self.shape.own_column.is_some() {
                out.push_sql(", DEFAULT");
            }
            out.push_sql(")");
        }
        out.push_sql(self.suffix);
        Ok(())
    }
}

/// Splits sorted `message_ids` into owned runs of at most `size`, in order.
pub(super) fn chunks(mut message_ids: Vec<String>, size: usize) -> Vec<Vec<String>> {
    let mut chunks = Vec::with_capacity(message_ids.len().div_ceil(size));
    while message_ids.len() > size {
        let rest = message_ids.split_off(size);
        chunks.push(std::mem::replace(&mut message_ids, rest));
    }
    if !message_ids.is_empty() {
        chunks.push(message_ids);
    }
    chunks
}

#[cfg(all(test, feature = "mysql"))]
mod tests {
    use super::hex_digits;

    #[test]
    fn hex_digits_are_each_bytes_upper_case() {
        assert_eq!(hex_digits("é\0A\u{7F}"), "C3A900417F");
        assert_eq!(hex_digits([0xFF_u8, 0x10]), "FF10");
        assert_eq!(hex_digits(""), "");
    }
}
