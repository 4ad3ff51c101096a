//! Every `#[idempotent]` handler linked into the program, for a start-up check that no
//! two of them share a consumer name across crates.
//!
//! Within one crate the attribute rejects a shared name at compile time. Handlers from
//! different crates only meet in the final program, where a shared name would make one
//! handler's markers silently suppress the other: [`check_consumers`] finds that.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::transaction::Handler;

/// One `#[idempotent]` handler, registered when the program is linked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisteredHandler {
    /// The handler's consumer name.
    pub consumer: &'static str,
    /// The handler's path, such as `billing::credit`. A method's type is out of the
    /// attribute's sight, so a method also says where it is:
    /// `billing::credit (method at src/billing.rs:12)`.
    pub handler: &'static str,
}

impl RegisteredHandler {
    #[doc(hidden)]
    pub const fn new(consumer: &'static str, handler: &'static str) -> Self {
        Self { consumer, handler }
    }
}

/// The handler registered last: each handler links to the one registered before it.
static LAST_REGISTERED: Mutex<Option<&'static Handler>> = Mutex::new(None);

/// A handler's place in the registry's list: the handler registered before it, set when
/// it registers. Statics all the way, so registering allocates nothing before `main`.
pub(crate) struct Link(OnceLock<Option<&'static Handler>>);

impl Link {
    pub(crate) const fn new() -> Self {
        Self(OnceLock::new())
    }
}

impl fmt::Debug for Link {
    // Not the list behind it: a handler's `Debug` would print every other handler.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let registered = self.0.get().is_some();
        f.debug_struct("Link")
            .field("registered", &registered)
            .finish()
    }
}

/// Adds `handler` to the list, once: where constructors can run twice (WebAssembly),
/// the second call finds its link already set.
pub(crate) fn register(handler: &'static Handler) {
    let mut last = LAST_REGISTERED
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if handler.link.0.set(*last).is_ok() {
        *last = Some(handler);
    }
}

/// Registers a `Handler` static before `main`, for [`registered_handlers`]: a function
/// in the platform's list of constructors, on the platforms and in the sections
/// `inventory` uses. Written here rather than through `inventory::submit!`, whose
/// `#[allow(non_upper_case_globals)]` a user's `#![forbid(warnings)]` reports as
/// `forbidden_lint_groups`. The attributes are the expansion's own, so a user's
/// `#![forbid(unsafe_code)]` does not apply to `link_section`, as to any macro's code.
/// Elsewhere the handler is not registered, and [`check_consumers`] finds nothing.
#[doc(hidden)]
#[macro_export]
macro_rules! register_handler {
    ($handler:ident) => {
        const _: () = {
            extern "C" fn register() {
                $crate::Handler::register(&$handler);
            }
            #[used]
            #[cfg_attr(
                any(
                    target_family = "wasm",
                    target_os = "linux",
                    target_os = "android",
                    target_os = "dragonfly",
                    target_os = "freebsd",
                    target_os = "haiku",
                    target_os = "illumos",
                    target_os = "netbsd",
                    target_os = "nto",
                    target_os = "openbsd",
                    target_os = "redox",
                    target_os = "vxworks",
                    target_os = "none",
                ),
                unsafe(link_section = ".init_array")
            )]
            #[cfg_attr(
                any(target_os = "macos", target_os = "ios"),
                unsafe(link_section = "__DATA,__mod_init_func,mod_init_funcs")
            )]
            #[cfg_attr(windows, unsafe(link_section = ".CRT$XCU"))]
            static REGISTER: extern "C" fn() = register;
        };
    };
}

/// Every `#[idempotent]` handler in the program, in no particular order.
pub fn registered_handlers() -> impl Iterator<Item = &'static RegisteredHandler> {
    let last = *LAST_REGISTERED
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    std::iter::successors(last, |handler| handler.link.0.get().copied().flatten())
        .map(|handler| &handler.registration)
}

/// Checks that no two handlers in the program share a consumer name. Call it at start-up.
///
/// # Errors
///
/// [`SharedConsumers`] names every shared consumer and the handlers that use it.
pub fn check_consumers() -> Result<(), SharedConsumers> {
    let mut by_consumer: BTreeMap<&'static str, Vec<&'static str>> = BTreeMap::new();
    for registered in registered_handlers() {
        by_consumer
            .entry(registered.consumer)
            .or_default()
            .push(registered.handler);
    }
    let shared: Vec<_> = by_consumer
        .into_iter()
        .filter(|(_, handlers)| handlers.len() > 1)
        .map(|(consumer, mut handlers)| {
            handlers.sort_unstable();
            (consumer, handlers)
        })
        .collect();
    if shared.is_empty() {
        Ok(())
    } else {
        Err(SharedConsumers { shared })
    }
}

/// Consumer names used by more than one handler in the program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedConsumers {
    /// Each shared consumer name with the handlers that use it, sorted.
    pub shared: Vec<(&'static str, Vec<&'static str>)>,
}

impl fmt::Display for SharedConsumers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("several #[idempotent] handlers share a consumer name, so each would treat the others' messages as already processed:")?;
        for (consumer, handlers) in &self.shared {
            write!(f, " \"{consumer}\" is used by {};", handlers.join(" and "))?;
        }
        Ok(())
    }
}

impl std::error::Error for SharedConsumers {}

#[cfg(test)]
mod tests {
    use super::{RegisteredHandler, registered_handlers};
    use crate::transaction::Handler;

    /// A constructor run twice, as WebAssembly may, lists the handler once, and the
    /// list stays finite.
    #[test]
    fn a_handler_registered_twice_is_listed_once() {
        static HANDLER: Handler =
            Handler::new(RegisteredHandler::new("registered-twice", "tests::twice"));
        HANDLER.register();
        HANDLER.register();
        let listed = registered_handlers()
            .filter(|registered| registered.consumer == "registered-twice")
            .count();
        assert_eq!(listed, 1);
    }
}
