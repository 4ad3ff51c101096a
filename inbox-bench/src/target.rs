//! Where a backend's measurements run: a PostgreSQL schema, a MySQL database or an SQLite
//! file of the run's own, made by `diesel_inbox::testing`. The library always names its
//! table `inbox`, so isolation from other users of the same server comes from the schema
//! or database.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::backend::Backend;

/// A backend to measure, with its server's URL.
pub enum Target {
    Postgres(String),
    Mysql(String),
    Sqlite,
}

impl Target {
    /// The target for `backend`, or why it is skipped.
    pub fn from_env(backend: Backend) -> Result<Self, String> {
        let server_url = |variable: &str, example: &str| match std::env::var(variable) {
            Ok(url) if !url.is_empty() => Ok(url),
            _ => Err(format!(
                "skipping {}: {variable} is not set (for example {variable}={example})",
                backend.name()
            )),
        };
        match backend {
            Backend::Postgres => {
                server_url("POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
                    .map(Self::Postgres)
            }
            Backend::Mysql => {
                server_url("MYSQL_URL", "mysql://root@127.0.0.1:3306/test").map(Self::Mysql)
            }
            Backend::Sqlite => Ok(Self::Sqlite),
        }
    }

    pub fn backend(&self) -> Backend {
        match self {
            Self::Postgres(_) => Backend::Postgres,
            Self::Mysql(_) => Backend::Mysql,
            Self::Sqlite => Backend::Sqlite,
        }
    }
}

/// `bench_<pid>_<n>`, the name of the run's place for one backend: the pid keeps concurrent runs (a smoke test beside a real run)
/// apart, the counter runs within one process (the smoke tests).
pub fn place_name() -> String {
    static TARGETS: AtomicU32 = AtomicU32::new(0);
    format!(
        "bench_{}_{}",
        std::process::id(),
        TARGETS.fetch_add(1, Ordering::Relaxed)
    )
}
