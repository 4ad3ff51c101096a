//! Batch handlers: many messages in one transaction, each still applied exactly once.
//!
//! A batch pays BEGIN, the marker inserts, the body and COMMIT once for all its messages,
//! instead of once per message. The markers are inserted together, in the order of their
//! keys (a canonical lock order: two batches that overlap wait for each other, neither
//! holding a key the other already waits for), and the body sees only the messages whose
//! markers are new. Everything else is as for one message: the body's writes and every new
//! marker commit together or not at all.

use std::convert::Infallible;
use std::time::Instant;

use diesel::result::Error;
use diesel_async::AsyncConnection;
use tracing::Instrument as _;

use crate::backend::InboxBackend;
use crate::backend::sealed::Sealed as _;
use crate::begin::Begin;
use crate::body_scope::{DropScope, Scope};
use crate::call;
use crate::enclosing::{Enclosing, enclosing_for_delivery};
use crate::error::InvalidBatchKey;
use crate::handler::{Handler, RegisteredHandler};
use crate::key::InvalidKey;
use crate::outcome::{Outcome, Stop};
use crate::report;
use crate::step::{Begun, Ended, Step};
use crate::test_transaction;
use crate::verdict::HandlerErrorType;

/// What an `#[idempotent(batch = …)]` handler did with a batch: for each message, in the
/// order given, whether it was processed or a duplicate, and the body's value.
///
/// Every message of a batch that returned `Ok` may be acknowledged: either this call
/// committed its effect, or an earlier delivery had. A message whose key appears twice in
/// the batch is processed once, at its first place; the later copies are duplicates.
#[must_use = "a BatchOutcome tells which messages were processed"]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchOutcome<T> {
    value: Option<T>,
    outcomes: Vec<Outcome<()>>,
}

impl<T> BatchOutcome<T> {
    /// The body's value, or `None` when the body did not run: an empty batch, or one whose
    /// every message was already processed.
    pub fn value(&self) -> Option<&T> {
        self.value.as_ref()
    }

    /// The body's value, as [`BatchOutcome::value`].
    pub fn into_value(self) -> Option<T> {
        self.value
    }

    /// One outcome per message, at the message's index in the batch.
    pub fn outcomes(&self) -> &[Outcome<()>] {
        &self.outcomes
    }

    /// How many messages the body processed.
    pub fn processed(&self) -> usize {
        self.outcomes.iter().filter(|o| o.is_processed()).count()
    }

    /// How many messages were duplicates: processed before, or earlier in the batch.
    pub fn duplicates(&self) -> usize {
        self.outcomes.iter().filter(|o| o.is_duplicate()).count()
    }

    /// Every message a duplicate, and the body not run.
    fn all_duplicates(len: usize) -> Self {
        Self {
            value: None,
            outcomes: vec![Outcome::Duplicate; len],
        }
    }
}

/// The batch parameter of an `#[idempotent(batch = …)]` handler: a slice, an array, a
/// `Vec`, or a reference to one, anything that lends its messages as a slice. Through
/// this trait, rather than `AsRef<[M]>` itself, a parameter of another type is reported
/// at the handler's parameter as not a batch, instead of as a missing `AsRef` impl.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "the batch parameter of an `#[idempotent]` handler holds many messages, as a \
               slice, `Vec` or array, not `{Self}`",
    label = "not a batch of messages",
    note = "take `msgs: &[M]`, `Vec<M>`, `&Vec<M>` or `[M; N]` (any type with `AsRef<[M]>`), \
            with `key = |msg| …` the key of one `M`; for a single message, leave `batch` out"
)]
pub trait BatchParameter<M> {
    /// The messages, in the batch's order.
    fn messages(&self) -> &[M];
}

#[diagnostic::do_not_recommend]
impl<M, A: AsRef<[M]> + ?Sized> BatchParameter<M> for A {
    fn messages(&self) -> &[M] {
        self.as_ref()
    }
}

/// The messages of a batch parameter.
#[doc(hidden)]
pub fn batch_messages<M, A: BatchParameter<M> + ?Sized>(messages: &A) -> &[M] {
    messages.messages()
}

/// A batch parameter taken by value, whose new messages the body then owns: a `Vec`, an
/// array or a boxed slice. Any other type the handler takes by value is lent to the body
/// as a slice, as [`BatchParameter`] says.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "a batch taken by value is a `Vec<M>`, `[M; N]` or `Box<[M]>`, not `{Self}`",
    label = "not a batch of messages",
    note = "the body then owns the new messages; borrow a batch of another type (`msgs: &[M]`), \
            with `key = |msg| …` the key of one `M`"
)]
pub trait OwnedBatch<M> {
    /// The messages, in the batch's order.
    fn into_messages(self) -> Vec<M>;
}

