/// What an `#[idempotent]` handler did with one delivery.
///
/// Both variants mean the message may be acknowledged: either this call committed its
/// effect, or an earlier delivery of the same message already had.
#[must_use = "an Outcome tells whether to acknowledge the message"]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome<T> {
    /// The handler ran and its transaction, marker included, committed.
    Processed(T),
    /// This (message, consumer) pair was already processed; the handler did not run.
    Duplicate,
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

    /// The handler's value, or `None` for a duplicate.
    pub fn processed(self) -> Option<T> {
        match self {
            Self::Processed(value) => Some(value),
            Self::Duplicate => None,
        }
    }

    /// Maps the handler's value, keeping a duplicate a duplicate.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Self::Processed(value) => Outcome::Processed(f(value)),
            Self::Duplicate => Outcome::Duplicate,
        }
    }
}
