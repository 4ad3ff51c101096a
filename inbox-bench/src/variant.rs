//! The variants a run can measure: their numbers and labels in the report, and the
//! deliveries each one handles. How each handles them is the run's business, in
//! `handlers.rs`.

use crate::backend::Backend;
use crate::workload::Workload;

/// What a reference row's C client sends in each transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Script {
    /// (p1, m1, s1) `BEGIN; UPDATE; COMMIT`: (1)'s statements.
    Bare,
    /// (p2, m2, s2) `BEGIN; INSERT marker; UPDATE; COMMIT`: a marker insert without the
    /// rest of what (4) sends (PostgreSQL's `SELECT 1`, MySQL's session variables and
    /// savepoint, SQLite's savepoint).
    MarkerInsert,
}

impl Script {
    pub const ALL: [Self; 2] = [Self::Bare, Self::MarkerInsert];

    /// Statements per transaction, each a round trip of its own.
    pub fn statements(self) -> u64 {
        match self {
            Self::Bare => 3,
            Self::MarkerInsert => 4,
        }
    }
}

/// The C client that sends a backend's reference rows.
pub fn reference_client(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "pgbench",
        Backend::Mysql => "mariadb-slap",
        Backend::Sqlite => "sqlite3",
    }
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
    /// (p1, p2) by pgbench on PostgreSQL, (m1, m2) by mariadb-slap on MySQL/MariaDB,
    /// (s1, s2) by the sqlite3 shell on SQLite: the database without diesel or the
    /// harness.
    Reference { backend: Backend, script: Script },
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
            .chain(Self::references())
            .map(Self::number)
            .collect();
        numbers.dedup();
        numbers
    }

    /// Every backend's reference rows, in report order.
    pub fn references() -> impl Iterator<Item = Self> {
        Backend::ALL
            .into_iter()
            .flat_map(|backend| Script::ALL.map(|script| Self::Reference { backend, script }))
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
            Self::Reference { backend, script } => match (backend, script) {
                (Backend::Postgres, Script::Bare) => "p1",
                (Backend::Postgres, Script::MarkerInsert) => "p2",
                (Backend::Mysql, Script::Bare) => "m1",
                (Backend::Mysql, Script::MarkerInsert) => "m2",
                (Backend::Sqlite, Script::Bare) => "s1",
                (Backend::Sqlite, Script::MarkerInsert) => "s2",
            },
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
            Self::Reference { backend, script } => {
                let client = reference_client(backend);
                match script {
                    Script::Bare => format!("{client}: bare transaction"),
                    Script::MarkerInsert => format!("{client}: marker insert + bare"),
                }
            }
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