impl<M> OwnedBatch<M> for Vec<M> {
    fn into_messages(self) -> Vec<M> {
        self
    }
}

impl<M> OwnedBatch<M> for Box<[M]> {
    fn into_messages(self) -> Vec<M> {
        self.into_vec()
    }
}

impl<M, const N: usize> OwnedBatch<M> for [M; N] {
    fn into_messages(self) -> Vec<M> {
        self.into()
    }
}

// Boxed as well, so that rustc does not suggest dereferencing the parameter.
impl<M> OwnedBatch<M> for Box<Vec<M>> {
    fn into_messages(self) -> Vec<M> {
        *self
    }
}

impl<M, const N: usize> OwnedBatch<M> for Box<[M; N]> {
    fn into_messages(self) -> Vec<M> {
        Vec::from(self as Box<[M]>)
    }
}

/// The messages of a batch parameter taken by value.
#[doc(hidden)]
pub fn owned_batch<M, A: OwnedBatch<M>>(messages: A) -> Vec<M> {
    messages.into_messages()
}

/// Encodes the key of each message of a batch, in order; the first that cannot be
/// encoded rejects the batch. The `#[idempotent(batch = …)]` expansion writes the loop
/// itself, with the key's expression in it:
///
/// ```text
/// let mut keys = BatchKeys::new(messages);
/// while let Some(msg) = keys.next_message() {
///     keys.push(InboxKey::encode(&(msg.id)));
/// }
/// keys.finish()
/// ```
///
/// so that a handler compiles no closure for its key, nor the shims of one called
/// through `dyn`; what is here is compiled once per message type.
#[doc(hidden)]
pub struct BatchKeys<'m, M> {
    messages: std::slice::Iter<'m, M>,
    keys: MessageIds,
}

impl<'m, M> BatchKeys<'m, M> {
    pub fn new(messages: &'m [M]) -> Self {
        Self {
            messages: messages.iter(),
            keys: MessageIds {
                len: messages.len(),
                keys: Ok(Vec::with_capacity(messages.len())),
            },
        }
    }

    /// The next message to encode the key of: none after the last, nor after a key that
    /// could not be encoded.
    pub fn next_message(&mut self) -> Option<&'m M> {
        match self.keys.keys {
            Ok(_) => self.messages.next(),
            Err(_) => None,
        }
    }

    /// The key of the message [`next_message`](Self::next_message) returned.
    pub fn push(&mut self, key: Result<String, InvalidKey>) {
        self.keys.push(key);
    }

    pub fn finish(self) -> MessageIds {
        self.keys
    }
}

/// The keys of a batch's messages, or the first that could not be encoded.
#[doc(hidden)]
pub struct MessageIds {
    /// How many messages the batch has.
    len: usize,
    keys: Result<Vec<String>, InvalidBatchKey>,
}

impl MessageIds {
    fn push(&mut self, key: Result<String, InvalidKey>) {
        if let Ok(keys) = &mut self.keys {
            match key {
                Ok(key) => keys.push(key),
                Err(reason) => {
                    let index = keys.len();
                    self.keys = Err(InvalidBatchKey { index, reason });
                }
            }
        }
    }
}

