//! What an `#[idempotent]` handler's own future awaits around its body.
//!
//! The expansion awaits a step that begins the delivery, then its body, then a step that
//! ends it, and each mode's steps are generic over the connection alone: boxed, they are
//! compiled once per connection type, and the handler's future holds a pointer to each
//! instead of its states. Only the body's own future is compiled per handler.

use std::pin::Pin;

/// A step before or after a handler's body. `Send`, as every diesel-async connection
/// and its futures are, so that a handler's future is `Send` exactly when its body's is.
pub type Step<'c, T> = Pin<Box<dyn Future<Output = T> + Send + 'c>>;
