//! Turning a message's key into the stored `message_id`.

use std::fmt::{self, Write as _};

use crate::schema::MESSAGE_ID_MAX_BYTES;

/// A value that identifies a message, stored as the inbox's `message_id`.
///
/// The encoding is injective for each implementing type: two different values never
/// produce the same text. Strings, UUIDs and integers are stored as their plain text so
/// the table stays readable; tuple components are length-prefixed (`("a:b", "c")` is
/// `3:a:b1:c`, `("a", "b:c")` is `1:a3:b:c`) so no separator inside a component can make
/// two tuples collide.
///
/// Implement it for your own id types by delegating to one of these, keeping the
/// encoding injective.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as an inbox key",
    label = "this key's type does not implement `diesel_inbox::InboxKey`",
    note = "use a `String`, `&str`, `uuid::Uuid`, an integer, a reference to one of these, \
            or a tuple of up to 3 of them, or implement `diesel_inbox::InboxKey` for your type"
)]
pub trait InboxKey {
    /// Appends this key's text to `out`.
    ///
    /// # Errors
    ///
    /// [`InvalidKey::Empty`] for an empty text component.
    fn write_key(&self, out: &mut String) -> Result<(), InvalidKey>;

    /// The `message_id` this key is stored as.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`] for an empty key or one longer than the `message_id` column.
    fn encode(&self) -> Result<String, InvalidKey> {
        encode_key(self)
    }
}

/// Why a key cannot be stored.
///
/// Reaches the handler's caller wrapped in
/// [`diesel::result::Error::SerializationError`]; nothing has been written.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidKey {
    /// The key, or a text component of it, is empty.
    Empty,
    /// The encoded key is longer than the `message_id` column.
    TooLong {
        /// Length of the encoded key, in bytes.
        len: usize,
    },
    /// The encoded key holds a NUL character, which PostgreSQL's `text` cannot store.
    /// MySQL/MariaDB and SQLite store it like any other character.
    Nul {
        /// Where the first NUL is in the encoded key, in bytes.
        at: usize,
    },
}

impl fmt::Display for InvalidKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str(
                "inbox key is empty: every message without an id would count as a \
                 duplicate of the first one",
            ),
            Self::TooLong { len } => write!(
                f,
                "inbox key is {len} bytes, longer than the {MESSAGE_ID_MAX_BYTES}-byte \
                 message_id column; it is rejected because truncating it could make \
                 distinct messages look like duplicates"
            ),
            Self::Nul { at } => write!(
                f,
                "inbox key holds a NUL character at byte {at}, which PostgreSQL cannot store \
                 in text; it is rejected before anything is written"
            ),
        }
    }
}

impl std::error::Error for InvalidKey {}

/// A delivery without a field the inbox can key it by.
///
/// Such a message cannot be told apart from its own redeliveries, so it is never
/// processed: dead-letter it with this error's text as the reason. The broker crates
/// (`diesel-inbox-lapin`, `diesel-inbox-nats`, `diesel-inbox-kafka`) return it from their
/// `message_key`, and glue of your own for another broker can too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingKey {
    field: &'static str,
}

impl MissingKey {
    /// A delivery that lacks `field` (say, "message_id property"), or has it empty.
    pub fn new(field: &'static str) -> Self {
        Self { field }
    }

    /// The broker field that was absent or empty.
    pub fn field(&self) -> &'static str {
        self.field
    }
}

impl fmt::Display for MissingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "message has no {}: without a key that stays the same across redeliveries it \
             cannot be processed exactly once, so it was not processed",
            self.field
        )
    }
}

impl std::error::Error for MissingKey {}

/// Encodes `key` into the text stored as `message_id`, checking that it fits.
pub fn encode_key<K: InboxKey + ?Sized>(key: &K) -> Result<String, InvalidKey> {
    let mut encoded = String::new();
    key.write_key(&mut encoded)?;
    match encoded.len() {
        0 => Err(InvalidKey::Empty),
        len if len > MESSAGE_ID_MAX_BYTES => Err(InvalidKey::TooLong { len }),
        _ => Ok(encoded),
    }
}

impl InboxKey for str {
    fn write_key(&self, out: &mut String) -> Result<(), InvalidKey> {
        if self.is_empty() {
            return Err(InvalidKey::Empty);
        }
        out.push_str(self);
        Ok(())
    }
}

impl InboxKey for String {
    fn write_key(&self, out: &mut String) -> Result<(), InvalidKey> {
        self.as_str().write_key(out)
    }
}

impl InboxKey for uuid::Uuid {
    fn write_key(&self, out: &mut String) -> Result<(), InvalidKey> {
        out.push_str(
            self.hyphenated()
                .encode_lower(&mut uuid::Uuid::encode_buffer()),
        );
        Ok(())
    }
}

impl<K: InboxKey + ?Sized> InboxKey for &K {
    fn write_key(&self, out: &mut String) -> Result<(), InvalidKey> {
        (**self).write_key(out)
    }
}

macro_rules! integer_keys {
    ($($int:ty),*) => {$(
        impl InboxKey for $int {
            fn write_key(&self, out: &mut String) -> Result<(), InvalidKey> {
                write!(out, "{self}").expect("writing to a String cannot fail");
                Ok(())
            }
        }
    )*};
}

integer_keys!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize
);

/// Appends `component` as `<byte length>:<text>`.
fn write_component<K: InboxKey + ?Sized>(
    component: &K,
    out: &mut String,
) -> Result<(), InvalidKey> {
    let start = out.len();
    component.write_key(out)?;
    let prefix = format!("{}:", out.len() - start);
    out.insert_str(start, &prefix);
    Ok(())
}