/// `key` as a function of one message of `messages`, for the expansion's loop: a
/// closure's parameter then gets its type from the message, and the key it returns may
/// borrow from the message (`|msg| -> &str { … }`, `Msg::key` for `fn key(&self) ->
/// &str`).
#[doc(hidden)]
pub fn batch_key_fn<'m, M, K, F>(_messages: &'m [M], key: F) -> F
where
    F: FnMut(&'m M) -> K,
{
    key
}

/// The markers a batch inserts: its distinct keys in ascending order, and where each
/// message's key is among them.
struct Markers {
    message_ids: Vec<String>,
    /// For each message, the index of its key in `message_ids`.
    key_of: Vec<usize>,
    /// For each key, the first message that has it.
    first: Vec<usize>,
}

impl Markers {
    fn new(keys: Vec<String>) -> Self {
        let mut order: Vec<usize> = (0..keys.len()).collect();
        // Stable, so that the first message of each key comes first.
        order.sort_by(|&a, &b| keys[a].cmp(&keys[b]));
        let mut markers = Self {
            message_ids: Vec::with_capacity(keys.len()),
            key_of: vec![0; keys.len()],
            first: Vec::with_capacity(keys.len()),
        };
        let mut keys: Vec<Option<String>> = keys.into_iter().map(Some).collect();
        for index in order {
            let key = keys[index].take().expect("each message is visited once");
            if markers.message_ids.last() != Some(&key) {
                markers.message_ids.push(key);
                markers.first.push(index);
            }
            markers.key_of[index] = markers.message_ids.len() - 1;
        }
        markers
    }

    /// Whether message `index` is the one to process, given which keys are new.
    fn processes(&self, index: usize, new: &[bool]) -> bool {
        let key = self.key_of[index];
        new[key] && self.first[key] == index
    }

    /// The items of `messages` to process, in the batch's order.
    fn select<I: Iterator>(&self, messages: I, new: &[bool]) -> Vec<I::Item> {
        let mut selected = Vec::with_capacity(self.first.len());
        for (index, message) in messages.enumerate() {
            if self.processes(index, new) {
                selected.push(message);
            }
        }
        selected
    }

    /// The keys of the batch's messages to process, in the batch's order. The outbox
    /// derives the default ids of the body's messages from the first: unique to this
    /// batch among those that commit, since a key is new in only one committed batch.
    fn new_keys(&self, new: &[bool]) -> Vec<String> {
        (0..self.key_of.len())
            .filter(|&index| self.processes(index, new))
            .map(|index| self.message_ids[self.key_of[index]].clone())
            .collect()
    }

    /// Each message's outcome, in the batch's order.
    fn outcomes(&self, new: &[bool]) -> Vec<Outcome<()>> {
        (0..self.key_of.len())
            .map(|index| {
                if self.processes(index, new) {
                    Outcome::Processed(())
                } else {
                    Outcome::Duplicate
                }
            })
            .collect()
    }
}

/// Begins a batch delivery that runs its body once over the messages that are new to
/// this consumer, in one transaction with their markers. The `#[idempotent(batch = …)]`
/// expansion awaits this, then picks the new messages with [`InBatch::select`], runs
/// its body on them in [`InBatch::body`], and awaits [`InBatch::close`].
///
/// 1. An empty batch stops at once, with no transaction. An invalid key (in
///    `message_ids`, encoded by [`BatchKeys`]) rejects the batch before anything is
///    written.
/// 2. Refuses a connection inside a transaction, as the transactional mode does (a test
///    transaction gets a savepoint instead).
/// 3. Begins one transaction and inserts the batch's markers in it in key order, each
///    key once, waiting for any transaction holding one of them. If no message is new,
///    the transaction rolls back and the delivery stops, every message a duplicate.
///
/// As in the transactional mode, the steps are boxed and `Send`, so that the handler's
/// future is `Send` exactly when its body's is.
#[doc(hidden)]
pub fn begin_batch<'c, C>(
    begin: Begin<C>,
    message_ids: MessageIds,
    conn: &'c mut C,
    handler: &'static Handler,
) -> Step<'c, Result<InBatch<C>, BatchStopped>>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let MessageIds {
        len,
        keys: message_ids,
    } = message_ids;
    if len == 0 {
        return Step::new(std::future::ready(Err(BatchStopped { delivery: None })));
    }
    let delivery = BatchDelivery::start(handler.registration, len);
    Step::new(async move {
        let opened = open(
            conn,
            begin,
            delivery.consumer(),
            message_ids,
            &delivery.span,
        );
        match opened.await {
            Ok(Opened {
                enclosing,
                markers,
                new,
            }) => {
                let scope = Scope::batch(delivery.consumer(), markers.new_keys(&new));
                let scope = DropScope::new(scope, &delivery.span);
                let closing = BatchClosing {
                    delivery,
                    enclosing,
                    markers,
                    new,
                };
                Ok(Begun::new(closing, scope, close::<C>))
            }
            Err(stop) => Err(BatchStopped {
                delivery: Some((delivery, stop)),
            }),
        }
    })
}

/// A batch whose transaction holds its markers, some of them new: what the handler's
/// future holds while its body runs. Its `close` commits the transaction when the body
/// succeeded, and rolls it back otherwise.
#[doc(hidden)]
pub type InBatch<C> = Begun<C, BatchClosing, BatchClosed>;

impl<C: ?Sized> InBatch<C> {
    /// The new messages among `messages` (borrows of a borrowed batch's, or an owned
    /// batch's messages themselves), in the batch's order: each new key's first.
    pub fn select<I>(&self, messages: I) -> Vec<I::Item>
    where
        I: IntoIterator,
    {
        let BatchClosing { markers, new, .. } = self.state();
        markers.select(messages.into_iter(), new)
    }
}

/// What the close step needs.
#[doc(hidden)]
pub struct BatchClosing {
    delivery: BatchDelivery,
    enclosing: Enclosing,
    markers: Markers,
    new: Vec<bool>,
}

