//! The benchmark harness of diesel-inbox: what exactly-once costs, measured side by side
//! with the alternatives on PostgreSQL, MySQL/MariaDB and SQLite in one run, written to
//! a Markdown report and an SVG chart. Run it with `cargo run --release -p inbox-bench`;
//! `--help` lists the options.

mod bench;
mod chart;
pub mod cli;
mod connection;
mod machine;
mod probe;
mod progress;
mod report;
mod runner;
mod setup;
mod target;
mod variant;
mod workload;

use anyhow::bail;
use diesel_async::{AsyncMysqlConnection, AsyncPgConnection};

pub use cli::{Args, Backend, Plan};
pub use variant::Variant;

use crate::connection::SqliteConn;
use crate::machine::Machine;
use crate::progress::Progress;
use crate::target::Target;

/// Runs every measurement of `plan`, writes the report and the chart, and returns the
/// backends measured (a server backend without its URL is skipped).
pub async fn run(plan: &Plan) -> anyhow::Result<Vec<Backend>> {
    let machine = Machine::probe();
    let mut targets = Vec::new();
    let mut skipped = Vec::new();
    for &backend in &plan.backends {
        match Target::from_env(backend)? {
            Ok(target) => targets.push(target),
            Err(reason) => skipped.push(reason),
        }
    }
    for reason in &skipped {
        eprintln!("{reason}");
    }
    if targets.is_empty() {
        bail!("no backend to measure");
    }
    let per_backend = plan.consumers.len() * plan.variants().len() * plan.rounds as usize;
    let progress = Progress::new((targets.len() * per_backend) as u64);

    let mut runs = Vec::new();
    for target in targets {
        target.create().await?;
        let measured = match target.backend() {
            Backend::Postgres => {
                bench::run_backend::<AsyncPgConnection>(&target, plan, &progress).await
            }
            Backend::Mysql => {
                bench::run_backend::<AsyncMysqlConnection>(&target, plan, &progress).await
            }
            Backend::Sqlite => bench::run_backend::<SqliteConn>(&target, plan, &progress).await,
        };
        // Clean up even after a failed measurement, but report the measurement's error.
        let removed = target.remove().await;
        runs.push(measured?);
        removed?;
    }
    progress.finish();

    report::write(&plan.output, plan, &machine, &runs, &skipped)?;
    chart::draw(&plan.chart, plan, &runs)?;
    eprintln!(
        "wrote {} and {}",
        plan.output.display(),
        plan.chart.display()
    );
    Ok(runs.iter().map(|run| run.backend).collect())
}
