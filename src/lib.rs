//! Exactly-once effects for at-least-once message delivery, on diesel-async.
//!
//! Brokers redeliver: a lost ack, an expired lock, a consumer killed between its commit
//! and its ack. With several consumer instances the second copy often arrives while the
//! first is still running, so `if already_seen { return }` lets both through.
//! diesel-inbox lets the database decide instead. Each handler's business change commits
//! in one transaction with a marker row in the `inbox` table, whose unique index on
//! (`message_id`, `consumer`) admits exactly one of any number of concurrent deliveries.
//!
//! ```no_run
//! # #[cfg(feature = "postgres")] mod example {
//! use diesel::prelude::*;
//! use diesel_async::{AsyncPgConnection, RunQueryDsl};
//! use diesel_inbox::{Disposition, idempotent};
//!
//! diesel::table! { accounts (id) { id -> BigInt, balance -> BigInt } }
//!
//! pub struct CreditRequested { pub message_id: uuid::Uuid, pub account_id: i64, pub amount: i64 }
//!
//! #[idempotent(consumer = "credit", key = msg.message_id)]
//! async fn credit(
//!     conn: &mut AsyncPgConnection,
//!     msg: &CreditRequested,
//! ) -> Result<(), diesel::result::Error> {
//!     diesel::update(accounts::table.find(msg.account_id))
//!         .set(accounts::balance.eq(accounts::balance + msg.amount))
//!         .execute(conn)
//!         .await?;
//!     Ok(())
//! }
//!
//! async fn on_delivery(conn: &mut AsyncPgConnection, msg: &CreditRequested) -> Disposition {
//!     // `Ack` for Processed and Duplicate, `Retry` for a deadlock, a timeout or a lost
//!     // connection, `DeadLetter` for what no retry can fix.
//!     Disposition::of(&credit(conn, msg).await)
//! }
//! # }
//! ```
//!
//! # Guarantees
//!
//! - [`Outcome::Processed`] means the handler's writes and its marker committed together.
//! - [`Outcome::Duplicate`] means an earlier delivery committed; the handler did not run.
//! - `Err` means nothing of this call was committed.
//!
//! The effect is exactly-once only for writes made through the connection the handler
//! receives. The fine print (transactions, session settings, keys, cancellation) is in
//! [`guide::guarantees`].
//!
//! # Modes
//!
//! - **Transactional**, the default: the body's writes and the marker commit in one
//!   transaction.
//! - **Claim mode**, `#[idempotent(…, claim)]`, for a side effect outside the database
//!   (an HTTP call, an e-mail): at most one delivery at a time runs the body, and a
//!   stable [`Claim::idempotency_key`] lets the downstream system drop a repeat
//!   ([`guide::claim_mode`], [`claims`]).
//! - **Batches**, `#[idempotent(…, batch = msgs, key = |msg| …)]`: many messages in one
//!   transaction, each still decided on its own ([`guide::batches`]).
//!
//! # Start-up
//!
//! Create the inbox table with [`migrate`] (idempotent, safe from several instances at
//! once) or copy the migration for your backend, then call [`check_consumers`] once:
//! handlers from different crates that share a consumer name only meet in the final
//! program, where `cargo check` cannot see them ([`guide::setup`]).
//!
//! # Guides
//!
//! [`guide`] explains each topic once: [setup](guide::setup),
//! [guarantees](guide::guarantees), [acknowledging and retrying](guide::acknowledging),
//! [claim mode](guide::claim_mode), [batches](guide::batches),
//! [brokers](guide::brokers) (RabbitMQ, NATS, Kafka), [pruning and retention](guide::pruning),
//! [clusters](guide::clusters) (Galera), [testing your handlers](guide::testing),
//! [tracing and metrics](guide::observability) and [costs](guide::costs).
//!
//! # Features
//!
//! Every database and integration is a cargo feature; enable the backends you use.
//!
//! | feature | what it adds |
//! |---|---|
//! | `postgres`, `mysql`, `sqlite` | the matching diesel-async backend (none is on by default: name yours) |
//! | `testing` | `testing`: a database of each test's own, with the inbox migrated |
//! | `retry` | `retry`: runs a handler again, with backoff, while its error is retryable |
//! | `pruner` | `Pruner`: prunes old markers in a background task |
//! | `relay` | `outbox::Relay`: publishes the outbox's messages in a background task |
//! | `metrics` | `metrics`: a counter and a duration histogram per consumer and outcome |
//! | `anyhow` | [`Classify`] for `anyhow::Error` |
//! | `deadpool`, `bb8` | [`Classify`] for the pools' errors, and a pool as a `Pruner`'s or a `Relay`'s connections |
//!
//! The broker glue, a delivery's key and a [`Disposition`] carried out on the broker, is
//! in crates of its own: `diesel-inbox-lapin` (RabbitMQ), `diesel-inbox-nats` (NATS
//! JetStream) and `diesel-inbox-kafka` ([`guide::brokers`]).

