//! One backend's measurements, in the order that keeps the comparisons fair.
//!
//! For each consumer count, every variant on an empty inbox runs back to back, so that
//! the ratios within a consumer count see the same machine state; with several rounds,
//! each round sweeps everything again. The pre-filled variants come last: their inbox
//! is loaded once per size, grown from the smallest size to the largest, and measured at
//! every consumer count, round after round. Where the backend's C client is at hand, its
//! reference rows run in each round after the variants on an empty inbox.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, ensure};
use diesel_inbox::testing::{TestDatabase, select_i64};

use diesel_async::{AsyncMysqlConnection, SimpleAsyncConnection};

use crate::backend::Backend;
use crate::cli::Plan;
use crate::cluster::{self, Cluster, Placement};
use crate::connection::{BenchConnection, connect};
use crate::probe::{self, ClusterProbe, Diagnostics, IndexShape, Probe, ServerInfo};
use crate::progress::Progress;
use crate::reference::ReferenceClient;
use crate::runner::{self, PRUNE_WINDOW, PRUNED_MARKERS_AGE_DAYS, PruneTask, Pruned, Run, Tally};
use crate::setup;
use crate::variant::{Script, Variant, count_label, reference_client};
use crate::workload::{ACCOUNTS, Workload, splitmix64};

/// One variant at one consumer count.
#[derive(Debug, Clone)]
pub struct Measurement {
    pub variant: Variant,
    pub consumers: usize,
    /// Where the consumers connected, on a cluster.
    pub placement: Option<Placement>,
    pub round: u32,
    pub deliveries: u64,
    pub run: Run,
    pub diagnostics: Diagnostics,
    /// What the prune beside the consumers did, for variant 8.
    pub pruned: Option<Pruned>,
}

impl Measurement {
    pub fn per_second(&self) -> f64 {
        self.deliveries as f64 / self.run.elapsed.as_secs_f64()
    }

    pub fn per_delivery(&self, total: i64) -> f64 {
        total as f64 / self.deliveries as f64
    }
}

/// Everything measured on one backend.
#[derive(Debug, Clone)]
pub struct BackendRun {
    pub backend: Backend,
    pub server: ServerInfo,
    pub measurements: Vec<Measurement>,
    pub prefilled: Vec<IndexShape>,
    /// The version of the C client that measured the reference rows, if any did.
    pub reference_client: Option<String>,
    pub elapsed: Duration,
}

impl BackendRun {
    /// Every round of one variant at one consumer count, slowest first.
    pub fn rounds(&self, variant: Variant, consumers: usize) -> Vec<&Measurement> {
        let mut rounds: Vec<&Measurement> = self
            .measurements
            .iter()
            .filter(|m| m.variant == variant && m.consumers == consumers)
            .collect();
        rounds.sort_by(|a, b| a.per_second().total_cmp(&b.per_second()));
        rounds
    }

    /// The median round (the slower middle one of an even count), which the report and
    /// the chart show, diagnostics included.
    pub fn find(&self, variant: Variant, consumers: usize) -> Option<&Measurement> {
        let rounds = self.rounds(variant, consumers);
        rounds.get(rounds.len().saturating_sub(1) / 2).copied()
    }

    /// The throughput of `variant` relative to `base`: the median over rounds of the
    /// ratio within each round. Variants of one round ran minutes apart at most, so a
    /// burst of other load that slows a whole round cancels out of its ratios.
    pub fn ratio(&self, variant: Variant, base: Variant, consumers: usize) -> Option<f64> {
        median(&self.ratios(variant, base, consumers))
    }

    /// The ratio of `variant` to `base` in each round, smallest first.
    pub fn ratios(&self, variant: Variant, base: Variant, consumers: usize) -> Vec<f64> {
        let mut ratios: Vec<f64> = self
            .rounds(variant, consumers)
            .into_iter()
            .filter_map(|m| {
                let paired = self.measurements.iter().find(|b| {
                    b.variant == base && b.consumers == consumers && b.round == m.round
                })?;
                Some(m.per_second() / paired.per_second())
            })
            .collect();
        ratios.sort_by(f64::total_cmp);
        ratios
    }
}

/// The middle of `sorted` (the smaller middle one of an even count), as the report takes
/// it everywhere.
pub fn median(sorted: &[f64]) -> Option<f64> {
    sorted.get(sorted.len().saturating_sub(1) / 2).copied()
}

