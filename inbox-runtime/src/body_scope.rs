//! What a handler's body runs in. On every poll of the body the delivery's span is
//! entered, [`Claim::current`] reads the body's claim (claim mode's, or none in a
//! transactional or batch body, even one called from a claim's body), and the outbox
//! finds the delivery its messages' default ids derive from. One small wrapper per body
//! does all three, in place of a task-local scope and an instrumented future, so that a
//! handler compiles to little code of its own.

use std::cell::RefCell;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// The claim a claim-mode body runs under.
///
/// ```
/// # use inbox_runtime as diesel_inbox;
/// # async fn charge(_: uuid::Uuid) {}
/// # async fn body() {
/// // Inside `#[idempotent(…, claim)]`:
/// let claim = diesel_inbox::Claim::current();
/// // The same key on every attempt: the provider deduplicates a retried charge.
/// charge(claim.idempotency_key()).await;
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub(crate) message_id: String,
    pub(crate) consumer: &'static str,
    pub(crate) attempt: u32,
    pub(crate) token: uuid::Uuid,
    pub(crate) lease: Duration,
}

/// The delivery a body runs for: the outbox derives its messages' default ids from it.
#[derive(Debug)]
pub(crate) struct Delivery {
    pub(crate) consumer: &'static str,
    /// The message's key; in a batch, the first new message's.
    pub(crate) message_id: String,
    /// In a batch, the other new messages' keys, whose markers the body's transaction
    /// holds too.
    pub(crate) other_new_keys: Vec<String>,
    /// How many outbox messages the body has enqueued so far.
    pub(crate) enqueued: u32,
}

/// What a body reads of the call it runs in.
#[derive(Debug, Default)]
pub(crate) struct Scope {
    claim: Option<Claim>,
    delivery: Option<Delivery>,
}

impl Scope {
    /// A transactional body's: no claim.
    pub(crate) fn delivery(consumer: &'static str, message_id: String) -> Self {
        Self::batch(consumer, vec![message_id])
    }

    /// A batch body's, with the keys of its new messages, the first first: no claim.
    pub(crate) fn batch(consumer: &'static str, new_keys: Vec<String>) -> Self {
        let mut new_keys = new_keys.into_iter();
        Self {
            claim: None,
            delivery: Some(Delivery {
                consumer,
                message_id: new_keys.next().unwrap_or_default(),
                other_new_keys: new_keys.collect(),
                enqueued: 0,
            }),
        }
    }

    /// A claim-mode body's.
    pub(crate) fn claimed(claim: Claim) -> Self {
        let delivery = Delivery {
            consumer: claim.consumer,
            message_id: claim.message_id.clone(),
            other_new_keys: Vec::new(),
            enqueued: 0,
        };
        Self {
            claim: Some(claim),
            delivery: Some(delivery),
        }
    }
}

