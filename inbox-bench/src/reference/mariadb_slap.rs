//! The MySQL/MariaDB reference rows (m1) and (m2), sent by mariadb-slap: each statement a
//! text query and a round trip of its own, as (1) and (4) send theirs.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, ensure};

use super::client::{REFERENCE_CONSUMER, output};
use crate::variant::Script;
use crate::workload::ACCOUNTS;

const PROGRAM: &str = "mariadb-slap";

/// mariadb-slap's statements, `;`-separated. It has no client-side variables, so the
/// server draws the account: in a one-row derived table, which the join reads once, where
/// `WHERE id = FLOOR(RAND() * …)` would draw anew for every row it scans.
fn text(script: Script) -> String {
    let marker = match script {
        Script::Bare => String::new(),
        Script::MarkerInsert => format!(
            "INSERT INTO inbox (message_id, consumer) VALUES (UUID(), '{REFERENCE_CONSUMER}');"
        ),
        Script::BareBatch | Script::MarkerBatch => {
            unreachable!("{PROGRAM} sends no batch scripts (Script::on)")
        }
    };
    format!(
        "BEGIN;{marker}UPDATE accounts JOIN (SELECT FLOOR(RAND() * {ACCOUNTS}) AS drawn) AS account \
         ON accounts.id = account.drawn SET balance = balance + 1;COMMIT"
    )
}

/// Runs `script` on the database at `url` with `clients` clients of `transactions` each:
/// the time mariadb-slap counted, from when its clients were connected.
pub async fn run(
    url: &str,
    script: Script,
    clients: usize,
    transactions: u64,
) -> anyhow::Result<Duration> {
    let url = url::Url::parse(url).with_context(|| format!("{url} is not a URL"))?;
    let database = url.path().trim_start_matches('/');
    ensure!(!database.is_empty(), "{url} names no database");
    let mut command = Command::new(PROGRAM);
    command
        .arg(format!("--host={}", url.host_str().unwrap_or("localhost")))
        .arg(format!("--port={}", url.port().unwrap_or(3306)))
        .arg(format!("--user={}", url.username()))
        .arg(format!("--create-schema={database}"))
        // The database is the run's, dropped at its end.
        .arg("--no-drop")
        .arg(format!("--concurrency={clients}"))
        .arg("--iterations=1")
        // Counted over all clients, statement by statement.
        .arg(format!(
            "--number-of-queries={}",
            clients as u64 * transactions * script.statements()
        ))
        .arg("--delimiter=;")
        .arg(format!("--query={}", text(script)));
    if let Some(password) = url.password() {
        // Kept out of the command line, which every user can read.
        command.env("MYSQL_PWD", password);
    }
    seconds(&output(command).await?).map(Duration::from_secs_f64)
}

/// The `Average number of seconds to run all queries` of mariadb-slap's report.
fn seconds(report: &str) -> anyhow::Result<f64> {
    report
        .lines()
        .find_map(|line| {
            line.trim()
                .strip_prefix("Average number of seconds to run all queries: ")?
                .strip_suffix(" seconds")
        })
        .and_then(|value| value.parse().ok())
        .with_context(|| format!("no `Average number of seconds` from {PROGRAM}:\n{report}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;

    const REPORT: &str = "Benchmark
\tAverage number of seconds to run all queries: 0.980 seconds
\tMinimum number of seconds to run all queries: 0.980 seconds
\tMaximum number of seconds to run all queries: 0.980 seconds
\tNumber of clients running queries: 8
\tAverage number of queries per client: 375
";

    #[test]
    fn seconds_are_read_from_the_report() {
        assert_eq!(seconds(REPORT).unwrap(), 0.98);
        assert!(seconds("Benchmark\n").is_err());
    }

    #[test]
    fn scripts_send_their_statements() {
        for &script in Script::on(Backend::Mysql) {
            assert_eq!(
                text(script).split(';').count() as u64,
                script.statements(),
                "{script:?}"
            );
        }
    }
}
