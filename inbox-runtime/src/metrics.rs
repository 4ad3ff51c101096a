//! Counters and a duration histogram per consumer and outcome, and the outbox relay's
//! per outcome, through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`). Never labelled by key or destination: their cardinality is unbounded.

use std::time::Duration;

/// Deliveries handled, by `consumer` and `outcome` (`processed`, `duplicate`,
/// `in_progress` in claim mode, `handler_error`, `database_error`).
pub const DELIVERIES: &str = "diesel_inbox_deliveries_total";

/// Seconds from the handler's call to its return, by `consumer` and `outcome`.
pub const DELIVERY_DURATION: &str = "diesel_inbox_delivery_duration_seconds";

/// Outbox messages a [`Relay`](crate::outbox::Relay) settled, by `outcome`: `sent`
/// (confirmed by the broker and marked sent), `retried` (a failed publish, to be tried
/// again later) and `parked` (one that cannot be published).
pub const OUTBOX_MESSAGES: &str = "diesel_inbox_outbox_messages_total";

/// Seconds from a relay's publish to the broker's answer, by `outcome`: `confirmed`,
/// `failed`, or `timed_out`.
pub const OUTBOX_PUBLISH_DURATION: &str = "diesel_inbox_outbox_publish_duration_seconds";

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
    metrics::describe_counter!(
        OUTBOX_MESSAGES,
        metrics::Unit::Count,
        "Outbox messages the relay settled, by outcome (sent, retried, parked)"
    );
    metrics::describe_histogram!(
        OUTBOX_PUBLISH_DURATION,
        metrics::Unit::Seconds,
        "Seconds from the relay's publish to the broker's answer, by outcome"
    );
}

/// Describes the metrics to the recorder installed at the first use.
fn describe_once() {
    static DESCRIBED: std::sync::Once = std::sync::Once::new();
    DESCRIBED.call_once(describe);
}

pub(crate) fn record(consumer: &'static str, outcome: &'static str, elapsed: Duration) {
    describe_once();
    let labels = [("consumer", consumer), ("outcome", outcome)];
    metrics::counter!(DELIVERIES, &labels).increment(1);
    metrics::histogram!(DELIVERY_DURATION, &labels).record(elapsed.as_secs_f64());
}

/// One relay round: its messages' outcomes, and each publish's duration.
#[cfg(feature = "relay")]
pub(crate) fn record_round(
    settled: [(&'static str, usize); 3],
    publishes: impl Iterator<Item = (&'static str, Duration)>,
) {
    describe_once();
    for (outcome, count) in settled {
        metrics::counter!(OUTBOX_MESSAGES, "outcome" => outcome).increment(count as u64);
    }
    for (outcome, elapsed) in publishes {
        metrics::histogram!(OUTBOX_PUBLISH_DURATION, "outcome" => outcome)
            .record(elapsed.as_secs_f64());
    }
}
