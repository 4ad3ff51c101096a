//! BENCHMARKS.md: the figures, the targets checked against them, and what the
//! machine, the build and the servers were.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;

use crate::backend::Backend;
use crate::bench::{self, BackendRun, ClusterRun, Measurement};
use crate::cli::Plan;
use crate::cluster::{self, Placement};
use crate::machine::Machine;
use crate::variant::{BatchSize, Script, Variant, count_label, reference_client};

/// The consumer count the targets are stated at.
const TARGET_CONSUMERS: usize = 8;

/// A ratio the issue asks for: `numerator / denominator >= at_least`, on PostgreSQL.
struct Goal {
    numerator: Variant,
    denominator: Variant,
    at_least: f64,
}

/// The targets, with the largest pre-filled inbox standing in for 10M rows.
fn goals(plan: &Plan) -> Vec<Goal> {
    let mut goals = vec![
        Goal {
            numerator: Variant::Idempotent,
            denominator: Variant::Bare,
            at_least: 0.80,
        },
        Goal {
            numerator: Variant::Idempotent,
            denominator: Variant::HandWritten,
            at_least: 0.97,
        },
        Goal {
            numerator: Variant::Duplicates { percent: 100 },
            denominator: Variant::Idempotent,
            at_least: 3.0,
        },
    ];
    if let Some(&rows) = plan.prefill.last() {
        goals.push(Goal {
            numerator: Variant::Prefilled { rows },
            denominator: Variant::Idempotent,
            at_least: 0.9,
        });
    }
    goals.push(Goal {
        numerator: Variant::Idempotent,
        denominator: Variant::PeerFlow,
        at_least: 1.5,
    });
    if let Some(rows) = plan.prune {
        goals.push(Goal {
            numerator: Variant::PruneUnderLoad { rows },
            denominator: Variant::Idempotent,
            at_least: 0.8,
        });
        // The same inbox without the pruner: what pruning costs, apart from what an
        // inbox of that size does.
        if plan.prefill.contains(&rows) {
            goals.push(Goal {
                numerator: Variant::PruneUnderLoad { rows },
                denominator: Variant::Prefilled { rows },
                at_least: 0.8,
            });
        }
    }
    goals.extend([
        Goal {
            numerator: Variant::Batch(BatchSize::Fifty),
            denominator: Variant::Idempotent,
            at_least: 8.0,
        },
        Goal {
            numerator: Variant::Batch(BatchSize::Fifty),
            denominator: Variant::BareBatch(BatchSize::Fifty),
            at_least: 0.35,
        },
    ]);
    goals
}

pub fn write(
    path: &Path,
    plan: &Plan,
    machine: &Machine,
    runs: &[BackendRun],
    cluster: Option<&ClusterRun>,
    skipped: &[String],
) -> anyhow::Result<()> {
    std::fs::write(path, render(plan, machine, runs, cluster, skipped))
        .with_context(|| format!("write {}", path.display()))
}

fn render(
    plan: &Plan,
    machine: &Machine,
    runs: &[BackendRun],
    cluster: Option<&ClusterRun>,
    skipped: &[String],
) -> String {
    let mut out = String::new();
    let w = &mut out;
    line(w, "# Benchmarks");
    line(w, "");
    line(
        w,
        "What exactly-once costs: `#[idempotent]` side by side with its alternatives, on \
         each backend, at each consumer count. Messages per second are deliveries handled \
         per second of wall time; ratios compare variants **within this run only**, so \
         rerun the command below rather than mixing figures from different runs.",
    );
    line(w, "");
    if plan.smoke {
        line(
            w,
            "> **Smoke run.** Few deliveries per measurement: this proves the harness \
             works, and its figures mean nothing.",
        );
        line(w, "");
    }
    if !machine.optimized {
        line(
            w,
            "> **Debug build.** The harness was not built with `--release`; the client's \
             CPU cost is inflated.",
        );
        line(w, "");
    }
    render_setup(w, plan, machine, runs, cluster, skipped);
    if !runs.is_empty() {
        render_goals(w, plan, runs);
    }
    for run in runs {
        render_backend(w, plan, run);
    }
    if let Some(cluster) = cluster {
        render_cluster(w, plan, cluster);
    }
    render_legend(w);
    out
}

