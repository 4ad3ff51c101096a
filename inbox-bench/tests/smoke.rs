//! The harness's smoke mode, run in-process: SQLite always, PostgreSQL and MySQL when
//! `POSTGRES_URL` and `MYSQL_URL` are set, with each backend's reference rows where its C
//! client (pgbench, mariadb-slap, sqlite3) is on PATH, and the Galera cluster when
//! `GALERA_URLS` is set. It proves the harness works end to end; it never asserts a speed.

use std::path::PathBuf;
use std::process::Command;

use clap::Parser as _;
use inbox_bench::{Args, Backend, Plan, Script, Variant};
use tempfile::TempDir;

#[tokio::test(flavor = "multi_thread")]
async fn smoke_run_writes_a_row_per_variant_and_consumer_count_and_a_chart() {
    let run = Run::new(&["--messages", "40", "--consumers", "1,4", "--prefill", "2k"]);

    let measured = inbox_bench::run(&run.plan)
        .await
        .expect("smoke run")
        .backends;

    assert!(measured.contains(&Backend::Sqlite), "{measured:?}");
    // A server whose URL is set must be measured, not skipped.
    for (variable, backend) in [
        ("POSTGRES_URL", Backend::Postgres),
        ("MYSQL_URL", Backend::Mysql),
    ] {
        if std::env::var(variable).is_ok_and(|url| !url.is_empty()) {
            assert!(
                measured.contains(&backend),
                "{variable} is set but {} was not measured: {measured:?}",
                backend.name()
            );
        }
    }
    let report = std::fs::read_to_string(&run.output).expect("report written");
    for backend in &measured {
        let section = section(&report, *backend);
        let mut variants = run.plan.variants();
        if client_is_on_path(*backend) {
            variants.extend(
                Script::on(*backend)
                    .iter()
                    .map(|&script| Variant::Reference {
                        backend: *backend,
                        script,
                    }),
            );
        }
        for &consumers in &run.plan.consumers {
            for &variant in &variants {
                let row = format!("| {consumers} | {} | ", variant.label());
                assert!(
                    section.lines().any(|line| line.starts_with(&row)),
                    "{}: no row starting `{row}`:\n{section}",
                    backend.name()
                );
            }
        }
    }
    let svg = std::fs::read_to_string(&run.chart).expect("chart written");
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
    assert!(svg.contains("messages per second"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_of_chosen_variants_reports_only_those() {
    let run = Run::new(&[
        "--messages",
        "20",
        "--consumers",
        "2",
        "--variants",
        "1,4,p2,m2,s2",
    ]);

    let measured = inbox_bench::run(&run.plan)
        .await
        .expect("run of chosen variants")
        .backends;

    let report = std::fs::read_to_string(&run.output).expect("report written");
    for backend in &measured {
        let section = section(&report, *backend);
        let rows: Vec<&str> = section
            .lines()
            .filter(|line| line.starts_with("| 2 | "))
            .collect();
        let mut expected = vec![Variant::Bare, Variant::Idempotent];
        if client_is_on_path(*backend) {
            expected.push(Variant::Reference {
                backend: *backend,
                script: Script::MarkerInsert,
            });
        }
        assert_eq!(rows.len(), expected.len(), "{}:\n{section}", backend.name());
        for (row, variant) in rows.iter().zip(expected) {
            assert!(
                row.starts_with(&format!("| 2 | {} | ", variant.label())),
                "{row}"
            );
        }
    }
    if measured.contains(&Backend::Postgres) {
        assert!(
            report.contains("| (4) / (3) ≥ 0.97 | not measured |"),
            "{report}"
        );
    }
}

/// On the cluster, every chosen variant at every consumer count, with the consumers on
/// one node and on every node; the run checks every node's balances itself.
#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_run_measures_one_node_against_every_node() {
    let nodes = match std::env::var("GALERA_URLS") {
        Ok(urls) if !urls.is_empty() => urls.split(',').count(),
        _ => {
            assert!(
                std::env::var_os("CI").is_none(),
                "GALERA_URLS is not set, and CI runs every suite"
            );
            eprintln!(
                "skipping: GALERA_URLS is not set (scripts/galera.sh start starts a cluster)"
            );
            return;
        }
    };
    let run = Run::new(&[
        "--backend",
        "galera",
        "--messages",
        "30",
        "--consumers",
        "1,4",
        "--variants",
        "1,4",
    ]);

    let measured = inbox_bench::run(&run.plan)
        .await
        .expect("cluster smoke run");

    assert!(
        measured.cluster && measured.backends.is_empty(),
        "{measured:?}"
    );
    let report = std::fs::read_to_string(&run.output).expect("report written");
    let section = report
        .split("\n## ")
        .find(|section| section.starts_with("MariaDB Galera"))
        .unwrap_or_else(|| panic!("no cluster section:\n{report}"));
    for consumers in [1, 4] {
        for placement in ["one node".to_owned(), format!("{nodes} nodes")] {
            for variant in [Variant::Bare, Variant::Idempotent] {
                let row = format!("| {consumers} | {placement} | {} | ", variant.label());
                assert!(
                    section.lines().any(|line| line.starts_with(&row)),
                    "no row starting `{row}`:\n{section}"
                );
            }
        }
    }
}

/// A smoke run's plan, writing into a directory of its own.
struct Run {
    plan: Plan,
    output: PathBuf,
    chart: PathBuf,
    _dir: TempDir,
}

impl Run {
    fn new(options: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let output = dir.path().join("BENCHMARKS.md");
        let chart = dir.path().join("benchmarks.svg");
        let paths = [
            "--output",
            output.to_str().expect("UTF-8 path"),
            "--chart",
            chart.to_str().expect("UTF-8 path"),
        ];
        let argv: Vec<String> = ["inbox-bench", "--smoke"]
            .iter()
            .chain(options)
            .chain(&paths)
            .map(|&arg| arg.to_owned())
            .collect();
        let args = Args::try_parse_from(&argv).expect("arguments");
        Self {
            plan: Plan::new(args, &argv).expect("plan"),
            output,
            chart,
            _dir: dir,
        }
    }
}

/// The report's section on `backend`.
fn section(report: &str, backend: Backend) -> &str {
    report
        .split("\n## ")
        .find(|section| section.starts_with(backend.name()))
        .unwrap_or_else(|| panic!("no section for {}:\n{report}", backend.name()))
}

/// Whether the reference rows of `backend` can run here; without its client a run skips
/// them with a message.
fn client_is_on_path(backend: Backend) -> bool {
    Command::new(inbox_bench::reference_client(backend))
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success())
}