/// Measures every variant of `plan` on `db`, and with `client` its reference rows.
pub async fn run_backend<C: BenchConnection>(
    db: &TestDatabase<C>,
    plan: &Plan,
    client: Option<&ReferenceClient>,
    progress: &Progress,
) -> anyhow::Result<BackendRun> {
    let began = Instant::now();
    let mut admin = connect(db).await?;
    setup::create_tables(&mut admin).await?;
    let server = probe::server_info(&mut admin).await?;
    let place = format!("{}, {}", C::BACKEND.name(), db.name());
    progress.note(format!("{place}: {}", server.version));
    let mut seed = seeds()?;

    let mut measurements = Vec::new();
    for (round, consumers) in plan.consumer_rounds() {
        for &variant in &plan.empty_inbox {
            setup::reset(&mut admin).await?;
            let workload = variant.workload(seed(), plan.messages);
            setup::pre_mark(&mut admin, &workload).await?;
            let step = Step {
                db,
                variant,
                consumers,
                round,
                workload,
                on: Consumers::Database,
            };
            measurements.push(step.measure(&mut admin, progress).await?);
        }
        if let Some(rows) = plan.prune {
            setup::reset(&mut admin).await?;
            let bar = progress.step(
                format!("{}: loading old markers to prune", C::BACKEND.name()),
                rows,
            );
            setup::prefill(&mut admin, 0, rows, PRUNED_MARKERS_AGE_DAYS, &bar).await?;
            progress.finish_step(
                bar,
                format!(
                    "{}: {} old markers loaded",
                    C::BACKEND.name(),
                    count_label(rows)
                ),
            );
            let variant = Variant::PruneUnderLoad { rows };
            let step = Step {
                db,
                variant,
                consumers,
                round,
                workload: variant.workload(seed(), plan.messages),
                on: Consumers::Database,
            };
            measurements.push(step.measure(&mut admin, progress).await?);
        }
        if let Some(client) = client {
            for script in plan.references_on(C::BACKEND) {
                setup::reset(&mut admin).await?;
                let reference = Reference {
                    client,
                    place: db.url(),
                    script,
                    consumers,
                    round,
                };
                measurements.push(
                    reference
                        .measure(&mut admin, plan.messages, progress)
                        .await?,
                );
            }
        }
    }

    let mut prefilled = Vec::new();
    let mut loaded = 0;
    setup::reset(&mut admin).await?;
    for &rows in &plan.prefill {
        let bar = progress.step(
            format!("{}: pre-filling the inbox", C::BACKEND.name()),
            rows - loaded,
        );
        let began = Instant::now();
        setup::prefill(&mut admin, loaded, rows, 0, &bar).await?;
        loaded = rows;
        let shape = probe::index_shape(&mut admin, rows).await;
        progress.finish_step(
            bar,
            format!(
                "{}: inbox pre-filled to {} rows in {:.1} s",
                C::BACKEND.name(),
                count_label(rows),
                began.elapsed().as_secs_f64()
            ),
        );
        prefilled.push(shape);
        for (round, consumers) in plan.consumer_rounds() {
            let variant = Variant::Prefilled { rows };
            let step = Step {
                db,
                variant,
                consumers,
                round,
                workload: variant.workload(seed(), plan.messages),
                on: Consumers::Database,
            };
            measurements.push(step.measure(&mut admin, progress).await?);
        }
    }
    Ok(BackendRun {
        backend: C::BACKEND,
        server,
        measurements,
        prefilled,
        reference_client: client.map(|client| client.version.clone()),
        elapsed: began.elapsed(),
    })
}

/// The workloads' seeds: message ids must differ between measurements, and from any
/// earlier run's.
fn seeds() -> anyhow::Result<impl FnMut() -> u64> {
    let epoch = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as u64;
    let mut measurement = 0;
    Ok(move || {
        measurement += 1;
        splitmix64(epoch ^ measurement)
    })
}

/// Everything measured on a Galera cluster.
#[derive(Debug, Clone)]
pub struct ClusterRun {
    /// The first node's version and settings, with the cluster's.
    pub server: ServerInfo,
    pub nodes: usize,
    pub measurements: Vec<Measurement>,
    pub elapsed: Duration,
}

