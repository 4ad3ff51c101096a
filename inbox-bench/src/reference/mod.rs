//! The reference rows: (1)'s statements, and the same with a marker insert, sent by each
//! database's own C client instead of by the harness through diesel: pgbench (p1, p2),
//! mariadb-slap (m1, m2), the sqlite3 shell (s1, s2). Measured in the same rounds as the
//! variants, their ratio is what this database on this machine allows a marker insert to
//! cost, which (4) / (1) is read against.
//!
//! Each client works on the run's own tables, one client per consumer, each on its own
//! connection, the same deliveries split evenly among them.

mod client;
mod mariadb_slap;
mod pgbench;
mod sqlite_shell;

use std::process::Command;
use std::time::Duration;

use crate::backend::Backend;
use crate::variant::{Script, Variant, reference_client};

/// A backend's reference client, found on PATH.
#[derive(Debug, Clone)]
pub struct ReferenceClient {
    backend: Backend,
    /// What `--version` printed, for the report.
    pub version: String,
}

impl ReferenceClient {
    /// The client for `backend`, or why its reference rows are skipped.
    pub fn find(backend: Backend) -> Result<Self, String> {
        let program = reference_client(backend);
        let numbers: Vec<String> = Script::on(backend)
            .iter()
            .map(|&script| format!("({})", Variant::Reference { backend, script }.number()))
            .collect();
        let skipping = format!(
            "skipping the {} reference rows {}",
            backend.name(),
            numbers.join(", ")
        );
        match Command::new(program).arg("--version").output() {
            Ok(output) if output.status.success() => {
                let version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
                // sqlite3 prints its version alone.
                let version = if version.starts_with(program) {
                    version
                } else {
                    format!("{program} {version}")
                };
                Ok(Self { backend, version })
            }
            Ok(output) => Err(format!(
                "{skipping}: `{program} --version` failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )),
            Err(_) => Err(format!("{skipping}: {program} is not on PATH")),
        }
    }

    /// Runs `script` on the run's database (the URL of a server's, the path of SQLite's
    /// file) with `clients` clients of `transactions` transactions each (of
    /// [`Script::messages`] messages), and returns the
    /// time they took, connecting left out where the client's clock allows.
    pub async fn run(
        &self,
        place: &str,
        script: Script,
        clients: usize,
        transactions: u64,
    ) -> anyhow::Result<Duration> {
        match self.backend {
            Backend::Postgres => pgbench::run(place, script, clients, transactions).await,
            Backend::Mysql => mariadb_slap::run(place, script, clients, transactions).await,
            Backend::Sqlite => sqlite_shell::run(place, script, clients, transactions).await,
        }
    }
}
