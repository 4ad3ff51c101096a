//! What to tell the broker about a delivery, from what its handler returned.

use std::fmt;
use std::time::Duration;

use crate::batch::BatchOutcome;
use crate::outcome::Outcome;
use crate::verdict::Classify;

/// What to do with a delivery once its handler has returned: the one mapping from a
/// handler's result to a broker's acknowledgement that every consumer needs.
///
/// Built with [`Disposition::of`]. A duplicate is acknowledged like a processed message:
/// sending it back or to a dead-letter queue would only make it return later.
#[must_use = "a Disposition says how to settle the delivery with the broker"]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Disposition {
    /// Acknowledge: the message was processed, now or by an earlier delivery.
    Ack,
    /// Have the message delivered again (nack and requeue, or let its lock expire):
    /// nothing was committed, and a later attempt can succeed. `after`, when known, is
    /// how long to wait first.
    Retry {
        /// How long to wait before the next delivery, when there is a reason to wait a
        /// particular time; `None` leaves the delay to the broker.
        after: Option<Duration>,
        /// Why this delivery failed: the error's own text, or that another delivery
        /// holds the message's claim. A broker's dead letter past its retry limit
        /// carries the last one.
        reason: String,
    },
    /// Send the message to the dead-letter queue: retrying it fails the same way, or it
    /// needs a person (an invalid key, a business constraint, work committed early).
    DeadLetter {
        /// Why, for the dead-letter record: the error's own text.
        reason: String,
    },
}

impl Disposition {
    /// Settles a handler's result: `Processed` and `Duplicate` are [`Disposition::Ack`],
    /// `InProgress` is [`Disposition::Retry`] once the holder's lease has run out; an
    /// error by its [`Classify`] verdict: `Transient` and `ConnectionUnusable` are
    /// `Retry` (after the error's [`retry_after`](Classify::retry_after)), `Permanent`
    /// and `InboxDuplicate` are `DeadLetter`. A handler answers its own marker's
    /// duplicate with `Ok(Outcome::Duplicate)`: a unique violation of an inbox index in
    /// its error came from its body's own statements (a marker of another consumer, or
    /// on SQLite any table called `inbox`), which rolled back, and acknowledging it
    /// would lose the message. An error
    /// with no database, connection or pool error inside is the handler's own verdict on
    /// the message, and is dead-lettered unless it says otherwise
    /// ([`Classified`](crate::Classified), or its own [`Classify`] impl).
    pub fn of<T, E>(result: &Result<Outcome<T>, E>) -> Self
    where
        E: Classify + fmt::Display,
    {
        match result {
            Ok(Outcome::Processed(_) | Outcome::Duplicate) => Self::Ack,
            Ok(Outcome::InProgress { lease_remaining }) => Self::Retry {
                after: *lease_remaining,
                reason: String::from("another delivery holds the message's claim"),
            },
            Err(error) => Self::of_error(error),
        }
    }

    /// Settles a failed delivery by its error's [`Classify`] verdict, as
    /// [`Disposition::of`] does.
    pub fn of_error<E>(error: &E) -> Self
    where
        E: Classify + fmt::Display + ?Sized,
    {
        match error.class() {
            class if class.is_retryable() => Self::Retry {
                after: error.retry_after(),
                reason: error.to_string(),
            },
            _ => Self::DeadLetter {
                reason: error.to_string(),
            },
        }
    }
}