impl ClusterRun {
    /// Every round of one variant at one consumer count and placement, slowest first.
    pub fn rounds(
        &self,
        variant: Variant,
        consumers: usize,
        placement: Placement,
    ) -> Vec<&Measurement> {
        let mut rounds: Vec<&Measurement> = self
            .measurements
            .iter()
            .filter(|m| {
                m.variant == variant && m.consumers == consumers && m.placement == Some(placement)
            })
            .collect();
        rounds.sort_by(|a, b| a.per_second().total_cmp(&b.per_second()));
        rounds
    }

    /// The median round, as [`BackendRun::find`] takes it.
    pub fn find(
        &self,
        variant: Variant,
        consumers: usize,
        placement: Placement,
    ) -> Option<&Measurement> {
        let rounds = self.rounds(variant, consumers, placement);
        rounds.get(rounds.len().saturating_sub(1) / 2).copied()
    }

    /// `(numerator, denominator)`'s throughput ratio within each round, smallest first: a
    /// variant or placement against another at one consumer count.
    pub fn ratios(
        &self,
        consumers: usize,
        numerator: (Variant, Placement),
        denominator: (Variant, Placement),
    ) -> Vec<f64> {
        let mut ratios: Vec<f64> = self
            .rounds(numerator.0, consumers, numerator.1)
            .into_iter()
            .filter_map(|m| {
                let paired = self
                    .rounds(denominator.0, consumers, denominator.1)
                    .into_iter()
                    .find(|b| b.round == m.round)?;
                Some(m.per_second() / paired.per_second())
            })
            .collect();
        ratios.sort_by(f64::total_cmp);
        ratios
    }
}

/// Measures the cluster variants of `plan` on `db`, created through the cluster's first
/// node: in each round, at each consumer count, each variant with every consumer on the
/// first node and spread over every node, back to back (in alternating order from round
/// to round), so that the two placements see the same machine state.
pub async fn run_cluster(
    db: &TestDatabase<AsyncMysqlConnection>,
    cluster: &Cluster,
    plan: &Plan,
    progress: &Progress,
) -> anyhow::Result<ClusterRun> {
    let began = Instant::now();
    let mut admin = connect(db).await?;
    // The checks read on the first node what consumers committed on any node.
    admin
        .batch_execute("SET SESSION wsrep_sync_wait = 1")
        .await?;
    setup::create_tables(&mut admin).await?;
    let mut server = probe::server_info(&mut admin).await?;
    server
        .settings
        .extend(probe::cluster_settings(&mut admin).await?);
    progress.note(format!(
        "{}, {}: {}",
        cluster::NAME,
        db.name(),
        server.version
    ));
    let urls: Vec<String> = (0..cluster.nodes())
        .map(|n| cluster.node_url(n, db.name()))
        .collect();
    let mut watch = Vec::with_capacity(cluster.nodes());
    for n in 0..cluster.nodes() {
        watch.push(cluster.causal(n, db.name()).await?);
    }
    let mut seed = seeds()?;
    let mut measurements = Vec::new();
    for (round, consumers) in plan.consumer_rounds() {
        for &variant in &plan.cluster {
            for placement in Placement::order(round) {
                setup::reset(&mut admin).await?;
                cluster::wait_for_every_node(&mut watch, ACCOUNTS).await?;
                let step = Step {
                    db,
                    variant,
                    consumers,
                    round,
                    workload: variant.workload(seed(), plan.messages),
                    on: Consumers::Nodes {
                        urls: &urls,
                        placement,
                        watch: &mut watch,
                    },
                };
                measurements.push(step.measure(&mut admin, progress).await?);
            }
        }
    }
    Ok(ClusterRun {
        server,
        nodes: cluster.nodes(),
        measurements,
        elapsed: began.elapsed(),
    })
}

/// One measurement to take.
struct Step<'a, C: BenchConnection> {
    db: &'a TestDatabase<C>,
    variant: Variant,
    consumers: usize,
    round: u32,
    workload: Workload,
    on: Consumers<'a>,
}

/// Where a step's consumers connect.
enum Consumers<'a> {
    /// The run's database.
    Database,
    /// The nodes of a cluster, each by its URL of the run's database, as `placement`
    /// spreads them; `watch` holds a causal connection to each node for the probe and
    /// the checks.
    Nodes {
        urls: &'a [String],
        placement: Placement,
        watch: &'a mut [AsyncMysqlConnection],
    },
}

