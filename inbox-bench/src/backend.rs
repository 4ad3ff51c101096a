//! The databases the harness measures: what every layer above names.

/// The three databases the harness runs on, in report order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    Postgres,
    Mysql,
    Sqlite,
}

impl Backend {
    pub const ALL: [Self; 3] = [Self::Postgres, Self::Mysql, Self::Sqlite];

    pub fn name(self) -> &'static str {
        match self {
            Self::Postgres => "PostgreSQL",
            Self::Mysql => "MySQL/MariaDB",
            Self::Sqlite => "SQLite",
        }
    }
}
