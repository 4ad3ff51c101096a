//! The variants a run can measure: their numbers and labels in the report, and the
//! deliveries each one handles. How each handles them is the run's business, in
//! `handlers.rs`.

use crate::backend::Backend;
use crate::workload::Workload;

/// How many messages a batch row applies in one transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BatchSize {
    Ten,
    Fifty,
    Hundred,
}

impl BatchSize {
    pub const ALL: [Self; 3] = [Self::Ten, Self::Fifty, Self::Hundred];

    pub fn messages(self) -> u64 {
        match self {
            Self::Ten => 10,
            Self::Fifty => 50,
            Self::Hundred => 100,
        }
    }
}

/// What a reference row's C client sends in each transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Script {
    /// (p1, m1, s1) `BEGIN; UPDATE; COMMIT`: (1)'s statements.
    Bare,
    /// (p2, m2, s2) `BEGIN; INSERT marker; UPDATE; COMMIT`: a marker insert without the
    /// rest of what (4) sends (PostgreSQL's `SELECT 1`, MySQL's session variables and
    /// savepoint, SQLite's savepoint).
    MarkerInsert,
    /// (pb1) `BEGIN; UPDATE of 50 accounts; COMMIT`: the bare batch of 50's statements.
    BareBatch,
    /// (pb2) `BEGIN; INSERT 50 markers … RETURNING; UPDATE of 50 accounts; COMMIT`: what
    /// a batch of 50 sends, less the `SELECT 1` in COMMIT's round trip.
    MarkerBatch,
}

impl Script {
    /// One message per transaction: every client has these.
    pub const SINGLE: [Self; 2] = [Self::Bare, Self::MarkerInsert];
    /// A batch of [`Script::BATCH`] messages per transaction: pgbench only.
    pub const BATCHES: [Self; 2] = [Self::BareBatch, Self::MarkerBatch];
    /// The batch size of the batch scripts, as of the batch target.
    pub const BATCH: BatchSize = BatchSize::Fifty;

    /// The scripts `backend`'s client runs, in report order.
    pub fn on(backend: Backend) -> &'static [Self] {
        match backend {
            Backend::Postgres => &[
                Self::Bare,
                Self::MarkerInsert,
                Self::BareBatch,
                Self::MarkerBatch,
            ],
            Backend::Mysql | Backend::Sqlite => &Self::SINGLE,
        }
    }

    /// Statements per transaction, each a round trip of its own but on PostgreSQL, where
    /// the marker scripts pipeline BEGIN with the insert.
    pub fn statements(self) -> u64 {
        match self {
            Self::Bare | Self::BareBatch => 3,
            Self::MarkerInsert | Self::MarkerBatch => 4,
        }
    }

    /// Messages each transaction credits (and marks).
    pub fn messages(self) -> u64 {
        match self {
            Self::Bare | Self::MarkerInsert => 1,
            Self::BareBatch | Self::MarkerBatch => Self::BATCH.messages(),
        }
    }

    /// Whether each transaction inserts its messages' markers.
    pub fn marks(self) -> bool {
        matches!(self, Self::MarkerInsert | Self::MarkerBatch)
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
    /// (4c) `#[idempotent(claim)]`: the claim committed, then the body outside any
    /// transaction (a no-op external call, then the credit, autocommitted), then the
    /// completion.
    Claimed,
    /// (5) `#[idempotent]` where `percent` of the deliveries are redeliveries.
    Duplicates { percent: u64 },
    /// (6) MassTransit's EF Core inbox: insert and commit, then lock, handle, consume.
    PeerFlow,
    /// (7) `#[idempotent]` over an inbox pre-filled with `rows` markers.
    Prefilled { rows: u64 },
    /// (8) (4)'s deliveries while a `Pruner` at its default pace prunes `rows` old
    /// markers, loaded before the measurement.
    PruneUnderLoad { rows: u64 },
    /// (b10, b50, b100) `#[idempotent(batch = …)]`: a batch of messages per transaction,
    /// their credits in one statement.
    Batch(BatchSize),
    /// (bb10, bb50, bb100) the same credits in the same transactions, without the inbox.
    BareBatch(BatchSize),
    /// (p1, p2) by pgbench on PostgreSQL, (m1, m2) by mariadb-slap on MySQL/MariaDB,
    /// (s1, s2) by the sqlite3 shell on SQLite: the database without diesel or the
    /// harness.
    Reference { backend: Backend, script: Script },
}