impl Disposition {
    /// Settles a batch handler's result, for every message of the batch alike: `Ok` is
    /// [`Disposition::Ack`] (each message was processed or a duplicate), an error is
    /// classified as by [`Disposition::of`]. A `DeadLetter` for a batch of several
    /// messages need not say which one is at fault (an
    /// [`InvalidBatchKey`](crate::InvalidBatchKey) does, a business constraint that one
    /// message breaks does not): run each message alone, as a batch of one, and settle
    /// each by its own result, so that only the one at fault is dead-lettered.
    pub fn of_batch<T, E>(result: &Result<BatchOutcome<T>, E>) -> Self
    where
        E: Classify + fmt::Display,
    {
        match result {
            Ok(_) => Self::Ack,
            Err(error) => Self::of_error(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as StdError;

    use diesel::result::{DatabaseErrorKind, Error};

    use super::*;
    use crate::classify::{ErrorClass, classify};

    fn database(kind: DatabaseErrorKind, message: &str) -> Error {
        Error::DatabaseError(kind, Box::new(message.to_owned()))
    }

    /// A handler's error type that wraps a diesel error as its source.
    #[derive(Debug)]
    struct Wrapped(Error);

    impl fmt::Display for Wrapped {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "handler failed: {}", self.0)
        }
    }

    impl StdError for Wrapped {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }

    fn of(error: Error) -> Disposition {
        Disposition::of::<(), _>(&Err(error))
    }

    #[test]
    fn every_outcome_is_acknowledged() {
        assert_eq!(
            Disposition::of::<_, Error>(&Ok(Outcome::Processed(1))),
            Disposition::Ack
        );
        assert_eq!(
            Disposition::of::<(), Error>(&Ok(Outcome::Duplicate)),
            Disposition::Ack
        );
    }

    #[test]
    fn a_claim_in_progress_is_retried_once_its_lease_has_run_out() {
        let lease_remaining = Some(Duration::from_secs(42));
        assert_eq!(
            Disposition::of::<(), Error>(&Ok(Outcome::InProgress { lease_remaining })),
            Disposition::Retry {
                after: lease_remaining,
                reason: String::from("another delivery holds the message's claim"),
            }
        );
        assert_eq!(
            Disposition::of::<(), Error>(&Ok(Outcome::InProgress {
                lease_remaining: None
            })),
            Disposition::Retry {
                after: None,
                reason: String::from("another delivery holds the message's claim"),
            }
        );
    }

    #[test]
    fn claim_refusals_and_fingerprint_mismatches_map_to_their_action() {
        use crate::claims::ClaimError;

        let lost = ClaimError::Lost { attempt: 1 };
        let reason = lost.to_string();
        assert_eq!(
            of(lost.into()),
            Disposition::Retry {
                after: None,
                reason
            }
        );
        for refused in [
            ClaimError::AttemptsExhausted { attempts: 3 },
            ClaimError::Quarantined { attempts: 1 },
            ClaimError::InvalidLease {
                lease: Duration::ZERO,
            },
        ] {
            let reason = refused.to_string();
            assert_eq!(of(refused.into()), Disposition::DeadLetter { reason });
        }
        let mismatch = crate::FingerprintMismatch {
            message_id: String::from("m-1"),
            consumer: String::from("c"),
            stored: String::from("a"),
            delivered: String::from("b"),
        };
        assert!(matches!(
            of(mismatch.into()),
            Disposition::DeadLetter { .. }
        ));
    }

    #[test]
    fn every_error_class_maps_to_its_action() {
        let inbox_duplicate = "Duplicate entry 'm-1' for key 'ux_inbox_message_consumer'";
        assert_eq!(
            classify(&database(
                DatabaseErrorKind::UniqueViolation,
                inbox_duplicate
            )),
            ErrorClass::InboxDuplicate
        );
        // Never from a handler's own marker, which is `Ok(Duplicate)`: not acknowledged.
        assert_eq!(
            of(database(
                DatabaseErrorKind::UniqueViolation,
                inbox_duplicate
            )),
            Disposition::DeadLetter {
                reason: String::from(inbox_duplicate)
            }
        );

        let deadlock = database(DatabaseErrorKind::Unknown, "deadlock detected");
        assert_eq!(classify(&deadlock), ErrorClass::Transient);
        assert_eq!(
            of(deadlock),
            Disposition::Retry {
                after: None,
                reason: String::from("deadlock detected")
            }
        );

        assert_eq!(
            classify(&Error::BrokenTransactionManager),
            ErrorClass::ConnectionUnusable
        );
        assert_eq!(
            of(Error::BrokenTransactionManager),
            Disposition::Retry {
                after: None,
                reason: Error::BrokenTransactionManager.to_string()
            }
        );

        let business = database(
            DatabaseErrorKind::CheckViolation,
            "balance must be positive",
        );
        assert_eq!(classify(&business), ErrorClass::Permanent);
        assert_eq!(
            of(business),
            Disposition::DeadLetter {
                reason: String::from("balance must be positive")
            }
        );
        let invalid_key = Error::from(crate::InvalidKey::Empty);
        assert!(matches!(of(invalid_key), Disposition::DeadLetter { .. }));
    }

    #[test]
    fn a_database_error_is_found_inside_boxed_and_wrapped_errors() {
        let boxed: Box<dyn StdError + Send + Sync> = Box::new(Wrapped(database(
            DatabaseErrorKind::Unknown,
            "deadlock detected",
        )));
        // The reason is the handler's error's text, wrapping and all.
        let deadlock = Disposition::Retry {
            after: None,
            reason: String::from("handler failed: deadlock detected"),
        };
        assert_eq!(Disposition::of::<(), _>(&Err(boxed)), deadlock);
        let not_send: Box<dyn StdError> = Box::new(Wrapped(database(
            DatabaseErrorKind::Unknown,
            "deadlock detected",
        )));
        assert_eq!(Disposition::of::<(), _>(&Err(not_send)), deadlock);
        let own: Box<dyn StdError + Send + Sync> = "the order was cancelled".into();
        assert_eq!(
            Disposition::of::<(), _>(&Err(own)),
            Disposition::DeadLetter {
                reason: String::from("the order was cancelled")
            }
        );
    }
}
