//! The benchmark harness of diesel-inbox: what exactly-once costs, measured side by side
//! with the alternatives on PostgreSQL, MySQL/MariaDB and SQLite in one run, written to
//! a Markdown report and an SVG chart. Run it with `cargo run --release -p inbox-bench`;
//! `--help` lists the options.

// Each layer uses only the layers before it.
//
// Plan: what to measure, resolved from the command line.
mod backend;
pub mod cli;
mod variant;
mod workload;
// Run: the databases, their connections and the handlers that run on them.
mod connection;
mod handlers;
mod pgbench;
mod runner;
mod setup;
mod target;
// Measure: a backend's measurements in order, and what the machine and server did.
mod bench;
mod machine;
mod probe;
mod progress;
// Report: the Markdown report and the chart.
mod chart;
mod report;

use anyhow::bail;
use diesel_inbox::testing::TestDatabase;

pub use backend::Backend;
pub use cli::{Args, Plan};
pub use variant::{Script, Variant};

use crate::bench::BackendRun;
use crate::connection::BenchConnection;
use crate::machine::Machine;
use crate::pgbench::Pgbench;
use crate::progress::Progress;
use crate::target::Target;

/// Runs every measurement of `plan`, writes the report and the chart, and returns the
/// backends measured (a server backend without its URL is skipped, and so are the pgbench
/// reference rows without pgbench).
pub async fn run(plan: &Plan) -> anyhow::Result<Vec<Backend>> {
    let machine = Machine::probe();
    let mut targets = Vec::new();
    let mut skipped = Vec::new();
    for &backend in &plan.backends {
        match Target::from_env(backend) {
            Ok(target) => targets.push(target),
            Err(reason) => skipped.push(reason),
        }
    }
    // The pgbench reference rows need PostgreSQL.
    let mut pgbench = None;
    if targets
        .iter()
        .any(|target| target.backend() == Backend::Postgres)
    {
        match Pgbench::find() {
            Ok(found) => pgbench = Some(found),
            Err(reason) => skipped.push(reason),
        }
    }
    for reason in &skipped {
        eprintln!("{reason}");
    }
    if targets.is_empty() {
        bail!("no backend to measure");
    }
    let sweeps = plan.consumers.len() * plan.rounds as usize;
    let references = pgbench.as_ref().map_or(0, |_| plan.references.len());
    let measurements = targets.len() * plan.variants().len() * sweeps + references * sweeps;
    let progress = Progress::new(measurements as u64);

    let mut runs = Vec::new();
    for target in targets {
        let name = target::place_name();
        runs.push(match target {
            Target::Postgres(url) => {
                let db = TestDatabase::postgres(&url, &name).await?;
                measure(db, plan, pgbench.as_ref(), &progress).await?
            }
            Target::Mysql(url) => {
                let db = TestDatabase::mysql(&url, &name).await?;
                measure(db, plan, None, &progress).await?
            }
            Target::Sqlite => {
                measure(TestDatabase::sqlite(&name).await?, plan, None, &progress).await?
            }
        });
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

/// Measures on `db`, then drops it, also after a failed measurement, whose error it
/// reports first.
async fn measure<C: BenchConnection>(
    db: TestDatabase<C>,
    plan: &Plan,
    pgbench: Option<&Pgbench>,
    progress: &Progress,
) -> anyhow::Result<BackendRun> {
    let measured = bench::run_backend(&db, plan, pgbench, progress).await;
    let removed = db.cleanup().await;
    let run = measured?;
    removed?;
    Ok(run)
}
