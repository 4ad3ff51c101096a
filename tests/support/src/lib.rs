//! What diesel-inbox's integration tests, benchmark (`inbox-bench`), crash test
//! (`inbox-chaos`) and quickstart example share, defined once: the credit workload
//! ([`credit`]) and, with the `downstream` feature, the HTTP service a claim-mode
//! handler calls ([`downstream`]). Not published.

pub mod credit;
#[cfg(feature = "downstream")]
pub mod downstream;
