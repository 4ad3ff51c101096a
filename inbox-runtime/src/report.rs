//! What a delivery reports: one span, and with the `metrics` feature a count and a
//! duration, for transactional and claim-mode handlers alike.

use std::time::Duration;

use crate::classify::ErrorClass;
use crate::handler::RegisteredHandler;

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
        target: "diesel_inbox",
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
        error.type = tracing::field::Empty
    )
}

/// One span per batch delivery: [`delivery_span`]'s fields, with the batch's size for
/// the message id, and how many messages were new and how many duplicates.
pub(crate) fn batch_span(handler: RegisteredHandler, message_count: usize) -> tracing::Span {
    tracing::info_span!(
        target: "diesel_inbox",
        "inbox.process_batch",
        messaging.operation.type = "process",
        messaging.consumer.group.name = handler.consumer,
        messaging.batch.message_count = message_count,
        code.function.name = handler.handler,
        inbox.processed = tracing::field::Empty,
        inbox.duplicates = tracing::field::Empty,
        inbox.outcome = tracing::field::Empty,
        inbox.duration_ms = tracing::field::Empty,
        error.type = tracing::field::Empty
    )
}

/// Says that the delivery was found already processed, so its body did not run.
pub(crate) fn duplicate(span: &tracing::Span) {
    tracing::debug!(
        target: "diesel_inbox",
        parent: span,
        "already processed: the body did not run"
    );
}

/// Says that every message of the batch was found already processed, so the body did
/// not run.
pub(crate) fn batch_duplicate(span: &tracing::Span) {
    tracing::debug!(
        target: "diesel_inbox",
        parent: span,
        "every message already processed: the body did not run"
    );
}

/// Records, for an error the handler returned, the class of the database error it holds
/// as the span's `error.type`: a constraint of the body's own writes shows as
/// `Permanent`, a deadlock as `Transient`. An error of the handler's own has none.
pub(crate) fn handler_error(span: &tracing::Span, database_class: Option<ErrorClass>) {
    if let Some(class) = database_class {
        span.record("error.type", tracing::field::debug(class));
    }
}

/// Records how the delivery ended: `outcome` is one of `processed`, `duplicate`,
/// `in_progress`, `handler_error` and `database_error`.
pub(crate) fn finished(
    span: &tracing::Span,
    handler: RegisteredHandler,
    outcome: &'static str,
    elapsed: Duration,
) {
    finished_batch(span, handler, outcome, std::iter::once(outcome), elapsed);
}

/// [`finished`] for a batch, whose metrics count each message as a delivery of its
/// own, with the outcome in `per_message`.
pub(crate) fn finished_batch(
    span: &tracing::Span,
    handler: RegisteredHandler,
    outcome: &'static str,
    per_message: impl Iterator<Item = &'static str>,
    elapsed: Duration,
) {
    let duration_ms = elapsed.as_secs_f64() * 1e3;
    span.record("inbox.duration_ms", duration_ms);
    span.record("inbox.outcome", outcome);
    // The outcome as an event of its own, for subscribers that show no span closes.
    tracing::debug!(
        target: "diesel_inbox",
        parent: span,
        { inbox.outcome = outcome, inbox.duration_ms = duration_ms },
        "delivery finished"
    );
    #[cfg(feature = "metrics")]
    for message_outcome in per_message {
        crate::metrics::record(handler.consumer, message_outcome, elapsed);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (handler, per_message);
}