impl<C: BenchConnection> Step<'_, C> {
    async fn measure(mut self, admin: &mut C, progress: &Progress) -> anyhow::Result<Measurement> {
        let place = match &self.on {
            Consumers::Database => C::BACKEND.name().to_owned(),
            Consumers::Nodes {
                urls, placement, ..
            } => format!("{}, {}", cluster::NAME, placement.label(urls.len())),
        };
        let name = step_name(&place, self.consumers, self.variant);
        setup::checkpoint(admin).await?;
        let mut connections = Vec::with_capacity(self.consumers);
        for consumer in 0..self.consumers {
            connections.push(match &self.on {
                Consumers::Database => connect(self.db).await?,
                Consumers::Nodes {
                    urls, placement, ..
                } => {
                    let url = &urls[placement.node(consumer, urls.len())];
                    C::establish(url)
                        .await
                        .with_context(|| format!("{name}: connect to {url}"))?
                }
            });
        }
        let credits_before = setup::credits(admin).await?;
        let cluster_probe = match &mut self.on {
            Consumers::Database => None,
            Consumers::Nodes { watch, .. } => Some(ClusterProbe::start(watch).await?),
        };
        let probe = Probe::start(self.db, admin, &mut connections).await?;
        let bar = progress.step(name.clone(), self.workload.deliveries);
        let prune = match self.variant {
            Variant::PruneUnderLoad { rows } => Some((rows, PruneTask::start(self.db))),
            _ => None,
        };
        let driven = runner::drive(connections, self.variant, self.workload, &bar).await;
        // The pruner is stopped even after the consumers failed, so that it is not still
        // deleting when the tables are reset.
        let pruning = match prune {
            Some((rows, prune)) => {
                until_a_prune(admin, rows).await;
                Some((rows, prune.stop().await))
            }
            None => None,
        };
        let (run, connections) = driven?;
        let mut diagnostics = probe.finish(admin, connections).await?;
        if let (Some(cluster_probe), Consumers::Nodes { watch, .. }) = (cluster_probe, &mut self.on)
        {
            diagnostics.nodes = cluster_probe.finish(watch).await?;
        }
        let credited = setup::credits(admin).await? - credits_before;
        self.check(&run, credited)?;
        // Every node must hold every credit, not only the one the checks read.
        for (n, node) in diagnostics.nodes.iter().enumerate() {
            ensure!(
                node.credits - credits_before == credited,
                "{name}: node {} holds {} credits of this measurement, node 1 {credited}",
                n + 1,
                node.credits - credits_before,
            );
        }
        let pruned = match pruning {
            Some((rows, elapsed)) => Some(self.check_pruned(admin, rows, elapsed).await?),
            None => None,
        };
        let placement = match self.on {
            Consumers::Database => None,
            Consumers::Nodes { placement, .. } => Some(placement),
        };
        let measurement = Measurement {
            variant: self.variant,
            consumers: self.consumers,
            placement,
            round: self.round,
            deliveries: self.workload.deliveries,
            run,
            diagnostics,
            pruned,
        };
        let pruning = pruned.map_or_else(String::new, |pruned| {
            format!(
                "; prune deleted {} markers in {:.1} s",
                pruned.rows,
                pruned.elapsed.as_secs_f64()
            )
        });
        progress.finish_step(
            bar,
            format!("{name}: {:.0} msg/s{pruning}", measurement.per_second()),
        );
        progress.measured();
        Ok(measurement)
    }

    /// Each variant must have done what it claims, or its figure means nothing: every
    /// new message processed once and credited once (`credited` is what the balances
    /// grew by), and every redelivery found as a duplicate.
    fn check(&self, run: &Run, credited: i64) -> anyhow::Result<()> {
        let duplicates = self.workload.duplicates();
        let processed = self.workload.deliveries - duplicates;
        ensure!(
            run.tally.processed == processed && run.tally.duplicates == duplicates,
            "{}: expected {processed} processed and {duplicates} duplicates, got {} and {}",
            self.variant.label(),
            run.tally.processed,
            run.tally.duplicates,
        );
        ensure!(
            credited == processed as i64,
            "{}: {processed} messages processed, but the balances grew by {credited}",
            self.variant.label(),
        );
        Ok(())
    }

    /// Variant 8's pruner must have deleted some of the `rows` old markers and nothing
    /// else: beside the old markers left, there is one marker per message processed.
    async fn check_pruned(
        &self,
        admin: &mut C,
        rows: u64,
        elapsed: Duration,
    ) -> anyhow::Result<Pruned> {
        let old = u64::try_from(setup::markers_older_than(admin, PRUNE_WINDOW).await?)?;
        let recent = setup::markers(admin).await? - old as i64;
        ensure!(
            old < rows && recent == self.workload.deliveries as i64,
            "{}: the pruner left {old} of {rows} old markers, and {recent} recent markers for \
             {} messages",
            self.variant.label(),
            self.workload.deliveries,
        );
        Ok(Pruned {
            rows: rows - old,
            elapsed,
        })
    }
}

