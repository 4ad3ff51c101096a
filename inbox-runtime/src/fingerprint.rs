//! Payload fingerprints: a key reused for a different payload is a producer's bug, and
//! must not vanish as a duplicate.

use std::fmt;

use diesel::QueryResult;
use diesel_async::AsyncConnection;
use sha2::{Digest as _, Sha256};

use crate::backend::InboxBackend;
use crate::backend::claim_statements::{ClaimKey, ClaimStatements as _};
use crate::error::FingerprintMismatch;

/// The SHA-256 of a message's payload, as stored with its marker: 64 lowercase hex
/// digits.
///
/// `#[idempotent(…, fingerprint = <expr>)]` takes it from `<expr>`, any bytes or text
/// (`AsRef<[u8]>`: `&[u8]`, `Vec<u8>`, `&str`, `String`, …). Take it from the payload
/// as received, before parsing, so that two encodings of one message still count as
/// one only if they are byte for byte the same.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// The fingerprint of `payload`.
    pub fn of<P: AsRef<[u8]> + ?Sized>(payload: &P) -> Self {
        let digest = Sha256::digest(payload.as_ref());
        let mut hex = String::with_capacity(2 * digest.len());
        for byte in digest {
            hex.push(char::from_digit(u32::from(byte >> 4), 16).expect("a nibble"));
            hex.push(char::from_digit(u32::from(byte & 0xf), 16).expect("a nibble"));
        }
        Self(hex)
    }

    /// The 64 hex digits stored in the inbox's `fingerprint` column.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Compares the fingerprint stored with a marker to a delivery's. A marker stored
/// without one (before the handler had a `fingerprint`, or by 0.1) matches any.
pub(crate) fn check(
    message_id: &str,
    consumer: &str,
    stored: Option<String>,
    delivered: Option<&Fingerprint>,
) -> Result<(), FingerprintMismatch> {
    match (stored, delivered) {
        (Some(stored), Some(delivered)) if stored != delivered.as_str() => {
            Err(FingerprintMismatch {
                message_id: message_id.to_owned(),
                consumer: consumer.to_owned(),
                stored,
                delivered: delivered.to_string(),
            })
        }
        _ => Ok(()),
    }
}

/// Reads the fingerprint of a committed marker and compares it to a delivery's, once
/// the delivery has been found a duplicate. A marker's fingerprint never changes after
/// its insert commits, so a plain read is enough.
pub(crate) async fn check_stored<C>(
    conn: &mut C,
    message_id: String,
    consumer: &'static str,
    delivered: &Fingerprint,
) -> QueryResult<()>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let key = ClaimKey {
        message_id,
        consumer: consumer.to_owned(),
    };
    let stored = C::Backend::read_marker(conn, key.clone())
        .await?
        .and_then(|marker| marker.fingerprint);
    let message_id = key.message_id;
    Ok(check(&message_id, consumer, stored, Some(delivered))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_sha256_in_hex() {
        assert_eq!(
            Fingerprint::of("abc").as_str(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            Fingerprint::of(b"abc"),
            Fingerprint::of(&String::from("abc"))
        );
        assert_ne!(Fingerprint::of("abc"), Fingerprint::of("abd"));
    }

    #[test]
    fn a_marker_without_a_fingerprint_matches_any() {
        let delivered = Fingerprint::of("payload");
        assert!(check("m", "c", None, Some(&delivered)).is_ok());
        assert!(check("m", "c", Some(delivered.to_string()), Some(&delivered)).is_ok());
        assert!(check("m", "c", Some(String::from("other")), None).is_ok());
        let mismatch = check("m", "c", Some(String::from("other")), Some(&delivered))
            .expect_err("another payload");
        assert_eq!(mismatch.stored, "other");
        let error = diesel::result::Error::from(mismatch.clone());
        assert_eq!(
            crate::InboxError::find(&error),
            Some(&crate::InboxError::FingerprintMismatch(mismatch))
        );
        assert_eq!(crate::classify(&error), crate::ErrorClass::Permanent);
    }
}
