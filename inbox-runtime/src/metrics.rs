//! Counters and a duration histogram per consumer and outcome, through the
//! [`metrics`](https://docs.rs/metrics) facade (feature `metrics`). Never labelled by key:
//! its cardinality is unbounded.

use std::time::Duration;

/// Deliveries handled, by `consumer` and `outcome` (`processed`, `duplicate`,
/// `in_progress` in claim mode, `handler_error`, `database_error`).
pub const DELIVERIES: &str = "diesel_inbox_deliveries_total";

/// Seconds from the handler's call to its return, by `consumer` and `outcome`.
pub const DELIVERY_DURATION: &str = "diesel_inbox_delivery_duration_seconds";

/// Gives the recorder each metric's unit and description, which exporters show (a
/// Prometheus `# HELP` line). The first delivery does it for the recorder installed
/// then; call it again after installing another.
pub fn describe() {
    metrics::describe_counter!(
        DELIVERIES,
        metrics::Unit::Count,
        "Deliveries handled by an #[idempotent] handler, by consumer and outcome"
    );
    metrics::describe_histogram!(
        DELIVERY_DURATION,
        metrics::Unit::Seconds,
        "Seconds from an #[idempotent] handler's call to its return, by consumer and outcome"
    );
}

pub(crate) fn record(consumer: &'static str, outcome: &'static str, elapsed: Duration) {
    static DESCRIBED: std::sync::Once = std::sync::Once::new();
    DESCRIBED.call_once(describe);
    let labels = [("consumer", consumer), ("outcome", outcome)];
    metrics::counter!(DELIVERIES, &labels).increment(1);
    metrics::histogram!(DELIVERY_DURATION, &labels).record(elapsed.as_secs_f64());
}
