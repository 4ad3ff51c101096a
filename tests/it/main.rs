//! The integration suites, as modules of one test binary: `common` and the dependencies
//! are compiled and linked once rather than once per suite. Filter by module, e.g.
//! `cargo nextest run --all-features --test it galera::`.
//!
//! `tests/consumers.rs` stays a binary of its own: it checks the whole set of handlers
//! linked into its binary, which these suites would change.

#[macro_use]
mod common;

mod claim;
mod compose;
mod galera;
mod handler_semantics;
mod mysql;
mod observability;
mod pipelined;
mod postgres;
mod pruner;
mod relay;
mod silent_end;
mod sqlite;
mod unique_index;
