//! Guides: how diesel-inbox works and how to run it, one topic a page.
//!
//! The items of the crate carry the reference (every argument, error and method); these
//! pages explain how the pieces fit and why. Each topic is explained on one page, and the
//! others link to it. Read [`setup`] and [`guarantees`] first; the rest as you need it.
//!
//! | guide | what it covers |
//! |---|---|
//! | [`setup`] | the dependency, the inbox table, the attribute, consumer names across crates |
//! | [`guarantees`] | what `Processed`, `Duplicate` and `Err` promise, and what they do not |
//! | [`acknowledging`] | from a handler's result to the broker's ack: what is retried, your own errors, retrying in a fresh transaction |
//! | [`claim_mode`] | effects outside the database (e-mail, payments, HTTP calls): claims, leases, takeovers, operators |
//! | [`batches`] | many messages in one transaction, each still decided on its own |
//! | [`outbox`] | publishing follow-up messages in the handler's transaction, and the relay that delivers them |
//! | [`brokers`] | the crates for RabbitMQ, NATS JetStream and Kafka: what their glue promises, which field is the key |
//! | [`pruning`] | deleting old markers, and how long to keep them for each broker |
//! | [`clusters`] | MariaDB Galera and other multi-node databases |
//! | [`testing`] | a database of each test's own, and handlers inside test transactions |
//! | [`observability`] | the `tracing` span and events, and the metrics |
//! | [`costs`] | what a message costs in statements, round trips and throughput |
//!
//! The code on these pages is compiled as doctests, with every feature of the crate on.

#[doc = include_str!("setup.md")]
pub mod setup {}

#[doc = include_str!("guarantees.md")]
pub mod guarantees {}

#[doc = include_str!("acknowledging.md")]
pub mod acknowledging {}

#[doc = include_str!("claim_mode.md")]
pub mod claim_mode {}

#[doc = include_str!("batches.md")]
pub mod batches {}

#[doc = include_str!("outbox.md")]
pub mod outbox {}

#[doc = include_str!("brokers.md")]
pub mod brokers {}

#[doc = include_str!("pruning.md")]
pub mod pruning {}

#[doc = include_str!("clusters.md")]
pub mod clusters {}

#[doc = include_str!("testing.md")]
pub mod testing {}

#[doc = include_str!("observability.md")]
pub mod observability {}

#[doc = include_str!("costs.md")]
pub mod costs {}
