//! The SQLite reference rows (s1) and (s2), sent by the sqlite3 shell: one process per
//! client, each running its transactions from a script, in WAL with `synchronous = FULL`
//! as the harness's connections are.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow};

use super::client::REFERENCE_CONSUMER;
use crate::variant::Script;
use crate::workload::ACCOUNTS;

const PROGRAM: &str = "sqlite3";

/// Long enough for any shell to get the write lock: SQLite's busy handler sleeps up to
/// 100 ms between tries, and under contention a shell can lose more than the harness's
/// 10 s in a row (the harness would retry the transaction; a shell would stop).
const BUSY_TIMEOUT_MS: u32 = 120_000;

/// One client's script: the settings, then `transactions` transactions. The marker
/// insert comes first in its transaction, so that a second writer waits in the busy
/// handler, as the library's does; ids are random like the harness's UUIDs.
fn text(script: Script, transactions: u64) -> String {
    let marker = match script {
        Script::Bare => String::new(),
        Script::MarkerInsert => format!(
            "INSERT INTO inbox (message_id, consumer) \
             VALUES (lower(hex(randomblob(16))), '{REFERENCE_CONSUMER}'); "
        ),
        Script::BareBatch | Script::MarkerBatch => {
            unreachable!("{PROGRAM} sends no batch scripts (Script::on)")
        }
    };
    let transaction = format!(
        "BEGIN; {marker}UPDATE accounts SET balance = balance + 1 \
         WHERE id = abs(random()) % {ACCOUNTS}; COMMIT;\n"
    );
    let mut text = format!(
        ".bail on\nPRAGMA busy_timeout = {BUSY_TIMEOUT_MS};\n\
         PRAGMA journal_mode = WAL;\nPRAGMA synchronous = FULL;\n"
    );
    for _ in 0..transactions {
        text.push_str(&transaction);
    }
    text
}

/// Runs `script` on the database file at `path` with `clients` shells of `transactions`
/// each, all started together: the time until the last one is done, their start-up
/// included (milliseconds, against the seconds of a measurement).
pub async fn run(
    path: &str,
    script: Script,
    clients: usize,
    transactions: u64,
) -> anyhow::Result<Duration> {
    let text = text(script, transactions);
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        let began = Instant::now();
        let mut shells = Vec::with_capacity(clients);
        for _ in 0..clients {
            let mut shell = Command::new(PROGRAM)
                .arg(&path)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .with_context(|| format!("start {PROGRAM}"))?;
            let mut stdin = shell.stdin.take().expect("stdin is piped");
            let text = text.clone();
            // Fed from threads of their own, so that every shell starts at once.
            let feeder = std::thread::spawn(move || stdin.write_all(text.as_bytes()));
            shells.push((shell, feeder));
        }
        let mut failures = String::new();
        for (shell, feeder) in shells {
            let output = shell.wait_with_output()?;
            let fed = feeder.join().map_err(|_| anyhow!("a feeder panicked"))?;
            if !output.status.success() || fed.is_err() {
                let _ = writeln!(
                    failures,
                    "{PROGRAM} failed ({}): {}",
                    output.status,
                    String::from_utf8_lossy(&output.stderr).trim()
                );
            }
        }
        let elapsed = began.elapsed();
        if failures.is_empty() {
            Ok(elapsed)
        } else {
            Err(anyhow!(failures))
        }
    })
    .await?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;

    #[test]
    fn scripts_send_their_statements() {
        for &script in Script::on(Backend::Sqlite) {
            let text = text(script, 2);
            let transactions: Vec<&str> = text.lines().filter(|l| l.starts_with("BEGIN")).collect();
            assert_eq!(transactions.len(), 2);
            assert_eq!(
                transactions[0].matches(';').count() as u64,
                script.statements(),
                "{script:?}"
            );
        }
    }
}
