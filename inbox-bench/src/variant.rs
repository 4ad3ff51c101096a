//! The variants a run can measure: their numbers and labels in the report, and the
//! deliveries each one handles. How each handles them is the run's business, in
//! `handlers.rs`.

use crate::workload::Workload;

/// The reference rows pgbench measures on PostgreSQL: what it sends in each transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Script {
    /// (p1) `BEGIN; UPDATE; COMMIT`: (1)'s statements.
    Bare,
    /// (p2) `BEGIN; INSERT marker; UPDATE; COMMIT`: (4)'s statements, but for the
    /// `SELECT 1` that shares COMMIT's round trip.
    MarkerInsert,
}

impl Script {
    pub const ALL: [Self; 2] = [Self::Bare, Self::MarkerInsert];
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// (1) The business transaction alone: the ceiling.
    Bare,
    /// (2) Check, then insert into a table without a unique index: not exactly-once.
    Naive,
    /// (3) The statements `#[idempotent]` issues for a new message, written by hand.
    HandWritten,
    /// (4) `#[idempotent]`, every delivery a new message.
    Idempotent,
    /// (4b) `#[idempotent(fast_path = true)]`: what always reading first costs.
    IdempotentReadingFirst,
    /// (5) `#[idempotent]` where `percent` of the deliveries are redeliveries.
    Duplicates { percent: u64 },
    /// (6) MassTransit's EF Core inbox: insert and commit, then lock, handle, consume.
    PeerFlow,
    /// (7) `#[idempotent]` over an inbox pre-filled with `rows` markers.
    Prefilled { rows: u64 },
    /// (p1) and (p2): a reference run by pgbench, on PostgreSQL only.
    Pgbench(Script),
}

impl Variant {
    /// The variants measured on a freshly emptied inbox, in report order.
    pub const EMPTY_INBOX: [Self; 8] = [
        Self::Bare,
        Self::Naive,
        Self::HandWritten,
        Self::Idempotent,
        Self::IdempotentReadingFirst,
        Self::Duplicates { percent: 50 },
        Self::Duplicates { percent: 100 },
        Self::PeerFlow,
    ];

    /// Every variant's number, as [`Variant::number`] gives it, in report order.
    pub fn numbers() -> Vec<&'static str> {
        let mut numbers: Vec<&'static str> = Self::EMPTY_INBOX
            .into_iter()
            .chain([Self::Prefilled { rows: 0 }])
            .chain(Script::ALL.map(Self::Pgbench))
            .map(Self::number)
            .collect();
        numbers.dedup();
        numbers
    }

    /// The number the report gives this variant: `4b`, `p1`. Both shares of
    /// duplicates are variant 5, and every pre-filled size variant 7.
    pub fn number(self) -> &'static str {
        match self {
            Self::Bare => "1",
            Self::Naive => "2",
            Self::HandWritten => "3",
            Self::Idempotent => "4",
            Self::IdempotentReadingFirst => "4b",
            Self::Duplicates { .. } => "5",
            Self::PeerFlow => "6",
            Self::Prefilled { .. } => "7",
            Self::Pgbench(Script::Bare) => "p1",
            Self::Pgbench(Script::MarkerInsert) => "p2",
        }
    }

    pub fn label(self) -> String {
        let description = match self {
            Self::Bare => "bare transaction".to_owned(),
            Self::Naive => "naive check-then-insert".to_owned(),
            Self::HandWritten => "hand-written inbox SQL".to_owned(),
            Self::Idempotent => "#[idempotent]".to_owned(),
            Self::IdempotentReadingFirst => "#[idempotent], fast_path = true".to_owned(),
            Self::Duplicates { percent } => format!("#[idempotent], {percent}% duplicates"),
            Self::PeerFlow => "peer flow (two transactions)".to_owned(),
            Self::Prefilled { rows } => {
                format!("#[idempotent], {} rows in inbox", count_label(rows))
            }
            Self::Pgbench(Script::Bare) => "pgbench: bare transaction".to_owned(),
            Self::Pgbench(Script::MarkerInsert) => "pgbench: marker insert + bare".to_owned(),
        };
        format!("({}) {description}", self.number())
    }

    /// The deliveries of one measurement of this variant.
    pub fn workload(self, seed: u64, deliveries: u64) -> Workload {
        let duplicate_percent = match self {
            Self::Duplicates { percent } => percent,
            _ => 0,
        };
        Workload::new(seed, deliveries, duplicate_percent)
    }
}

/// `10k`, `1M`, `2.5M`, or the plain number.
pub fn count_label(count: u64) -> String {
    match count {
        n if n >= 1_000_000 && n % 100_000 == 0 => format!("{}M", n as f64 / 1e6),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_labelled_briefly() {
        assert_eq!(count_label(10_000), "10k");
        assert_eq!(count_label(1_000_000), "1M");
        assert_eq!(count_label(2_500_000), "2.5M");
        assert_eq!(count_label(1_234), "1234");
    }
}