fn line(out: &mut String, text: &str) {
    out.push_str(text);
    out.push('\n');
}

fn render_setup(
    w: &mut String,
    plan: &Plan,
    machine: &Machine,
    runs: &[BackendRun],
    cluster: Option<&ClusterRun>,
    skipped: &[String],
) {
    line(w, "## How it was run");
    line(w, "");
    let _ = writeln!(w, "- Date: {}", machine.date);
    let _ = writeln!(w, "- Command: `{}`", plan.command);
    let unknown = || "unknown".to_owned();
    let _ = writeln!(
        w,
        "- Machine: {} cores ({}), {} memory, Linux {} ({}); load average {} at the start, \
         {} at the end. The harness, its consumers and the servers share these cores, and \
         other work may have been running: treat differences of a few percent as noise.",
        machine.cores,
        machine.cpu.clone().unwrap_or_else(unknown),
        machine.memory.clone().unwrap_or_else(unknown),
        machine.kernel.clone().unwrap_or_else(unknown),
        machine.os.clone().unwrap_or_else(unknown),
        machine.load.clone().unwrap_or_else(unknown),
        crate::machine::load_average().unwrap_or_else(unknown),
    );
    let _ = writeln!(
        w,
        "- Build: {}, {} profile; diesel-inbox {} at {}",
        machine.rustc,
        if machine.optimized {
            "release"
        } else {
            "debug"
        },
        env!("CARGO_PKG_VERSION"),
        machine.revision.clone().unwrap_or_else(unknown),
    );
    for run in runs {
        let settings: Vec<String> = run
            .server
            .settings
            .iter()
            .map(|(name, value)| format!("`{name}` = {value}"))
            .collect();
        let reference = run
            .reference_client
            .as_ref()
            .map_or_else(String::new, |version| {
                let rows: Vec<String> = plan
                    .references_on(run.backend)
                    .into_iter()
                    .map(|script| {
                        short(Variant::Reference {
                            backend: run.backend,
                            script,
                        })
                    })
                    .collect();
                format!("; reference rows {} by {version}", rows.join(", "))
            });
        let _ = writeln!(
            w,
            "- {}: {} ({}); measured in {:.0} s{reference}",
            run.backend.name(),
            run.server.version,
            settings.join(", "),
            run.elapsed.as_secs_f64()
        );
    }
    if let Some(cluster) = cluster {
        let settings: Vec<String> = cluster
            .server
            .settings
            .iter()
            .map(|(name, value)| format!("`{name}` = {value}"))
            .collect();
        let _ = writeln!(
            w,
            "- {}, {} nodes: {} ({}); measured in {:.0} s",
            cluster::NAME,
            cluster.nodes,
            cluster.server.version,
            settings.join(", "),
            cluster.elapsed.as_secs_f64()
        );
    }
    for reason in skipped {
        let _ = writeln!(w, "- Not measured: {reason}");
    }
    if plan.rounds > 1 {
        let _ = writeln!(
            w,
            "- Rounds: every measurement was taken {} times, each round sweeping all \
             variants. Tables and chart give the median round (its diagnostics included) \
             and the range of all rounds; ratios are the median of the ratios within each \
             round, so a burst of other load that slows a whole round cancels out.",
            plan.rounds
        );
    }
    let _ = writeln!(
        w,
        "- Workload: {} deliveries per measurement, each a credit `UPDATE accounts SET \
         balance = balance + $1 WHERE id = $2` on one of 10,000 accounts; message ids are \
         random UUIDs. Consumers: {}, each a tokio task with its own connection, taking \
         deliveries from a shared counter; the clock runs from the moment all are connected \
         until the last delivery is handled; a batch row takes the next run of consecutive \
         deliveries at once. Transient errors (serialization failures, deadlocks, \
         `SQLITE_BUSY`) are retried at once and counted. Each measurement checks that every \
         new message was processed and credited once.",
        plan.messages,
        plan.consumers
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    line(
        w,
        "- Each measurement on an empty inbox starts from an emptied inbox and a checkpoint. \
         The pre-filled inbox (7) is bulk-loaded once per size with generated UUID-shaped \
         ids (the unique index dropped and rebuilt around the load, then VACUUM/ANALYZE and \
         a checkpoint), and grown from the smallest size to the largest.",
    );
    line(w, "");
}

fn render_goals(w: &mut String, plan: &Plan, runs: &[BackendRun]) {
    let _ = writeln!(w, "## Targets (PostgreSQL, {TARGET_CONSUMERS} consumers)");
    line(w, "");
    let Some(postgres) = runs.iter().find(|run| run.backend == Backend::Postgres) else {
        line(w, "PostgreSQL was not measured in this run.");
        line(w, "");
        return;
    };
    line(w, "| target | measured | verdict | what bounds it |");
    line(w, "|---|---|---|---|");
    for goal in goals(plan) {
        let target = format!(
            "{} / {} ≥ {}",
            short(goal.numerator),
            short(goal.denominator),
            goal.at_least
        );
        let pair = (
            postgres.find(goal.numerator, TARGET_CONSUMERS),
            postgres.find(goal.denominator, TARGET_CONSUMERS),
        );
        let (Some(numerator), Some(denominator)) = pair else {
            let _ = writeln!(w, "| {target} | not measured | | |");
            continue;
        };
        let measured = measured_ratio(postgres, numerator, denominator);
        let verdict = verdict(&measured.rounds, measured.median, goal.at_least);
        let _ = writeln!(
            w,
            "| {target} | {} | {verdict} | {}; {} |",
            measured.text,
            profile(numerator),
            profile(denominator),
        );
    }
    line(w, "");
    line(
        w,
        "A verdict is the median round's; where the rounds disagree it says how many \
         rounds agree with it, and the difference from the target is within what this \
         machine varies from one round to the next.",
    );
    line(w, "");
    // What the database allows, to read the library's ratios against.
    for comparison in &COMPARISONS {
        let [marker, bare] = comparison.reference.map(|script| Variant::Reference {
            backend: Backend::Postgres,
            script,
        });
        let reference = match (
            postgres.find(marker, TARGET_CONSUMERS),
            postgres.find(bare, TARGET_CONSUMERS),
        ) {
            (Some(marker), Some(bare)) => measured_ratio(postgres, marker, bare).text,
            _ => "not measured".to_owned(),
        };
        let [numerator, denominator] = comparison.library;
        let _ = writeln!(
            w,
            "Reference for {} / {}: {} / {}, {} sent by pgbench from C in this run (less \
             the `SELECT 1` in COMMIT's round trip): {reference}.",
            short(numerator),
            short(denominator),
            short(marker),
            short(bare),
            comparison.statements,
        );
        line(w, "");
    }
}

/// A ratio of two of the harness's variants beside the ratio of the reference scripts
/// that send the same statements.
struct Comparison {
    /// The library's variant, and the one without the inbox.
    library: [Variant; 2],
    /// The scripts with and without the markers.
    reference: [Script; 2],
    /// What the scripts send, as the report says it.
    statements: &'static str,
}

const COMPARISONS: [Comparison; 2] = [
    Comparison {
        library: [Variant::Idempotent, Variant::Bare],
        reference: [Script::MarkerInsert, Script::Bare],
        statements: "the same statements",
    },
    Comparison {
        library: [
            Variant::Batch(Script::BATCH),
            Variant::BareBatch(Script::BATCH),
        ],
        reference: [Script::MarkerBatch, Script::BareBatch],
        statements: "the same batches",
    },
];

/// `met` or `**missed**` as the median round's ratio is, adding how many rounds agree
/// when not all of them do.
fn verdict(round_ratios: &[f64], median: f64, at_least: f64) -> String {
    let rounds = round_ratios.len();
    let met = round_ratios
        .iter()
        .filter(|&&ratio| ratio >= at_least)
        .count();
    let (word, agreeing) = if median >= at_least {
        ("met", met)
    } else {
        ("**missed**", rounds - met)
    };
    if agreeing == rounds {
        word.to_owned()
    } else {
        format!("{word} in {agreeing} of {rounds} rounds")
    }
}

/// The ratio of two variants within each round, as [`measured_ratio`] reads it.
struct MeasuredRatio {
    /// Each round's ratio, smallest first.
    rounds: Vec<f64>,
    median: f64,
    /// The median with the rounds' spread and the median rounds' msg/s.
    text: String,
}

/// The ratio of two measurements' variants at their consumer count, computed as for
/// the table.
fn measured_ratio(
    run: &BackendRun,
    numerator: &Measurement,
    denominator: &Measurement,
) -> MeasuredRatio {
    let rounds = run.ratios(numerator.variant, denominator.variant, numerator.consumers);
    let median = bench::median(&rounds).expect("both variants were measured");
    let spread = match (rounds.first(), rounds.last()) {
        (Some(low), Some(high)) if rounds.len() > 1 => {
            format!("rounds {low:.2}–{high:.2}; ")
        }
        _ => String::new(),
    };
    let text = format!(
        "{median:.2} ({spread}{:.0} / {:.0} msg/s)",
        numerator.per_second(),
        denominator.per_second(),
    );
    MeasuredRatio {
        rounds,
        median,
        text,
    }
}

/// The variant's number and, where it has one, its parameter: `(4)`, `(5, 100%)`.
fn short(variant: Variant) -> String {
    let number = variant.number();
    match variant {
        Variant::Duplicates { percent } => format!("({number}, {percent}% dups)"),
        Variant::Prefilled { rows } | Variant::PruneUnderLoad { rows } => {
            format!("({number}, {})", count_label(rows))
        }
        _ => format!("({number})"),
    }
}

/// A measurement's bottleneck figures in one phrase.
fn profile(m: &Measurement) -> String {
    let mut parts = vec![format!(
        "{} {:.1} stmts",
        short(m.variant),
        m.per_delivery(m.run.statements as i64)
    )];
    if let Some(flushes) = m.diagnostics.log_flushes {
        parts.push(format!("{:.2} fsyncs", m.per_delivery(flushes)));
    }
    let cpu = [m.diagnostics.client_cpu, m.diagnostics.server_cpu]
        .into_iter()
        .map(|cpu| cpu_per_delivery(m, cpu))
        .sum::<Option<f64>>();
    if let Some(cpu) = cpu {
        parts.push(format!("{cpu:.0} µs CPU"));
    }
    if let Some((event, share)) = top_waits(m).into_iter().next() {
        parts.push(format!("{event} {share:.0}%"));
    }
    parts.join(", ")
}

/// Wait events by share of samples, largest first.
fn top_waits(m: &Measurement) -> Vec<(String, f64)> {
    let total: u64 = m.diagnostics.waits.values().sum();
    let mut shares: Vec<(String, f64)> = m
        .diagnostics
        .waits
        .iter()
        .map(|(event, &count)| (event.clone(), 100.0 * count as f64 / total as f64))
        .collect();
    shares.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    shares
}

fn render_backend(w: &mut String, plan: &Plan, run: &BackendRun) {
    let _ = writeln!(w, "## {}", run.backend.name());
    line(w, "");
    // With several rounds, msg/s is the median round's and the range shows the spread.
    let ranged = plan.rounds > 1;
    let mut head = vec!["consumers", "variant", "msg/s"];
    if ranged {
        head.push("range");
    }
    head.extend([
        "vs (1)",
        "statements/msg",
        "retries",
        "log fsyncs/msg",
        "log KiB/msg",
        "CPU µs/msg harness",
        "CPU µs/msg server",
        "backend time (sampled)",
    ]);
    table_row(w, head.iter().map(|cell| cell.to_string()));
    // Figures right-aligned; the variant and the wait events left-aligned.
    let rule = (0..head.len()).map(|column| {
        let left = column == 1 || column == head.len() - 1;
        (if left { "---" } else { "---:" }).to_owned()
    });
    table_row(w, rule);
    // A backend's reference rows are found where its C client was at hand.
    let variants: Vec<Variant> = plan
        .variants()
        .into_iter()
        .chain(
            plan.references_on(run.backend)
                .into_iter()
                .map(|script| Variant::Reference {
                    backend: run.backend,
                    script,
                }),
        )
        .collect();
    for &consumers in &plan.consumers {
        for &variant in &variants {
            let Some(m) = run.find(variant, consumers) else {
                continue;
            };
            let mut cells = vec![
                consumers.to_string(),
                variant.label(),
                thousands(m.per_second()),
            ];
            if ranged {
                let rounds = run.rounds(variant, consumers);
                let (slowest, fastest) = (rounds[0], rounds[rounds.len() - 1]);
                cells.push(format!(
                    "{}–{}",
                    thousands(slowest.per_second()),
                    thousands(fastest.per_second())
                ));
            }
            let waits: Vec<String> = top_waits(m)
                .into_iter()
                .take(3)
                .map(|(event, share)| format!("{event} {share:.0}%"))
                .collect();
            let diagnostics = &m.diagnostics;
            cells.extend([
                optional(run.ratio(variant, Variant::Bare, consumers), 2),
                format!("{:.2}", m.per_delivery(m.run.statements as i64)),
                m.run.tally.retries.to_string(),
                optional(diagnostics.log_flushes.map(|v| m.per_delivery(v)), 2),
                optional(diagnostics.log_bytes.map(|v| m.per_delivery(v) / 1024.0), 2),
                optional(cpu_per_delivery(m, diagnostics.client_cpu), 0),
                optional(cpu_per_delivery(m, diagnostics.server_cpu), 0),
                waits.join(", "),
            ]);
            table_row(w, cells);
        }
    }
    line(w, "");
    render_pruned(w, plan, run);
    render_reference(w, run);
    if !run.prefilled.is_empty() {
        line(w, "The pre-filled inbox's unique index:");
        line(w, "");
        for shape in &run.prefilled {
            let size = shape.bytes.map_or_else(
                || "size unknown".to_owned(),
                |bytes| format!("{:.0} MiB", bytes as f64 / 1024.0 / 1024.0),
            );
            let levels = shape
                .levels
                .map_or_else(String::new, |levels| format!(", {levels} B-tree levels"));
            let _ = writeln!(w, "- {} rows: {size}{levels}", count_label(shape.rows));
        }
        line(w, "");
    }
}

/// The library's ratios at the target's consumer count beside what the backend's C
/// client reaches with the same markers in the same rounds, and the share of it that the
/// library keeps: (4) / (1) against the single marker insert, and where the client sends
/// batches, the batch of 50 against the bare batch.
fn render_reference(w: &mut String, run: &BackendRun) {
    for comparison in &COMPARISONS {
        let [marker, bare] = comparison.reference.map(|script| Variant::Reference {
            backend: run.backend,
            script,
        });
        let [numerator, denominator] = comparison.library;
        let find = |variant| run.find(variant, TARGET_CONSUMERS);
        let (Some(library), Some(base), Some(marker), Some(bare)) =
            (find(numerator), find(denominator), find(marker), find(bare))
        else {
            continue;
        };
        let library = measured_ratio(run, library, base);
        let reference = measured_ratio(run, marker, bare);
        let _ = writeln!(
            w,
            "At {TARGET_CONSUMERS} consumers, {} / {} is {}; {} / {}, the markers sent by \
             {} in the same rounds, is {}: {} / {} is {:.2} of it.",
            short(numerator),
            short(denominator),
            library.text,
            short(marker.variant),
            short(bare.variant),
            reference_client(run.backend),
            reference.text,
            short(numerator),
            short(denominator),
            library.median / reference.median,
        );
        line(w, "");
    }
}

/// What variant 8's pruner did beside the consumers, in the median round at each
/// consumer count.
fn render_pruned(w: &mut String, plan: &Plan, run: &BackendRun) {
    let Some(rows) = plan.prune else {
        return;
    };
    let variant = Variant::PruneUnderLoad { rows };
    let mut lines = Vec::new();
    for &consumers in &plan.consumers {
        let Some(m) = run.find(variant, consumers) else {
            continue;
        };
        let Some(pruned) = m.pruned else {
            continue;
        };
        let (pruning, consuming) = (pruned.elapsed.as_secs_f64(), m.run.elapsed.as_secs_f64());
        lines.push(format!(
            "- {consumers} consumer(s): the pruner deleted {} old markers in the {pruning:.1} s \
             it ran, {:.0} rows/s; the consumers ran {consuming:.1} s.",
            thousands(pruned.rows as f64),
            pruned.rows as f64 / pruning,
        ));
    }
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(
        w,
        "{}: a `Pruner` at its default pace (after each batch of 1,000 ids it rests four \
         times as long as the batch took) prunes with a 1-day window from the moment the \
         consumers start until they are done, over the {} markers loaded {} days old \
         before the measurement (median round); afterwards every message was credited \
         once, and only old markers were gone:",
        short(variant),
        count_label(rows),
        crate::runner::PRUNED_MARKERS_AGE_DAYS,
    );
    line(w, "");
    for item in lines {
        line(w, &item);
    }
    line(w, "");
}

/// The cluster's table: each variant at each consumer count with every consumer on the
/// first node, then spread over every node, and the second's throughput against the
/// first's within each round.
fn render_cluster(w: &mut String, plan: &Plan, run: &ClusterRun) {
    let nodes = run.nodes;
    let _ = writeln!(w, "## {}, {nodes} nodes", cluster::NAME);
    line(w, "");
    let _ = writeln!(
        w,
        "`one node`: every consumer connects to the first node, whose commits the others \
         certify and apply. `{nodes} nodes`: consumer i connects to node i mod {nodes}, so \
         every node executes a share and applies the rest. The two run back to back for \
         each variant, in alternating order from round to round. After each measurement \
         every node's balances were read once it had applied everything committed \
         (`wsrep_sync_wait = 1`), and each held every credit exactly once."
    );
    line(w, "");
    let ranged = plan.rounds > 1;
    let spread = Placement::EveryNode.label(nodes);
    let versus = format!("{spread} / one node");
    let mut head = vec!["consumers", "placement", "variant", "msg/s"];
    if ranged {
        head.push("range");
    }
    head.extend([
        versus.as_str(),
        "vs (1)",
        "statements/msg",
        "retries",
        "cert failures",
        "BF aborts",
        "flow control paused",
        "write-set bytes/msg",
        "CPU µs/msg servers",
        "CPU µs/msg by node",
        "CPU µs/msg harness",
    ]);
    table_row(w, head.iter().map(|cell| cell.to_string()));
    let rule = (0..head.len()).map(|column| {
        let left = column == 1 || column == 2;
        (if left { "---" } else { "---:" }).to_owned()
    });
    table_row(w, rule);
    for &consumers in &plan.consumers {
        for &variant in &plan.cluster {
            for placement in [Placement::OneNode, Placement::EveryNode] {
                let Some(m) = run.find(variant, consumers, placement) else {
                    continue;
                };
                let mut cells = vec![
                    consumers.to_string(),
                    placement.label(nodes),
                    variant.label(),
                    thousands(m.per_second()),
                ];
                if ranged {
                    let rounds = run.rounds(variant, consumers, placement);
                    let (slowest, fastest) = (rounds[0], rounds[rounds.len() - 1]);
                    cells.push(format!(
                        "{}–{}",
                        thousands(slowest.per_second()),
                        thousands(fastest.per_second())
                    ));
                }
                let against_one_node = match placement {
                    Placement::OneNode => String::new(),
                    Placement::EveryNode => ratio_text(&run.ratios(
                        consumers,
                        (variant, placement),
                        (variant, Placement::OneNode),
                    )),
                };
                let against_bare = ratio_text(&run.ratios(
                    consumers,
                    (variant, placement),
                    (Variant::Bare, placement),
                ));
                let nodes_costs = &m.diagnostics.nodes;
                let sum = |field: fn(&crate::probe::NodeCosts) -> i64| {
                    nodes_costs.iter().map(field).sum::<i64>()
                };
                let paused = nodes_costs
                    .iter()
                    .map(|node| node.flow_control_paused)
                    .max()
                    .unwrap_or_default();
                let node_cpu: Vec<Option<f64>> = nodes_costs
                    .iter()
                    .map(|node| cpu_per_delivery(m, node.cpu))
                    .collect();
                let servers_cpu: Option<f64> = node_cpu.iter().copied().sum();
                cells.extend([
                    against_one_node,
                    against_bare,
                    format!("{:.2}", m.per_delivery(m.run.statements as i64)),
                    m.run.tally.retries.to_string(),
                    sum(|node| node.cert_failures).to_string(),
                    sum(|node| node.bf_aborts).to_string(),
                    format!(
                        "{:.0}%",
                        100.0 * paused.as_secs_f64() / m.run.elapsed.as_secs_f64()
                    ),
                    format!("{:.0}", m.per_delivery(sum(|node| node.replicated_bytes))),
                    optional(servers_cpu, 0),
                    node_cpu
                        .iter()
                        .map(|cpu| optional(*cpu, 0))
                        .collect::<Vec<_>>()
                        .join(" / "),
                    optional(cpu_per_delivery(m, m.diagnostics.client_cpu), 0),
                ]);
                table_row(w, cells);
            }
        }
    }
    line(w, "");
    for item in [
        format!(
            "**{versus}** and **vs (1)**: the median of the ratios within each round, with \
             their range."
        ),
        "**retries**: deliveries repeated after a transient error (a certification \
         failure or a brute-force abort is a deadlock, 1213, which `classify` calls \
         transient). **cert failures** and **BF aborts**: the nodes' \
         `wsrep_local_cert_failures` and `wsrep_local_bf_aborts`, summed."
            .to_owned(),
        "**flow control paused**: the largest of the nodes' `wsrep_flow_control_paused_ns`, \
         as a share of the measurement's time: how long some node's apply queue held every \
         node's commits."
            .to_owned(),
        "**write-set bytes/msg**: `wsrep_replicated_bytes` summed over the nodes, per \
         delivery: what each commit sends to the others to certify and apply."
            .to_owned(),
        "**CPU µs/msg**: the nodes' `mariadbd` processes (summed, then node by node, \
         appliers included: read after every node had caught up) and the harness's."
            .to_owned(),
    ] {
        let _ = writeln!(w, "- {item}");
    }
    line(w, "");
}

/// `0.85 (0.80–0.90)`: the median of `ratios`, sorted, and their range where it shows.
fn ratio_text(ratios: &[f64]) -> String {
    match (bench::median(ratios), ratios.first(), ratios.last()) {
        (Some(median), Some(low), Some(high)) if high - low >= 0.005 => {
            format!("{median:.2} ({low:.2}–{high:.2})")
        }
        (Some(median), _, _) => format!("{median:.2}"),
        _ => String::new(),
    }
}

/// One Markdown table row.
fn table_row(w: &mut String, cells: impl IntoIterator<Item = String>) {
    let cells: Vec<String> = cells.into_iter().collect();
    let _ = writeln!(w, "| {} |", cells.join(" | "));
}

/// Microseconds of CPU per delivery.
fn cpu_per_delivery(m: &Measurement, cpu: Option<std::time::Duration>) -> Option<f64> {
    cpu.map(|cpu| cpu.as_secs_f64() * 1e6 / m.deliveries as f64)
}

fn optional(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(String::new, |value| format!("{value:.decimals$}"))
}

/// `12,345`.
fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value);
    let mut grouped = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

