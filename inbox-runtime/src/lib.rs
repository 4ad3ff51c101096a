//! Runtime support for [diesel-inbox](https://docs.rs/diesel-inbox): the inbox schema,
//! key encoding, error classification and the exactly-once transaction that
//! `#[idempotent]` handlers run.
//!
//! Depend on `diesel-inbox`, which re-exports everything here that users need.

// docs.rs marks each item with the cargo features it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]
// Without a backend, the statements' row types are reached only through the sealed
// traits' `impl Future` outputs, which `unreachable_pub` does not follow on rustc 1.87.
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(unreachable_pub)
)]

mod backend;
#[cfg(any(feature = "pruner", feature = "relay"))]
mod background;
mod batch;
mod begin;
mod body_scope;
mod call;
pub mod claims;
mod classify;
mod disposition;
mod enclosing;
mod error;
mod fast_path;
mod fingerprint;
mod handler;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[doc(hidden)]
pub mod instances;
mod key;
#[cfg(feature = "metrics")]
pub mod metrics;
mod migrate;
pub mod outbox;
mod outcome;
mod prune;
#[cfg(feature = "pruner")]
mod pruner;
mod registry;
mod report;
mod retention;
#[cfg(feature = "retry")]
mod retry;
pub mod schema;
mod session_check;
mod step;
mod test_transaction;
#[cfg(feature = "testing")]
pub mod testing;
mod transaction;
mod verdict;

pub use backend::InboxBackend;
pub use batch::{
    BatchClosed, BatchClosing, BatchKeys, BatchOutcome, BatchParameter, BatchStopped, InBatch,
    MessageIds, OwnedBatch, batch_key_fn, batch_messages, begin_batch, owned_batch,
};
pub use begin::{Begin, BeginInSequence, BeginPipelined, BeginProbe};
#[doc(hidden)]
pub use claims::protocol::{Claimed, NotClaimed, Settled, Settling, claim_delivery};
pub use claims::{Claim, ClaimPolicy};
pub use classify::{ErrorClass, classify};
pub use disposition::Disposition;
pub use error::{
    ClaimError, FingerprintMismatch, InboxError, InvalidBatchKey, KeyCollision, NestedHandler,
};
pub use fast_path::FastPath;
pub use fingerprint::Fingerprint;
pub use handler::{
    ConnectionParameter, Handler, HandlerError, HandlerResult, RegisteredHandler, Registration,
    fake_return, registered_handlers,
};
// The registration's expansion submits to the program-wide list through it.
#[cfg(any(feature = "pruner", feature = "relay"))]
pub use background::ConnectionSource;
#[doc(hidden)]
pub use body_scope::InBody;
#[doc(hidden)]
pub use inventory;
pub use key::{InboxKey, InvalidKey, MissingKey, encode_key};
pub use migrate::{migrate, upgrade_unique_index};
pub use outcome::Outcome;
pub use prune::prune;
#[cfg(feature = "pruner")]
pub use pruner::{Pace, Pruner, prune_paced};
pub use registry::{SharedConsumers, check_consumers};
pub use retention::Retention;
#[cfg(feature = "retry")]
pub use retry::{RetryPolicy, retry};
#[doc(hidden)]
pub use step::{Begun, Ended, Ending, Step};
#[doc(hidden)]
pub use transaction::{Closed, Closing, InTransaction, Stopped, begin_transaction};
pub use verdict::{
    Classified, Classify, DatabaseClassOf, HandlerErrorType, OpaqueError, ReadsErrorChain,
    class_of, find_database_error, retry_after_of,
};