// docs.rs marks each item with the cargo features it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]

// The README's Rust snippets compile as written: `cargo test --doc` builds them.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeSnippets;

pub use inbox_macros::idempotent;
#[cfg(any(feature = "pruner", feature = "relay"))]
pub use inbox_runtime::ConnectionSource;
pub use inbox_runtime::claims;
#[cfg(feature = "metrics")]
pub use inbox_runtime::metrics;
pub use inbox_runtime::outbox;
pub use inbox_runtime::schema;
pub use inbox_runtime::{BatchOutcome, InvalidBatchKey};
pub use inbox_runtime::{
    Claim, ClaimError, Classified, Classify, Disposition, ErrorClass, Fingerprint,
    FingerprintMismatch, InboxBackend, InboxError, InboxKey, InvalidKey, KeyCollision, MissingKey,
    NestedHandler, Outcome, RegisteredHandler, Retention, SharedConsumers, check_consumers,
    class_of, classify, find_database_error, migrate, prune, registered_handlers, retry_after_of,
    upgrade_unique_index,
};
#[cfg(feature = "pruner")]
pub use inbox_runtime::{Pace, Pruner, prune_paced};
#[cfg(feature = "retry")]
pub use inbox_runtime::{RetryPolicy, retry};

pub mod guide;

/// Items the `#[idempotent]` expansion refers to. Not part of the public API.
#[doc(hidden)]
pub mod __private {
    pub use inbox_runtime::{BatchKeys, batch_key_fn, batch_messages, begin_batch, owned_batch};
    pub use inbox_runtime::{BeginInSequence, BeginPipelined, BeginProbe};
    pub use inbox_runtime::{
        ClaimPolicy, ConnectionParameter, DatabaseClassOf, FastPath, Fingerprint, Handler,
        HandlerError, HandlerErrorType, HandlerResult, OpaqueError, ReadsErrorChain, fake_return,
        register_handler,
    };
    pub use inbox_runtime::{begin_transaction, claim_delivery};
}

#[cfg(feature = "testing")]
pub mod testing {
    //! A database of each test's own, with the inbox migrated: the database-per-test that
    //! `#[sqlx::test]` gives sqlx users, for PostgreSQL, MySQL/MariaDB and SQLite.
    //!
    //! The inbox table is always called `inbox`, so tests that run at the same time must not
    //! share a schema: one test's markers would make another's messages duplicates.
    //! [`TestDatabase`] creates a place of the test's own, named `inbox_test_<name>`:
    //!
    //! | backend | place | connections |
    //! |---|---|---|
    //! | PostgreSQL | a schema | `search_path` and `application_name` set to the schema |
    //! | MySQL / MariaDB | a database | connected to that database |
    //! | SQLite | a file in a new temporary directory | `PRAGMA busy_timeout`, then WAL |
    //!
    //! It only ever drops what carries that prefix. [`TestDatabase::cleanup`] drops it at
    //! the end of the test. A test that panicked leaves its schema or database behind to
    //! be inspected, and the next run of the same test drops it before starting; an
    //! SQLite file goes when the last clone of its `TestDatabase` drops, panic or not.
    //!
    //! A test of a handler, and handlers inside `begin_test_transaction`:
    //! [`guide::testing`](crate::guide::testing).

    pub use inbox_runtime::testing::*;
}
