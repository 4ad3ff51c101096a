//! Counters and a duration histogram per consumer and outcome, through the
//! [`metrics`](https://docs.rs/metrics) facade (feature `metrics`). Never labelled by key:
//! its cardinality is unbounded.

use std::time::Duration;

/// Deliveries handled, by `consumer` and `outcome` (`processed`, `duplicate`,
/// `in_progress` in claim mode, `handler_error`, `database_error`).
pub const DELIVERIES: &str = "diesel_inbox_deliveries_total";

/// Seconds from the handler's call to its return, by `consumer` and `outcome`.
pub const DELIVERY_DURATION: &str = "diesel_inbox_delivery_duration_seconds";

pub(crate) fn record(consumer: &'static str, outcome: &'static str, elapsed: Duration) {
    let labels = [("consumer", consumer), ("outcome", outcome)];
    metrics::counter!(DELIVERIES, &labels).increment(1);
    metrics::histogram!(DELIVERY_DURATION, &labels).record(elapsed.as_secs_f64());
}