thread_local! {
    /// The scope of the body being polled on this thread. Its claim is `None` while a
    /// transactional or batch handler's body is polled, which is no claim's, even within
    /// a claim's body.
    static CURRENT: RefCell<Scope> = const {
        RefCell::new(Scope { claim: None, delivery: None })
    };

    /// For each body being dropped on this thread, innermost last: the scope and span
    /// its drop replaced, which are restored after it.
    static DROPPING: RefCell<Vec<(Scope, tracing::Span)>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on the delivery of the body being polled on this thread, or on `None`
/// outside every body (and in a task the body spawned).
pub(crate) fn with_delivery<R>(f: impl FnOnce(Option<&mut Delivery>) -> R) -> R {
    CURRENT.with_borrow_mut(|current| f(current.delivery.as_mut()))
}

/// Whether a body is being polled on this thread: a handler called now runs inside it.
pub(crate) fn in_a_body() -> bool {
    CURRENT.with_borrow(|current| current.delivery.is_some())
}

/// Whether the body being polled on this thread is a transactional or batch body (one
/// whose delivery holds its markers uncommitted) of `consumer`, delivering `message_id`
/// (in a batch, any of its new messages).
pub(crate) fn holds_the_marker_of(consumer: &str, message_id: &str) -> bool {
    CURRENT.with_borrow(|current| {
        current.claim.is_none()
            && current.delivery.as_ref().is_some_and(|delivery| {
                delivery.consumer == consumer
                    && (delivery.message_id == message_id
                        || delivery.other_new_keys.iter().any(|key| key == message_id))
            })
    })
}

/// Derives [`Claim::idempotency_key`]: a fixed namespace, so that the same (consumer,
/// key) gives the same UUID in every process and every version.
const IDEMPOTENCY_NAMESPACE: uuid::Uuid = uuid::uuid!("5d1b6c1e-7c3a-4f0e-9a43-6b1f0d2c8e71");

impl Claim {
    /// The claim of the claim-mode body being run.
    ///
    /// # Panics
    ///
    /// Outside a claim-mode handler's body, including in a task the body spawned (hand
    /// that task a clone instead); [`Claim::try_current`] returns `None` there.
    #[track_caller]
    pub fn current() -> Self {
        Self::try_current().expect(
            "`Claim::current()` is only available inside the body of an \
             `#[idempotent(…, claim)]` handler, on the body's own task",
        )
    }

    /// The claim of the claim-mode body being run, or `None` outside one. A
    /// transactional or batch handler called from a claim's body runs outside it: its
    /// body sees `None`, not the enclosing claim.
    pub fn try_current() -> Option<Self> {
        CURRENT
            .try_with(|current| current.borrow().claim.clone())
            .ok()
            .flatten()
    }

    /// The message's key, as stored in the inbox's `message_id` column.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// The handler's consumer name.
    pub fn consumer(&self) -> &'static str {
        self.consumer
    }

    /// Which attempt this is: 1 for the first delivery that claimed the message, one
    /// more for each takeover after a lease ended or a failed body released the claim.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// This attempt's token: it names the holder in the inbox, and changes with every
    /// attempt. Useful to correlate logs; hand the downstream system
    /// [`Claim::idempotency_key`] instead, which does not change.
    pub fn token(&self) -> uuid::Uuid {
        self.token
    }

    /// The key to deduplicate by downstream: a UUID (version 5) of the consumer and the
    /// message's key, the same on every attempt and in every process, so that a call
    /// repeated by a takeover is recognised as the same call. 36 characters as text,
    /// which every provider's idempotency-key header accepts.
    pub fn idempotency_key(&self) -> uuid::Uuid {
        let mut name = Vec::with_capacity(self.consumer.len() + self.message_id.len() + 8);
        // Length-prefixed, so that no two (consumer, key) pairs give the same name.
        name.extend_from_slice(&(self.consumer.len() as u64).to_be_bytes());
        name.extend_from_slice(self.consumer.as_bytes());
        name.extend_from_slice(self.message_id.as_bytes());
        uuid::Uuid::new_v5(&IDEMPOTENCY_NAMESPACE, &name)
    }
}

pin_project_lite::pin_project! {
    /// A body's future, run in its scope. Its fields drop in order: the first enters the
    /// scope, so that the body drops within it (the body's destructors may read the
    /// claim too), and the last leaves it. Guards in fields rather than a `Drop` of this
    /// type, which would be compiled again for each body.
    #[doc(hidden)]
    pub struct InBody<F> {
        scope: EnterOnDrop,
        #[pin]
        body: F,
        leave: LeaveOnDrop,
    }
}

impl<F> InBody<F> {
    /// `body` in `scope`.
    #[inline(always)]
    pub(crate) fn new(body: F, scope: DropScope) -> Self {
        Self {
            scope: EnterOnDrop(scope),
            body,
            leave: LeaveOnDrop,
        }
    }
}

impl<F: Future> Future for InBody<F> {
    type Output = F::Output;

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        poll_in_scope(&mut this.scope.0, this.body, cx)
    }
}

/// Polls a body in its scope: through `dyn`, so that this is compiled once per body
/// output type, not once per handler.
fn poll_in_scope<T>(
    scope: &mut DropScope,
    body: Pin<&mut dyn Future<Output = T>>,
    cx: &mut Context<'_>,
) -> Poll<T> {
    let _scope = Entered::new(&mut scope.scope, &scope.span);
    body.poll(cx)
}

/// A body's scope and span. Not generic, so that what a body's future does on top of the
/// body itself is compiled once, here.
pub(crate) struct DropScope {
    scope: Scope,
    span: tracing::Span,
}

/// Taken by the body: what its step holds after.
impl Default for DropScope {
    fn default() -> Self {
        Self::new(Scope::default(), &tracing::Span::none())
    }
}

impl DropScope {
    pub(crate) fn new(scope: Scope, span: &tracing::Span) -> Self {
        Self {
            scope,
            span: span.clone(),
        }
    }
}

/// The first field of an [`InBody`]: dropped, it enters the body's scope and span, and
/// keeps the scope and span it replaces for the [`LeaveOnDrop`] that drops after the
/// body. (Not a span guard: those are not `Send`, and a handler's future must be.)
struct EnterOnDrop(DropScope);

