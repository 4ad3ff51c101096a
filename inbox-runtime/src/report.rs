//! What a delivery reports: one span, and with the `metrics` feature a count and a
//! duration, for transactional and claim-mode handlers alike.

use std::time::Duration;

use crate::registry::RegisteredHandler;

/// One span per delivery, named after what it does, with OpenTelemetry's messaging
/// attribute names where one fits: the consumer is the consumer group, the key the
/// message id. The outcome, the error class, the duration and, in claim mode, the
/// attempt are recorded as they become known.
pub(crate) fn delivery_span(
    handler: RegisteredHandler,
    message_id: Option<&str>,
    mode: &'static str,
    read_first: bool,
) -> tracing::Span {
    tracing::info_span!(
        "inbox.process",
        messaging.operation.type = "process",
        messaging.consumer.group.name = handler.consumer,
        messaging.message.id = message_id,
        code.function.name = handler.handler,
        inbox.mode = mode,
        inbox.read_first = read_first,
        inbox.attempt = tracing::field::Empty,
        inbox.outcome = tracing::field::Empty,
        inbox.duration_ms = tracing::field::Empty,
        error.type = tracing::field::Empty,
    )
}

/// Records how the delivery ended: `outcome` is one of `processed`, `duplicate`,
/// `in_progress`, `handler_error` and `database_error`.
pub(crate) fn finished(
    span: &tracing::Span,
    handler: RegisteredHandler,
    outcome: &'static str,
    elapsed: Duration,
) {
    span.record("inbox.duration_ms", elapsed.as_secs_f64() * 1e3);
    span.record("inbox.outcome", outcome);
    #[cfg(feature = "metrics")]
    crate::metrics::record(handler.consumer, outcome, elapsed);
    #[cfg(not(feature = "metrics"))]
    let _ = handler;
}
