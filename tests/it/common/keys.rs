//! Keys byte for byte, on every backend and in the session settings users give it: what
//! is stored is exactly what was encoded, two distinct keys are never one marker, the
//! single, fast-path and batch paths agree, and a key a backend cannot store is refused
//! before anything is written.

use std::collections::BTreeSet;

use diesel::result::Error;
use diesel_async::SimpleAsyncConnection as _;
use diesel_inbox::schema::MESSAGE_ID_MAX_BYTES;
use diesel_inbox::testing::select_i64;
use diesel_inbox::{InboxError, InboxKey, InvalidBatchKey, InvalidKey, Outcome};
use proptest::prelude::*;
use proptest::strategy::ValueTree as _;
use proptest::test_runner::{Config, TestRunner};

use super::batch::batch_credit;
use super::{Credit, TestDb, connect_with, create_tables, credit_reading_first};

/// What a backend stores, and how the test reads it back.
pub struct Storage {
    /// Whether a NUL is refused (PostgreSQL's `text`).
    pub refuses_nul: bool,
    /// An SQL expression for `message_id`'s bytes as upper-case hex digits.
    pub stored_hex: &'static str,
    /// The hex digits that expression gives for a key: its UTF-8 bytes, or the bytes of
    /// the database's encoding.
    pub expected_hex: fn(&str) -> String,
}

/// The UTF-8 bytes of `key` as upper-case hex digits.
pub fn utf8_hex(key: &str) -> String {
    key.bytes().map(|byte| format!("{byte:02X}")).collect()
}

/// How many cases the property test runs: `KEY_CASES`, or a short run for CI.
fn cases() -> u32 {
    std::env::var("KEY_CASES").map_or(24, |n| n.parse().expect("KEY_CASES is a number"))
}

/// Keys as they come: arbitrary text, text made of the characters that trip encodings
/// up (NUL, quotes, backslashes, astral and combining characters), and tuples of them.
fn key() -> impl Strategy<Value = String> {
    let awkward = prop::collection::vec(
        prop_oneof![
            Just('\0'),
            Just('\''),
            Just('\\'),
            Just('"'),
            Just('é'),
            Just('\u{301}'),
            Just('\u{FEFF}'),
            Just('🦀'),
            Just('\u{10FFFF}'),
            any::<char>(),
        ],
        1..12,
    )
    .prop_map(String::from_iter);
    let text = prop_oneof![any::<String>(), awkward, "[a-z0-9:-]{1,8}"];
    prop_oneof![
        3 => text.clone(),
        1 => (text, any::<i64>()).prop_map(|tuple| tuple.encode().unwrap_or_default()),
    ]
}

/// Why the backend refuses `key`, if it does.
fn refusal(storage: &Storage, key: &str) -> Option<InvalidKey> {
    if key.is_empty() {
        Some(InvalidKey::Empty)
    } else if key.len() > MESSAGE_ID_MAX_BYTES {
        Some(InvalidKey::TooLong { len: key.len() })
    } else if storage.refuses_nul {
        key.find('\0').map(|at| InvalidKey::Nul { at })
    } else {
        None
    }
}

/// The property test: generated batches of keys through the single, fast-path and batch
/// paths, on a session set up with `settings`.
pub async fn keys_are_stored_as_encoded<D: TestDb>(db: D, settings: &str, storage: Storage) {
    create_tables(&db, 1).await;
    let mut conn = connect_with(&db, settings).await;
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        ..Config::default()
    });
    let batches = prop::collection::vec(key(), 1..6);
    for _ in 0..cases() {
        let keys = batches
            .new_tree(&mut runner)
            .expect("a batch of keys")
            .current();
        check_keys(&mut conn, &storage, &keys).await;
        conn.batch_execute("DELETE FROM inbox")
            .await
            .expect("clear");
    }
}