fn close<C>(conn: &mut C, closing: BatchClosing, succeeded: bool) -> Step<'_, BatchClosed>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let BatchClosing {
        delivery,
        enclosing,
        markers,
        new,
    } = closing;
    Step::new(async move {
        let closed = call::close(conn, enclosing, succeeded, &delivery.span).await;
        BatchClosed {
            delivery,
            outcomes: markers.outcomes(&new),
            closed,
        }
    })
}

/// A batch whose transaction has ended.
#[doc(hidden)]
pub struct BatchClosed {
    delivery: BatchDelivery,
    outcomes: Vec<Outcome<()>>,
    closed: Result<(), Error>,
}

impl Ended for BatchClosed {
    type Outcome<T> = BatchOutcome<T>;

    /// The handler's result: the body's value with each message's outcome, unless the
    /// transaction failed to end, whose error then replaces it.
    fn finish<T, E>(
        self,
        result: Result<T, E>,
        error_type: &HandlerErrorType<E>,
    ) -> Result<BatchOutcome<T>, E> {
        let Self {
            delivery,
            outcomes,
            closed,
        } = self;
        let stopped = call::after_close(result, closed).map(|value| BatchOutcome {
            value: Some(value),
            outcomes,
        });
        delivery.finish(stopped, error_type)
    }
}

/// A batch whose body does not run: an empty one, one whose every message is a
/// duplicate, or one stopped by a database error.
#[doc(hidden)]
pub struct BatchStopped {
    /// The delivery and why it stopped; `None` for an empty batch, which is no
    /// delivery at all.
    delivery: Option<(BatchDelivery, Stop<Infallible>)>,
}

impl BatchStopped {
    /// The handler's result.
    pub fn finish<T, E>(self, error_type: &HandlerErrorType<E>) -> Result<BatchOutcome<T>, E> {
        match self.delivery {
            None => Ok(BatchOutcome::all_duplicates(0)),
            Some((delivery, stop)) => delivery.finish(Err(stop.widen()), error_type),
        }
    }
}

/// One batch delivery's report: its span, its size and its start.
struct BatchDelivery {
    registration: RegisteredHandler,
    len: usize,
    span: tracing::Span,
    started: Instant,
}

impl BatchDelivery {
    fn start(registration: RegisteredHandler, len: usize) -> Self {
        Self {
            registration,
            len,
            span: report::batch_span(registration, len),
            started: Instant::now(),
        }
    }

    fn consumer(&self) -> &'static str {
        self.registration.consumer
    }

    /// The caller's result for how the batch `stopped`, reported: generic over the
    /// body's value and error alone, and short.
    fn finish<T, E>(
        self,
        stopped: Result<BatchOutcome<T>, Stop<E>>,
        error_type: &HandlerErrorType<E>,
    ) -> Result<BatchOutcome<T>, E> {
        match stopped {
            Ok(batch) => {
                self.span.record("inbox.processed", batch.processed());
                self.span.record("inbox.duplicates", batch.duplicates());
                self.report("processed", &batch.outcomes);
                Ok(batch)
            }
            Err(Stop::Duplicate) => {
                report::batch_duplicate(&self.span);
                let batch = BatchOutcome::all_duplicates(self.len);
                self.report("duplicate", &batch.outcomes);
                Ok(batch)
            }
            Err(Stop::Handler(error)) => {
                report::handler_error(&self.span, (error_type.database_class)(&error));
                self.report("handler_error", &[]);
                Err(error)
            }
            Err(Stop::Database(error)) => {
                self.report("database_error", &[]);
                Err((error_type.from_diesel)(error))
            }
        }
    }

    /// Reports how the batch ended. Each message counts as a delivery of its own, with
    /// its outcome in `settled`; a failed batch, none settled, all with its error.
    fn report(self, outcome: &'static str, settled: &[Outcome<()>]) {
        let per_message = (0..self.len).map(|index| match settled.get(index) {
            Some(message) if message.is_processed() => "processed",
            Some(_) => "duplicate",
            None => outcome,
        });
        let elapsed = self.started.elapsed();
        report::finished_batch(&self.span, self.registration, outcome, per_message, elapsed);
    }
}

/// A batch whose transaction has begun with its markers: which of them are new.
pub(crate) struct Opened {
    enclosing: Enclosing,
    markers: Markers,
    new: Vec<bool>,
}

