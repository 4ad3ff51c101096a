//! Runtime support for [diesel-inbox](https://docs.rs/diesel-inbox): the inbox schema,
//! key encoding, error classification and the exactly-once transaction that
//! `#[idempotent]` handlers run.
//!
//! Depend on `diesel-inbox`, which re-exports everything here that users need.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]

mod backend;
mod classify;
mod fast_path;
mod key;
mod migrate;
mod outcome;
mod registry;
pub mod schema;
mod test_transaction;
#[cfg(feature = "testing")]
pub mod testing;
mod transaction;

pub use backend::InboxBackend;
pub use classify::{ErrorClass, classify};
pub use fast_path::FastPath;
#[doc(hidden)]
pub use inventory;
pub use key::{InboxKey, InvalidKey, encode_key};
pub use migrate::migrate;
pub use outcome::Outcome;
pub use registry::{RegisteredHandler, SharedConsumers, check_consumers, registered_handlers};
pub use transaction::{Handler, HandlerError, run};
