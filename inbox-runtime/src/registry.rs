//! Every `#[idempotent]` handler linked into the program, for a start-up check that no
//! two of them share a consumer name across crates.
//!
//! Within one crate the attribute rejects a shared name at compile time. Handlers from
//! different crates only meet in the final program, where a shared name would make one
//! handler's markers silently suppress the other: [`check_consumers`] finds that.

use std::collections::BTreeMap;
use std::fmt;

use crate::handler::registered_handlers;

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
    shared: Vec<(&'static str, Vec<&'static str>)>,
}

impl SharedConsumers {
    /// Each shared consumer name, in order, with the handlers that use it, sorted.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &[&'static str])> {
        self.shared
            .iter()
            .map(|(consumer, handlers)| (*consumer, handlers.as_slice()))
    }
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
