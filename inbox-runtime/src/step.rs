//! What an `#[idempotent]` handler's own future awaits around its body.
//!
//! The expansion awaits a step that begins the delivery, then its body, then a step that
//! ends it, and each mode's steps are generic over the connection alone: boxed, they are
//! compiled once per connection type, and the handler's future holds a pointer to each
//! instead of its states. Only the body's own future is compiled per handler.

use std::mem;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::body_scope::{DropScope, InBody};
use crate::verdict::HandlerErrorType;

/// A step before or after a handler's body. `Send`, as every diesel-async connection
/// and its futures are, so that a handler's future is `Send` exactly when its body's is.
///
/// A future of its own rather than the boxed future itself: awaiting it is one impl for
/// rustc to find in each handler, not the chain from `Pin<Box<dyn Future>>`.
#[doc(hidden)]
#[must_use = "a step does nothing unless awaited"]
pub struct Step<'c, T>(Pin<Box<dyn Future<Output = T> + Send + 'c>>);

impl<'c, T> Step<'c, T> {
    pub(crate) fn new(step: impl Future<Output = T> + Send + 'c) -> Self {
        Self(Box::pin(step))
    }
}

impl<T> Future for Step<'_, T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        self.0.as_mut().poll(cx)
    }
}

/// A delivery that its first step has begun: what the handler's future holds while its
/// body runs. `S` is what the mode's step after the body needs, `R` what that step
/// returns.
#[doc(hidden)]
pub struct Begun<C: ?Sized, S, R> {
    state: S,
    scope: DropScope,
    /// The step after the body, chosen by the first where the connection's bounds were
    /// checked: a connection of a type the inbox cannot use is then reported once, at
    /// the first step.
    close: for<'c> fn(&'c mut C, S, bool) -> Step<'c, R>,
}

impl<C: ?Sized, S, R> Begun<C, S, R> {
    pub(crate) fn new(
        state: S,
        scope: DropScope,
        close: for<'c> fn(&'c mut C, S, bool) -> Step<'c, R>,
    ) -> Self {
        Self {
            state,
            scope,
            close,
        }
    }

    pub(crate) fn state(&self) -> &S {
        &self.state
    }

    /// The body's future, run in the delivery's span and scope.
    #[inline(always)]
    pub fn body<F>(&mut self, body: F) -> InBody<F> {
        InBody::new(body, mem::take(&mut self.scope))
    }

    /// Ends the delivery with the body's `result`: the mode's step after the body, as it
    /// goes when the body succeeded or when it did not, then the handler's result. One
    /// future for both, so that a handler awaits once after its body.
    pub fn close<T, E>(
        self,
        conn: &mut C,
        result: Result<T, E>,
        error_type: HandlerErrorType<E>,
    ) -> Ending<'_, R, T, E> {
        Ending {
            step: (self.close)(conn, self.state, result.is_ok()),
            result: Some(result),
            error_type,
        }
    }
}

/// How a mode's delivery that ran its body ends: its report, and the handler's result.
#[doc(hidden)]
pub trait Ended {
    /// What the handler returns for a delivery that ran its body with `T`:
    /// `Outcome<T>`, or a batch's `BatchOutcome<T>`.
    type Outcome<T>;

    /// The handler's result: the body's, unless the step after the body failed, whose
    /// error then replaces it.
    fn finish<T, E>(
        self,
        result: Result<T, E>,
        error_type: &HandlerErrorType<E>,
    ) -> Result<Self::Outcome<T>, E>;
}

/// The step after a handler's body, then the handler's result: generic over the body's
/// value and error, not its future, so that handlers returning the same types share it.
#[doc(hidden)]
#[must_use = "a step does nothing unless awaited"]
pub struct Ending<'c, R, T, E> {
    step: Step<'c, R>,
    /// The body's result, until the step has ended.
    result: Option<Result<T, E>>,
    error_type: HandlerErrorType<E>,
}

// Nothing of it is pinned in place: the step is boxed, and the result is moved out.
impl<R, T, E> Unpin for Ending<'_, R, T, E> {}

impl<R: Ended, T, E> Future for Ending<'_, R, T, E> {
    type Output = Result<R::Outcome<T>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let Poll::Ready(ended) = Pin::new(&mut this.step).poll(cx) else {
            return Poll::Pending;
        };
        let result = this
            .result
            .take()
            .expect("a handler's last step is not polled after it has ended");
        Poll::Ready(ended.finish(result, &this.error_type))
    }
}
