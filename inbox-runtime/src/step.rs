//! What an `#[idempotent]` handler's own future awaits around its body.
//!
//! The expansion awaits a step that begins the delivery, then its body, then a step that
//! ends it, and each mode's steps are generic over the connection alone: boxed, they are
//! compiled once per connection type, and the handler's future holds a pointer to each
//! instead of its states. Only the body's own future is compiled per handler.

use std::pin::Pin;
use std::task::{Context, Poll};

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
