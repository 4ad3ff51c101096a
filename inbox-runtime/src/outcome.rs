//! How a call ends: the [`Outcome`] it returns, and why it stopped short of a commit.

use std::convert::Infallible;
use std::time::Duration;

use diesel::result::Error;

use crate::key::InvalidKey;

/// What an `#[idempotent]` handler did with one delivery.
///
/// [`Outcome::Processed`] and [`Outcome::Duplicate`] mean the message may be
/// acknowledged: either this call committed its effect, or an earlier delivery of the
/// same message already had. [`Outcome::InProgress`], which only claim-mode handlers
/// return, means it must not be: another delivery is still working on the message.
#[must_use = "an Outcome tells whether to acknowledge the message"]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome<T> {
    /// The handler ran and its transaction, marker included, committed; in claim mode,
    /// the body ran and its claim was completed.
    Processed(T),
    /// This (message, consumer) pair was already processed; the handler did not run.
    Duplicate,
    /// Claim mode only: another delivery holds a live claim on this (message, consumer)
    /// and may still be running its body. The body did not run. Do not acknowledge:
    /// have the message delivered again later, once the holder has completed it (the
    /// redelivery is then a duplicate) or its lease has ended (the redelivery takes the
    /// claim over).
    InProgress {
        /// How long until the holder's lease ends, on the database's clock, when known:
        /// a redelivery before then finds the claim still held.
        lease_remaining: Option<Duration>,
    },
}

impl<T> Outcome<T> {
    /// Returns `true` for [`Outcome::Processed`].
    pub fn is_processed(&self) -> bool {
        matches!(self, Self::Processed(_))
    }

    /// Returns `true` for [`Outcome::Duplicate`].
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Self::Duplicate)
    }

    /// Returns `true` for [`Outcome::InProgress`].
    pub fn is_in_progress(&self) -> bool {
        matches!(self, Self::InProgress { .. })
    }

    /// Whether the delivery may be acknowledged: [`Outcome::Processed`] and
    /// [`Outcome::Duplicate`], not [`Outcome::InProgress`].
    pub fn may_acknowledge(&self) -> bool {
        !self.is_in_progress()
    }

    /// The handler's value, or `None` when the body did not run.
    pub fn processed(self) -> Option<T> {
        match self {
            Self::Processed(value) => Some(value),
            Self::Duplicate | Self::InProgress { .. } => None,
        }
    }

    /// Maps the handler's value, keeping the other outcomes as they are.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Self::Processed(value) => Outcome::Processed(f(value)),
            Self::Duplicate => Outcome::Duplicate,
            Self::InProgress { lease_remaining } => Outcome::InProgress { lease_remaining },
        }
    }
}

/// Why a call ended without committing.
pub(crate) enum Stop<E> {
    Duplicate,
    Database(Error),
    Handler(E),
}

impl Stop<Infallible> {
    /// A stop before the body ran, which holds no error of the body's type.
    pub(crate) fn widen<E>(self) -> Stop<E> {
        match self {
            Self::Duplicate => Stop::Duplicate,
            Self::Database(error) => Stop::Database(error),
        }
    }
}

impl<E> From<Error> for Stop<E> {
    fn from(error: Error) -> Self {
        Self::Database(error)
    }
}

impl<E> From<InvalidKey> for Stop<E> {
    fn from(invalid: InvalidKey) -> Self {
        Self::Database(invalid.into())
    }
}