impl Variant {
    /// The variants measured on a freshly emptied inbox, in report order.
    pub const EMPTY_INBOX: [Self; 15] = [
        Self::Bare,
        Self::Naive,
        Self::HandWritten,
        Self::Idempotent,
        Self::IdempotentReadingFirst,
        Self::Claimed,
        Self::Duplicates { percent: 50 },
        Self::Duplicates { percent: 100 },
        Self::PeerFlow,
        Self::Batch(BatchSize::Ten),
        Self::Batch(BatchSize::Fifty),
        Self::Batch(BatchSize::Hundred),
        Self::BareBatch(BatchSize::Ten),
        Self::BareBatch(BatchSize::Fifty),
        Self::BareBatch(BatchSize::Hundred),
    ];

    /// The variants measured on a Galera cluster: the ceiling, the library's statements by
    /// hand, and the library, each a single transaction per message. The others measure
    /// the library's modes and alternatives, which a cluster changes no differently.
    pub const CLUSTER: [Self; 3] = [Self::Bare, Self::HandWritten, Self::Idempotent];

    /// Every variant's number, as [`Variant::number`] gives it, in report order.
    pub fn numbers() -> Vec<&'static str> {
        let mut numbers: Vec<&'static str> = Self::EMPTY_INBOX
            .into_iter()
            .chain([
                Self::PruneUnderLoad { rows: 0 },
                Self::Prefilled { rows: 0 },
            ])
            .chain(Self::references())
            .map(Self::number)
            .collect();
        numbers.dedup();
        numbers
    }

    /// Every backend's reference rows, in report order.
    pub fn references() -> impl Iterator<Item = Self> {
        Backend::ALL.into_iter().flat_map(|backend| {
            Script::on(backend)
                .iter()
                .map(move |&script| Self::Reference { backend, script })
        })
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
            Self::Claimed => "4c",
            Self::Duplicates { .. } => "5",
            Self::PeerFlow => "6",
            Self::Prefilled { .. } => "7",
            Self::PruneUnderLoad { .. } => "8",
            Self::Batch(size) => match size {
                BatchSize::Ten => "b10",
                BatchSize::Fifty => "b50",
                BatchSize::Hundred => "b100",
            },
            Self::BareBatch(size) => match size {
                BatchSize::Ten => "bb10",
                BatchSize::Fifty => "bb50",
                BatchSize::Hundred => "bb100",
            },
            Self::Reference { backend, script } => match (backend, script) {
                (Backend::Postgres, Script::Bare) => "p1",
                (Backend::Postgres, Script::MarkerInsert) => "p2",
                (Backend::Mysql, Script::Bare) => "m1",
                (Backend::Mysql, Script::MarkerInsert) => "m2",
                (Backend::Sqlite, Script::Bare) => "s1",
                (Backend::Sqlite, Script::MarkerInsert) => "s2",
                (Backend::Postgres, Script::BareBatch) => "pb1",
                (Backend::Postgres, Script::MarkerBatch) => "pb2",
                (Backend::Mysql | Backend::Sqlite, Script::BareBatch | Script::MarkerBatch) => {
                    unreachable!("only pgbench sends the batch scripts (Script::on)")
                }
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
            Self::Claimed => "#[idempotent(claim)], no-op external call".to_owned(),
            Self::Duplicates { percent } => format!("#[idempotent], {percent}% duplicates"),
            Self::PeerFlow => "peer flow (two transactions)".to_owned(),
            Self::Prefilled { rows } => {
                format!("#[idempotent], {} rows in inbox", count_label(rows))
            }
            Self::PruneUnderLoad { rows } => format!(
                "#[idempotent] while a pruner prunes {} old markers",
                count_label(rows)
            ),
            Self::Batch(size) => {
                format!("#[idempotent(batch)], {} per transaction", size.messages())
            }
            Self::BareBatch(size) => format!("bare batch of {}, no inbox", size.messages()),
            Self::Reference { backend, script } => {
                let client = reference_client(backend);
                match script {
                    Script::Bare => format!("{client}: bare transaction"),
                    Script::MarkerInsert => format!("{client}: marker insert + bare"),
                    Script::BareBatch => {
                        format!("{client}: bare batch of {}", Script::BATCH.messages())
                    }
                    Script::MarkerBatch => format!(
                        "{client}: {} markers + bare batch",
                        Script::BATCH.messages()
                    ),
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

    /// Messages handled in one call of the handler, in one transaction.
    pub fn messages_per_call(self) -> u64 {
        match self {
            Self::Batch(size) | Self::BareBatch(size) => size.messages(),
            Self::Reference { script, .. } => script.messages(),
            _ => 1,
        }
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
