//! Whether to read the inbox before opening a transaction.
//!
//! A duplicate found by a read costs one indexed lookup; found by the transaction's
//! marker insert it costs BEGIN, the insert and ROLLBACK, and on the way it waits for
//! locks (and on SQLite takes the database's write lock). For a new message the read is
//! wasted: on PostgreSQL it adds 10–17% to the message's cost, about what it saves a
//! duplicate (inbox-bench). Reading first from a quarter of
//! duplicates on leaves a stream of new messages untouched and turns a replay into reads
//! without lock traffic. Which path a delivery takes never changes its outcome: the
//! transaction decides either way.

use std::sync::atomic::{AtomicU32, Ordering};

/// When to look for a committed marker before opening a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FastPath {
    /// Read first while a quarter or more of the handler's recent deliveries were
    /// duplicates: never during a stream of new messages, always during a replay.
    Adaptive,
    /// Always read first: a redelivery costs a read instead of a transaction.
    Enabled,
    /// Never read first.
    Disabled,
}

impl FastPath {
    /// [`FastPath::Enabled`] when `enabled`, for example when the broker flags the
    /// delivery as a redelivery.
    pub const fn when(enabled: bool) -> Self {
        if enabled {
            Self::Enabled
        } else {
            Self::Disabled
        }
    }

    pub(crate) fn reads_first(self, recent: &DuplicateShare) -> bool {
        match self {
            Self::Adaptive => recent.is_high(),
            Self::Enabled => true,
            Self::Disabled => false,
        }
    }
}

/// The share of a handler's recent deliveries that were duplicates: an exponentially
/// weighted average over about the last 32 outcomes, in units of 1/65536.
///
/// Updated without a lock. Concurrent deliveries may overwrite each other's update, which
/// only blurs an estimate; no outcome depends on it. During a stream of new messages the
/// share stays put and is only read, so the handler's tasks do not contend for it.
#[derive(Debug, Default)]
pub(crate) struct DuplicateShare(AtomicU32);

impl DuplicateShare {
    const ALL: u32 = 1 << 16;
    /// Each outcome moves the share 1/32 of the way towards all or none.
    const STEP_SHIFT: u32 = 5;
    const READ_FIRST_FROM: u32 = Self::ALL / 4;

    pub(crate) const fn new() -> Self {
        Self(AtomicU32::new(0))
    }

    pub(crate) fn record(&self, duplicate: bool) {
        let share = self.0.load(Ordering::Relaxed);
        let target = if duplicate { Self::ALL } else { 0 };
        let updated = share - (share >> Self::STEP_SHIFT) + (target >> Self::STEP_SHIFT);
        if updated != share {
            self.0.store(updated, Ordering::Relaxed);
        }
    }

    fn is_high(&self) -> bool {
        self.0.load(Ordering::Relaxed) >= Self::READ_FIRST_FROM
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many deliveries of the given kind it takes to switch the adaptive fast path.
    fn deliveries_until_switch(share: &DuplicateShare, duplicate: bool) -> usize {
        let before = FastPath::Adaptive.reads_first(share);
        (1..=1_000)
            .find(|_| {
                share.record(duplicate);
                FastPath::Adaptive.reads_first(share) != before
            })
            .expect("the fast path switches")
    }

    #[test]
    fn new_messages_never_read_first() {
        let share = DuplicateShare::new();
        for _ in 0..1_000 {
            share.record(false);
            assert!(!FastPath::Adaptive.reads_first(&share));
        }
    }

    #[test]
    fn a_replay_switches_reading_on_within_ten_and_off_within_fifty_new_messages() {
        let share = DuplicateShare::new();
        let on_after = deliveries_until_switch(&share, true);
        assert!((5..=10).contains(&on_after), "{on_after}");
        for _ in 0..1_000 {
            share.record(true);
        }
        assert!(share.0.load(Ordering::Relaxed) <= DuplicateShare::ALL);
        let off_after = deliveries_until_switch(&share, false);
        assert!((40..=50).contains(&off_after), "{off_after}");
    }

    #[test]
    fn reads_first_while_a_quarter_or_more_are_duplicates() {
        for (every, reads_first) in [(2, true), (3, true), (5, false), (10, false)] {
            let share = DuplicateShare::new();
            let mut reads = 0;
            for n in 0..10_000 {
                share.record(n % every == 0);
                reads += usize::from(FastPath::Adaptive.reads_first(&share));
            }
            // Judged over the last 9,000 deliveries, once the average has settled.
            assert_eq!(
                reads > 5_000,
                reads_first,
                "one in {every}: read first {reads} times"
            );
        }
    }

    #[test]
    fn explicit_choices_ignore_the_share() {
        let share = DuplicateShare::new();
        assert!(FastPath::when(true).reads_first(&share));
        assert!(!FastPath::when(false).reads_first(&share));
        for _ in 0..100 {
            share.record(true);
        }
        assert!(!FastPath::Disabled.reads_first(&share));
    }
}