/// Everything before the body: the keys checked, then the batch's transaction begun
/// with its markers (or a test transaction's savepoint). A batch with no new message
/// ends there, as a duplicate.
pub(crate) fn open<'c, C>(
    conn: &'c mut C,
    begin: Begin<C>,
    consumer: &'static str,
    message_ids: Result<Vec<String>, InvalidBatchKey>,
    span: &tracing::Span,
) -> impl Future<Output = Result<Opened, Stop<Infallible>>> + Send + 'c
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let explained_in = span.clone();
    let opened = async move {
        let opened = open_unexplained(&mut *conn, begin, consumer, message_ids).await;
        call::explained(conn, opened, &explained_in).await
    };
    opened.instrument(span.clone())
}

async fn open_unexplained<C>(
    conn: &mut C,
    begin: Begin<C>,
    consumer: &'static str,
    message_ids: Result<Vec<String>, InvalidBatchKey>,
) -> Result<Opened, Stop<Infallible>>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let message_ids = message_ids.and_then(|ids| {
        for (index, message_id) in ids.iter().enumerate() {
            C::Backend::check_storable(message_id)
                .map_err(|reason| InvalidBatchKey { index, reason })?;
        }
        Ok(ids)
    });
    let markers = Markers::new(message_ids.map_err(Error::from)?);
    let enclosing = enclosing_for_delivery(conn, consumer, &markers.message_ids)?;
    let message_ids = markers.message_ids.clone();
    let new = match enclosing {
        Enclosing::Nothing => match begin.with_markers(conn, consumer, message_ids).await? {
            new if new.contains(&true) => new,
            _ => return Err(Stop::Duplicate),
        },
        Enclosing::TestTransaction => {
            test_transaction::begin(conn).await?;
            match C::Backend::insert_markers(conn, consumer, message_ids).await {
                Ok(new) if new.contains(&true) => new,
                Ok(_) => return Err(end_in_test_transaction(conn, Stop::Duplicate).await),
                Err(error) => {
                    return Err(end_in_test_transaction(conn, Stop::Database(error)).await);
                }
            }
        }
    };
    Ok(Opened {
        enclosing,
        markers,
        new,
    })
}

/// Ends the test transaction's savepoint for a call whose body never ran.
async fn end_in_test_transaction<C, E>(conn: &mut C, stop: Stop<E>) -> Stop<E>
where
    C: AsyncConnection,
{
    match test_transaction::roll_back(conn).await {
        Ok(()) => stop,
        Err(error) if matches!(stop, Stop::Duplicate) => Stop::Database(error),
        Err(_) => stop,
    }
}

#[cfg(test)]
mod tests {
    use super::{BatchKeys, InvalidBatchKey, Markers};
    use crate::error::InboxError;
    use crate::key::{InvalidKey, encode_key};

    fn markers(keys: &[&str]) -> Markers {
        Markers::new(keys.iter().map(|k| k.to_string()).collect())
    }

    #[test]
    fn markers_are_distinct_and_sorted() {
        let m = markers(&["c", "a", "b", "a", "c"]);
        assert_eq!(m.message_ids, ["a", "b", "c"]);
        assert_eq!(m.key_of, [2, 0, 1, 0, 2]);
        assert_eq!(m.first, [1, 2, 0]);
    }

    #[test]
    fn only_the_first_copy_of_a_new_key_is_processed() {
        let m = markers(&["c", "a", "b", "a", "c"]);
        // "a" new, "b" already processed, "c" new.
        let new = [true, false, true];
        let processed: Vec<bool> = (0..5).map(|i| m.processes(i, &new)).collect();
        assert_eq!(processed, [true, true, false, false, false]);
    }

    #[test]
    fn sorting_is_by_bytes() {
        let m = markers(&["b", "B", "a", "ä", "A"]);
        assert_eq!(m.message_ids, ["A", "B", "a", "b", "ä"]);
    }

    #[test]
    fn an_invalid_key_names_its_message_and_ends_the_encoding() {
        let messages = ["m1", "m2", "", "m4", ""];
        // As the expansion's loop does.
        let mut keys = BatchKeys::new(&messages);
        let mut encoded = 0;
        while let Some(message) = keys.next_message() {
            keys.push(encode_key(message));
            encoded += 1;
        }
        assert_eq!(encoded, 3);
        let rejected = keys.finish().keys.unwrap_err();
        assert_eq!(
            rejected,
            InvalidBatchKey {
                index: 2,
                reason: InvalidKey::Empty
            }
        );
        let error = diesel::result::Error::from(rejected.clone());
        assert_eq!(
            InboxError::find(&error),
            Some(&InboxError::InvalidBatchKey(rejected))
        );
        assert!(
            error.to_string().starts_with("message 2 of the batch: "),
            "{error}"
        );
    }
}