impl Drop for EnterOnDrop {
    fn drop(&mut self) {
        let DropScope { scope, span } = &mut self.0;
        swap_current(scope);
        span.with_subscriber(|(id, dispatch)| dispatch.enter(id));
        let outer = std::mem::take(scope);
        let span = std::mem::replace(span, tracing::Span::none());
        DROPPING.with_borrow_mut(|dropping| dropping.push((outer, span)));
    }
}

/// The last field of an [`InBody`]: dropped, it leaves the scope and span that the first
/// entered.
struct LeaveOnDrop;

impl Drop for LeaveOnDrop {
    fn drop(&mut self) {
        if let Some((mut outer, span)) = DROPPING.with_borrow_mut(Vec::pop) {
            span.with_subscriber(|(id, dispatch)| dispatch.exit(id));
            swap_current(&mut outer);
        }
    }
}

/// The scope entered for one poll.
struct Entered<'a> {
    scope: &'a mut Scope,
    _span: tracing::span::Entered<'a>,
}

impl<'a> Entered<'a> {
    fn new(scope: &'a mut Scope, span: &'a tracing::Span) -> Self {
        swap_current(scope);
        Self {
            scope,
            _span: span.enter(),
        }
    }
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        swap_current(self.scope);
    }
}

/// Makes `scope` this thread's current scope, and leaves the one it replaces in its
/// place: called twice, it restores the outer scope, and keeps what the body changed
/// of its own (the count of messages it enqueued).
fn swap_current(scope: &mut Scope) {
    CURRENT.with_borrow_mut(|current| std::mem::swap(current, scope));
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    use super::{Claim, DropScope, InBody, Scope};

    fn claim(consumer: &'static str) -> Claim {
        Claim {
            message_id: "m".to_owned(),
            consumer,
            attempt: 1,
            token: uuid::Uuid::nil(),
            lease: Duration::from_secs(1),
        }
    }

    fn scope(scope: Scope) -> DropScope {
        DropScope::new(scope, &tracing::Span::none())
    }

    fn current_consumer() -> Option<&'static str> {
        Claim::try_current().map(|claim| claim.consumer())
    }

    /// Reads the current claim when dropped.
    struct ReadsOnDrop(&'static std::sync::Mutex<Vec<Option<&'static str>>>);

    impl Drop for ReadsOnDrop {
        fn drop(&mut self) {
            self.0.lock().unwrap().push(current_consumer());
        }
    }

    #[test]
    fn scopes_nest_and_each_poll_restores_the_outer_claim() {
        let inner = InBody::new(async { current_consumer() }, scope(Scope::default()));
        let outer = InBody::new(
            async {
                let before = current_consumer();
                let inner = inner.await;
                (before, inner, current_consumer())
            },
            scope(Scope::claimed(claim("outer"))),
        );
        let mut outer = Box::pin(outer);
        let polled = outer.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        assert_eq!(polled, Poll::Ready((Some("outer"), None, Some("outer"))));
        assert_eq!(current_consumer(), None);
    }

    #[test]
    fn a_body_dropped_before_it_ends_is_dropped_in_its_scope() {
        static SEEN: std::sync::Mutex<Vec<Option<&'static str>>> =
            std::sync::Mutex::new(Vec::new());
        let body = async {
            let _reads = ReadsOnDrop(&SEEN);
            poll_fn(|_| Poll::<()>::Pending).await;
        };
        let mut body = Box::pin(InBody::new(body, scope(Scope::claimed(claim("c")))));
        let polled = body.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        assert!(polled.is_pending());
        assert_eq!(current_consumer(), None);
        drop(body);
        assert_eq!(*SEEN.lock().unwrap(), [Some("c")]);
        assert_eq!(current_consumer(), None);
    }

    #[test]
    fn nested_bodies_dropped_together_each_drop_in_their_own_scope() {
        static SEEN: std::sync::Mutex<Vec<Option<&'static str>>> =
            std::sync::Mutex::new(Vec::new());
        let inner = async {
            let _reads = ReadsOnDrop(&SEEN);
            poll_fn(|_| Poll::<()>::Pending).await;
        };
        let inner = InBody::new(inner, scope(Scope::claimed(claim("inner"))));
        let outer = async {
            let _reads_first = ReadsOnDrop(&SEEN);
            inner.await;
        };
        let mut outer = Box::pin(InBody::new(outer, scope(Scope::claimed(claim("outer")))));
        let polled = outer.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        assert!(polled.is_pending());
        drop(outer);
        // The outer body's locals drop in reverse: the inner body, in its own scope, then
        // the outer's reader, in the outer scope, which the inner's drop restored.
        assert_eq!(*SEEN.lock().unwrap(), [Some("inner"), Some("outer")]);
        assert_eq!(current_consumer(), None);
    }
}
