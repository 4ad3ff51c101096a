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
// Run: the databases, their connections and the handlers that run on them, and the
// C clients that send the reference rows.
mod cluster;
mod connection;
mod handlers;
mod reference;
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
pub use variant::{Script, Variant, reference_client};

use crate::bench::BackendRun;
use crate::cluster::Cluster;
use crate::connection::BenchConnection;
use crate::machine::Machine;
use crate::progress::Progress;
use crate::reference::ReferenceClient;
use crate::target::Target;

/// What a run measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Measured {
    pub backends: Vec<Backend>,
    /// Whether the Galera cluster was.
    pub cluster: bool,
}

/// Runs every measurement of `plan`, writes the report and the chart, and returns what it
/// measured (a server backend or cluster without its URL is skipped, and so are a
/// backend's reference rows without its C client).
pub async fn run(plan: &Plan) -> anyhow::Result<Measured> {
    let machine = Machine::probe();
    let mut targets = Vec::new();
    let mut skipped = Vec::new();
    for &backend in &plan.backends {
        match Target::from_env(backend) {
            Ok(target) => targets.push(target),
            Err(reason) => skipped.push(reason),
        }
    }
    let mut cluster = None;
    if !plan.cluster.is_empty() {
        match Cluster::from_env() {
            Ok(found) => cluster = Some(found),
            Err(reason) => skipped.push(reason),
        }
    }
    let mut clients = Vec::new();
    for target in &targets {
        let backend = target.backend();
        if plan.references_on(backend).is_empty() {
            clients.push(None);
            continue;
        }
        match ReferenceClient::find(backend) {
            Ok(found) => clients.push(Some(found)),
            Err(reason) => {
                skipped.push(reason);
                clients.push(None);
            }
        }
    }
    for reason in &skipped {
        eprintln!("{reason}");
    }
    if targets.is_empty() && cluster.is_none() {
        bail!("no backend to measure");
    }
    let sweeps = plan.consumers.len() * plan.rounds as usize;
    let references: usize = targets
        .iter()
        .zip(&clients)
        .filter(|(_, client)| client.is_some())
        .map(|(target, _)| plan.references_on(target.backend()).len())
        .sum();
    // The cluster measures each variant twice: on one node, and on every node.
    let on_cluster = if cluster.is_some() {
        2 * plan.cluster.len() * sweeps
    } else {
        0
    };
    let measurements =
        targets.len() * plan.variants().len() * sweeps + references * sweeps + on_cluster;
    let progress = Progress::new(measurements as u64);

    let mut runs = Vec::new();
    for (target, client) in targets.into_iter().zip(&clients) {
        let name = target::place_name();
        let client = client.as_ref();
        runs.push(match target {
            Target::Postgres(url) => {
                let db = TestDatabase::postgres(&url, &name).await?;
                measure(db, plan, client, &progress).await?
            }
            Target::Mysql(url) => {
                let db = TestDatabase::mysql(&url, &name).await?;
                measure(db, plan, client, &progress).await?
            }
            Target::Sqlite => {
                measure(TestDatabase::sqlite(&name).await?, plan, client, &progress).await?
            }
        });
    }
    let mut cluster_run = None;
    if let Some(cluster) = &cluster {
        let db = TestDatabase::mysql(&cluster.admin_url, &target::place_name()).await?;
        let measured = bench::run_cluster(&db, cluster, plan, &progress).await;
        let removed = db.cleanup().await;
        cluster_run = Some(measured?);
        removed?;
    }
    progress.finish();

    report::write(
        &plan.output,
        plan,
        &machine,
        &runs,
        cluster_run.as_ref(),
        &skipped,
    )?;
    chart::draw(&plan.chart, plan, &runs)?;
    eprintln!(
        "wrote {} and {}",
        plan.output.display(),
        plan.chart.display()
    );
    Ok(Measured {
        backends: runs.iter().map(|run| run.backend).collect(),
        cluster: cluster_run.is_some(),
    })
}

/// Measures on `db`, then drops it, also after a failed measurement, whose error it
/// reports first.
async fn measure<C: BenchConnection>(
    db: TestDatabase<C>,
    plan: &Plan,
    client: Option<&ReferenceClient>,
    progress: &Progress,
) -> anyhow::Result<BackendRun> {
    let measured = bench::run_backend(&db, plan, client, progress).await;
    let removed = db.cleanup().await;
    let run = measured?;
    removed?;
    Ok(run)
}