macro_rules! tuple_keys {
    ($(($($part:ident),+)),*) => {$(
        impl<$($part: InboxKey),+> InboxKey for ($($part,)+) {
            #[allow(non_snake_case)]
            fn write_key(&self, out: &mut String) -> Result<(), InvalidKey> {
                let ($($part,)+) = self;
                $(write_component($part, out)?;)+
                Ok(())
            }
        }
    )*};
}

tuple_keys!((A), (A, B), (A, B, C));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_are_stored_as_plain_text() {
        assert_eq!(encode_key("m-1").unwrap(), "m-1");
        assert_eq!(encode_key(&String::from("m-1")).unwrap(), "m-1");
        assert_eq!(encode_key(&-42_i64).unwrap(), "-42");
        assert_eq!(encode_key(&u128::MAX).unwrap(), u128::MAX.to_string());
        let id = uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        assert_eq!(
            encode_key(&id).unwrap(),
            "01234567-89ab-cdef-0123-456789abcdef"
        );
        assert_eq!(encode_key(&&&id).unwrap(), encode_key(&id).unwrap());
        assert_eq!(("a", 1).encode().unwrap(), "1:a1:1");
    }

    #[test]
    fn separators_inside_tuple_components_cannot_collide() {
        let left = encode_key(&("a:b", "c")).unwrap();
        let right = encode_key(&("a", "b:c")).unwrap();
        assert_eq!(left, "3:a:b1:c");
        assert_eq!(right, "1:a3:b:c");
        assert_ne!(
            encode_key(&("1:a", "b")).unwrap(),
            encode_key(&("1", "a1:b")).unwrap()
        );
    }

    #[test]
    fn kafka_coordinates_encode_every_component() {
        let key = (String::from("orders"), 3_i32, 42_i64);
        assert_eq!(encode_key(&key).unwrap(), "6:orders1:32:42");
        assert_eq!(encode_key(&(7_u32,)).unwrap(), "1:7");
    }

    #[test]
    fn lengths_count_bytes_not_chars() {
        assert_eq!(encode_key(&("é", 1)).unwrap(), "2:é1:1");
    }

    #[test]
    fn empty_keys_and_components_are_rejected() {
        assert_eq!(encode_key(""), Err(InvalidKey::Empty));
        assert_eq!(encode_key(&String::new()), Err(InvalidKey::Empty));
        assert_eq!(encode_key(&("topic", "")), Err(InvalidKey::Empty));
    }

    /// A key type of the user's own that writes nothing is as empty as `""`.
    #[test]
    fn a_key_that_writes_nothing_is_rejected() {
        struct Blank;
        impl InboxKey for Blank {
            fn write_key(&self, _out: &mut String) -> Result<(), InvalidKey> {
                Ok(())
            }
        }
        assert_eq!(encode_key(&Blank), Err(InvalidKey::Empty));
    }

    #[test]
    fn overlong_keys_are_rejected_not_truncated() {
        let longest = "x".repeat(MESSAGE_ID_MAX_BYTES);
        assert_eq!(encode_key(longest.as_str()).unwrap(), longest);
        let over = "x".repeat(MESSAGE_ID_MAX_BYTES + 1);
        assert_eq!(
            encode_key(over.as_str()),
            Err(InvalidKey::TooLong {
                len: MESSAGE_ID_MAX_BYTES + 1
            })
        );
        let err = diesel::result::Error::from(InvalidKey::TooLong { len: 600 });
        assert!(err.to_string().contains("rejected"), "{err}");
    }

    /// Reads an encoded tuple back into its components' texts: `<byte length>:<text>`
    /// after one another. A key that decodes back to its components is injective.
    fn components(mut encoded: &str) -> Option<Vec<String>> {
        let mut parts = Vec::new();
        while !encoded.is_empty() {
            let (len, rest) = encoded.split_once(':')?;
            let len: usize = len.parse().ok()?;
            parts.push(rest.get(..len)?.to_owned());
            encoded = rest.get(len..)?;
        }
        Some(parts)
    }

    /// Text components, heavy in the digits and `:` of the length prefixes, or any text.
    fn component() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof!["[a:0-9]{1,40}", "\\PC{1,40}"]
    }

    proptest::proptest! {
        #[test]
        fn tuples_decode_back_to_their_components(
            first in component(),
            number in proptest::num::i64::ANY,
            last in component(),
        ) {
            let encoded = encode_key(&(first.as_str(), number, last.as_str()));
            proptest::prop_assume!(encoded.is_ok(), "longer than the column");
            proptest::prop_assert_eq!(
                components(&encoded.unwrap()),
                Some(vec![first, number.to_string(), last])
            );
        }

        #[test]
        fn nested_tuples_decode_back_to_their_components(
            a in component(),
            b in component(),
            c in proptest::num::u64::ANY,
        ) {
            let encoded = encode_key(&((a.as_str(), b.as_str()), c)).unwrap();
            let outer = components(&encoded).unwrap();
            proptest::prop_assert_eq!(outer.len(), 2);
            proptest::prop_assert_eq!(components(&outer[0]), Some(vec![a, b]));
            proptest::prop_assert_eq!(&outer[1], &c.to_string());
        }

        #[test]
        fn distinct_pairs_never_share_an_encoding(
            a in "[a:1]{1,12}",
            b in "[a:1]{1,12}",
            c in "[a:1]{1,12}",
            d in "[a:1]{1,12}",
        ) {
            proptest::prop_assume!((&a, &b) != (&c, &d));
            proptest::prop_assert_ne!(
                encode_key(&(a.as_str(), b.as_str())).unwrap(),
                encode_key(&(c.as_str(), d.as_str())).unwrap()
            );
        }
    }
}