/// Waits, ten seconds at most, until fewer than `rows` old markers are left. A short run
/// (the smoke run's 40 messages, on a busy machine) can end before variant 8's pruner
/// has connected and deleted its first batch, which its check requires; the consumers'
/// figure is taken already. A failed read ends the wait: the pruner must stop anyway.
async fn until_a_prune<C: BenchConnection>(admin: &mut C, rows: u64) {
    for _ in 0..100 {
        match setup::markers_older_than(admin, PRUNE_WINDOW).await {
            Ok(old) if u64::try_from(old).is_ok_and(|old| old >= rows) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => return,
        }
    }
}

/// One reference measurement by a C client.
struct Reference<'a> {
    client: &'a ReferenceClient,
    /// The run's database: a URL (PostgreSQL's schema in its options), or SQLite's path.
    place: &'a str,
    script: Script,
    consumers: usize,
    round: u32,
}

impl Reference<'_> {
    /// Runs the script with one client per consumer, each taking an equal share of
    /// `messages` (at least one transaction), after the checkpoint a [`Step`] takes too.
    /// Like a variant's, the measurement counts only once every transaction has credited
    /// its accounts (and inserted its markers).
    async fn measure<C: BenchConnection>(
        self,
        admin: &mut C,
        messages: u64,
        progress: &Progress,
    ) -> anyhow::Result<Measurement> {
        let variant = Variant::Reference {
            backend: C::BACKEND,
            script: self.script,
        };
        let name = step_name(C::BACKEND.name(), self.consumers, variant);
        setup::checkpoint(admin).await?;
        let per_transaction = self.script.messages();
        let per_client = (messages / self.consumers as u64 / per_transaction).max(1);
        let transactions = per_client * self.consumers as u64;
        let deliveries = transactions * per_transaction;
        let bar = progress.step(name.clone(), deliveries);
        bar.set_message(format!(
            "({} reports at the end)",
            reference_client(C::BACKEND)
        ));
        let before = setup::credits(admin).await?;
        let elapsed = self
            .client
            .run(self.place, self.script, self.consumers, per_client)
            .await
            .with_context(|| name.clone())?;
        let credits = setup::credits(admin).await? - before;
        let markers = select_i64(admin, "SELECT COUNT(*) FROM inbox").await?;
        let expected_markers = if self.script.marks() {
            deliveries as i64
        } else {
            0
        };
        ensure!(
            credits == deliveries as i64 && markers == expected_markers,
            "{name}: expected {deliveries} credits and {expected_markers} markers, \
             got {credits} and {markers}"
        );
        let measurement = Measurement {
            variant,
            consumers: self.consumers,
            placement: None,
            round: self.round,
            deliveries,
            run: Run {
                elapsed,
                tally: Tally {
                    processed: deliveries,
                    ..Tally::default()
                },
                statements: transactions * self.script.statements(),
            },
            // The client's connections are not the harness's: there is nothing to probe.
            diagnostics: Diagnostics::default(),
            pruned: None,
        };
        progress.finish_step(
            bar,
            format!("{name}: {:.0} msg/s", measurement.per_second()),
        );
        progress.measured();
        Ok(measurement)
    }
}

/// `PostgreSQL, 8 consumer(s), (4) #[idempotent]`: a measurement's name in progress
/// lines and errors.
fn step_name(place: &str, consumers: usize, variant: Variant) -> String {
    format!("{place}, {consumers} consumer(s), {}", variant.label())
}
