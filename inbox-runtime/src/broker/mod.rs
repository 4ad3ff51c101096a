//! The glue between a broker's deliveries and the inbox: which field of a delivery is its
//! key, and how a [`Disposition`](crate::Disposition) is carried out with the broker.
//! One module per broker, each behind the cargo feature of its client crate.

use std::fmt;

#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "lapin")]
pub mod lapin;
#[cfg(feature = "nats")]
pub mod nats;

/// A delivery without a field the inbox can key it by.
///
/// Such a message cannot be told apart from its own redeliveries, so it is never
/// processed: dead-letter it with this error's text as the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingKey {
    field: &'static str,
}

impl MissingKey {
    pub(crate) fn new(field: &'static str) -> Self {
        Self { field }
    }

    /// The broker field that was absent or empty.
    pub fn field(&self) -> &'static str {
        self.field
    }
}

impl fmt::Display for MissingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "message has no {}: without a key that stays the same across redeliveries it \
             cannot be processed exactly once, so it was not processed",
            self.field
        )
    }
}

impl std::error::Error for MissingKey {}