async fn check_keys<C>(conn: &mut C, storage: &Storage, keys: &[String])
where
    C: diesel_inbox::testing::TestConnection,
{
    let credits: Vec<Credit> = keys
        .iter()
        .map(|key| Credit {
            message_id: key.clone(),
            account: 0,
            amount: 1,
        })
        .collect();
    let mut stored = BTreeSet::new();
    for credit in &credits {
        let key = &credit.message_id;
        match refusal(storage, key) {
            Some(reason) => {
                let error = super::credit(conn, credit).await.expect_err("refused");
                assert_eq!(invalid_key(&error), Some(&reason), "{key:?}");
                let error = credit_reading_first(conn, credit)
                    .await
                    .expect_err("refused");
                assert_eq!(invalid_key(&error), Some(&reason), "{key:?}");
            }
            None => {
                let first = if stored.insert(key.clone()) {
                    Outcome::Processed(())
                } else {
                    Outcome::Duplicate
                };
                assert_eq!(super::credit(conn, credit).await, Ok(first), "{key:?}");
                assert_eq!(
                    credit_reading_first(conn, credit).await,
                    Ok(Outcome::Duplicate),
                    "{key:?}"
                );
            }
        }
    }
    assert_stored(conn, storage, "credit", &stored).await;

    let batch = batch_credit(conn, &credits).await;
    // The first key that cannot be encoded, else the first the backend cannot store.
    let refused: Vec<(usize, InvalidKey)> = credits
        .iter()
        .enumerate()
        .filter_map(|(index, credit)| Some((index, refusal(storage, &credit.message_id)?)))
        .collect();
    let unencodable = refused
        .iter()
        .find(|(_, reason)| !matches!(reason, InvalidKey::Nul { .. }));
    match unencodable.or(refused.first()).cloned() {
        Some((index, reason)) => {
            let error = batch.expect_err("the batch is refused");
            assert_eq!(
                InboxError::find(&error),
                Some(&InboxError::InvalidBatchKey(InvalidBatchKey {
                    index,
                    reason
                })),
                "{keys:?}"
            );
            assert_stored(conn, storage, "batch_credit", &BTreeSet::new()).await;
        }
        None => {
            let outcome = batch.unwrap_or_else(|error| panic!("{keys:?}: {error}"));
            assert_eq!(outcome.processed(), stored.len(), "{keys:?}");
            assert_stored(conn, storage, "batch_credit", &stored).await;
        }
    }
}

/// `consumer`'s markers are exactly `keys`, byte for byte.
async fn assert_stored<C>(conn: &mut C, storage: &Storage, consumer: &str, keys: &BTreeSet<String>)
where
    C: diesel_inbox::testing::TestConnection,
{
    // The consumer compared as hex digits, as the keys are: a text literal would be
    // read in the session's connection character set, which a binary column does not
    // share (MySQL's UTF-16 connection).
    let of_consumer = format!(
        "{} = '{}'",
        storage.stored_hex.replace("message_id", "consumer"),
        (storage.expected_hex)(consumer)
    );
    let count = format!("SELECT COUNT(*) FROM inbox WHERE {of_consumer}");
    assert_eq!(
        select_i64(conn, &count).await.unwrap(),
        keys.len() as i64,
        "{consumer}: {keys:?}"
    );
    for key in keys {
        let exact = format!(
            "SELECT COUNT(*) FROM inbox WHERE {of_consumer} AND {} = '{}'",
            storage.stored_hex,
            (storage.expected_hex)(key)
        );
        assert_eq!(
            select_i64(conn, &exact).await.unwrap(),
            1,
            "{consumer}: {key:?} is not stored as encoded"
        );
    }
}

fn invalid_key(error: &Error) -> Option<&InvalidKey> {
    match InboxError::find(error)? {
        InboxError::InvalidKey(invalid) => Some(invalid),
        _ => None,
    }
}

/// The scenario as a test of each session setting a suite gives: `name => "settings"`.
macro_rules! key_scenarios {
    ($db:expr, $storage:expr; $($test:ident => $settings:expr),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $test() {
            if let Some(db) = $db(stringify!($test)).await {
                common::bounded(common::keys::keys_are_stored_as_encoded(
                    db.clone(),
                    $settings,
                    $storage,
                ))
                .await;
                common::TestDb::cleanup(db).await;
            }
        }
    )+};
}
