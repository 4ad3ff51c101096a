//! What the three C clients share: the consumer their markers carry, running one, and
//! the threads its clients get.

use std::process::Command;

use anyhow::{Context as _, anyhow};

/// The marker's consumer in every reference script.
pub const REFERENCE_CONSUMER: &str = "c-client-reference";

/// Runs `command` on a blocking thread, and returns its standard output once it
/// succeeded.
pub async fn output(mut command: Command) -> anyhow::Result<String> {
    let program = command.get_program().to_string_lossy().into_owned();
    let output = tokio::task::spawn_blocking(move || command.output())
        .await?
        .with_context(|| format!("start {program}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
        return Err(anyhow!(stderr)).context(format!("{program} failed ({})", output.status));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The clients' threads: more than cores would only add their own context switches.
pub fn threads(clients: usize) -> usize {
    clients.min(std::thread::available_parallelism().map_or(1, usize::from))
}