fn render_legend(w: &mut String) {
    line(w, "## Reading the tables");
    line(w, "");
    for item in [
        "(1) the credit alone, in a transaction: the ceiling. (2) a look-up in a table \
         without a unique index, then insert and credit in one transaction: cheap and not \
         exactly-once. (3) the statements `#[idempotent]` issues for a new message, written \
         by hand: on PostgreSQL BEGIN, marker insert, credit, then `SELECT 1; COMMIT` in one \
         round trip; on MySQL and SQLite BEGIN, the marker insert and a savepoint in one \
         batch (on MySQL the savepoint ahead of the insert, then the marker's id and \
         autocommit off), the credit, then `RELEASE SAVEPOINT …; COMMIT` in one round trip \
         (on MySQL with the statement each connection prepares to restore autocommit, \
         after checking the marker row where the server replicates through wsrep or is not MariaDB). (4) \
         `#[idempotent]` with every delivery a new message: the same statements, since its \
         adaptive fast path reads first only once about a quarter of recent deliveries were \
         duplicates; (4b) the same with `fast_path = true`, which always reads first: one \
         `SELECT EXISTS` more, before BEGIN. (4c) claim mode, `#[idempotent(claim)]`, for \
         effects outside the database: the claim's insert commits, then the body runs in \
         no transaction (a no-op external call, then the credit, autocommitted), then the \
         completion's update commits: three commits per message. (5) `#[idempotent]` where the given share of \
         deliveries repeat messages already processed. (6) MassTransit's EF Core inbox \
         flow, on a table of its own modelled on its `InboxState`: insert the row and \
         commit, then a serializable transaction that locks the row with `SELECT … FOR \
         UPDATE` (`BEGIN IMMEDIATE` on SQLite), credits and sets its `consumed_at`. (7) \
         `#[idempotent]` over an inbox already holding that many markers. (8) (4)'s \
         deliveries while a `Pruner` at its default pace prunes that many markers, loaded \
         two days old before the measurement, until the consumers are done. (b10), (b50), \
         (b100) `#[idempotent(batch = …)]` over that many consecutive deliveries per call, \
         in one transaction: the markers in one insert (PostgreSQL) or inserts of up to \
         64 (MySQL, SQLite), then the batch's credits summed by account in one `UPDATE` \
         that takes the accounts in ascending order; (bb10), (bb50), (bb100) the same \
         `UPDATE` in a transaction of its own, without the inbox. The reference \
         rows, where the backend's C client is on PATH: `BEGIN`, the credit, `COMMIT` \
         (p1, m1, s1), and the same with the marker insert after `BEGIN` (p2, m2, s2), each \
         statement on its own, one client per consumer on the run's own tables, in every \
         round beside the variants: pgbench (`-M prepared`) on PostgreSQL, mariadb-slap \
         (text queries; the account drawn by the server) on MySQL/MariaDB, sqlite3 shells \
         (WAL, `synchronous = FULL`) on SQLite; on PostgreSQL also batches of 50, bare \
         (pb1) and with one `INSERT` of 50 markers (pb2). Their ratio is what the database \
         allows a marker insert without diesel or the harness; their diagnostics are left \
         empty.",
        "**vs (1)**: throughput relative to (1) at the same consumer count; with several \
         rounds, the median of the ratios within each round.",
        "**statements/msg**: statements the consumers sent per delivery, BEGIN and COMMIT \
         included; each is one round trip to the server (a batch such as PostgreSQL's \
         `SELECT 1; COMMIT` is one).",
        "**log fsyncs/msg** and **log KiB/msg**: PostgreSQL WAL syncs and bytes \
         (`pg_stat_wal`); InnoDB fsyncs (`Innodb_data_fsyncs`, the redo log's included) \
         and redo log bytes. Server-wide counters. Fewer fsyncs than commits means \
         commits shared a flush (group commit).",
        "**CPU µs/msg**: CPU time per delivery of the harness's process (consumers and \
         driver; on SQLite the database engine too) and of the consumers' PostgreSQL \
         backends (a local server only; WAL writer and checkpointer not included). On a \
         machine whose cores are all busy, throughput is bounded by cores ÷ CPU per \
         delivery.",
        "**backend time**: PostgreSQL only: what the consumers' backends were doing, \
         sampled every 10 ms from `pg_stat_activity`. `CPU` is executing; \
         `Client:ClientRead` is waiting for the harness's next statement (round trips and \
         the client's own CPU); `IO:WALSync` is the commit's fsync; `Lock:*` are row or \
         transaction lock waits; `LWLock:*` are contention on shared memory.",
    ] {
        let _ = writeln!(w, "- {item}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0.4), "0");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1_234.4), "1,234");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
    }

    #[test]
    fn verdicts_say_when_rounds_disagree() {
        assert_eq!(verdict(&[0.81, 0.85, 0.9], 0.85, 0.8), "met");
        assert_eq!(verdict(&[0.7, 0.75, 0.79], 0.75, 0.8), "**missed**");
        assert_eq!(
            verdict(&[0.71, 0.77, 0.82], 0.77, 0.8),
            "**missed** in 2 of 3 rounds"
        );
        assert_eq!(
            verdict(&[0.79, 0.8, 0.83], 0.8, 0.8),
            "met in 2 of 3 rounds"
        );
        assert_eq!(verdict(&[1.2], 1.2, 1.5), "**missed**");
    }

    #[test]
    fn variants_are_named_briefly() {
        assert_eq!(short(Variant::Idempotent), "(4)");
        assert_eq!(
            short(Variant::Duplicates { percent: 100 }),
            "(5, 100% dups)"
        );
        assert_eq!(short(Variant::Prefilled { rows: 10_000_000 }), "(7, 10M)");
        let reference = Variant::Reference {
            backend: Backend::Mysql,
            script: Script::MarkerInsert,
        };
        assert_eq!(short(reference), "(m2)");
    }
}
