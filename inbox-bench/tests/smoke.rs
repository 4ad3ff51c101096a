//! The harness's smoke mode, run in-process: SQLite always, PostgreSQL and MySQL when
//! `POSTGRES_URL` and `MYSQL_URL` are set, with pgbench's reference rows where pgbench is
//! on PATH. It proves the harness works end to end; it never asserts a speed.

use std::process::Command;

use clap::Parser as _;
use inbox_bench::{Args, Backend, Plan, Script, Variant};

#[tokio::test(flavor = "multi_thread")]
async fn smoke_run_writes_a_row_per_variant_and_consumer_count_and_a_chart() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let output = dir.path().join("BENCHMARKS.md");
    let chart = dir.path().join("benchmarks.svg");
    let argv: Vec<String> = [
        "inbox-bench",
        "--smoke",
        "--messages",
        "40",
        "--consumers",
        "1,4",
        "--prefill",
        "2k",
        "--output",
        output.to_str().expect("UTF-8 path"),
        "--chart",
        chart.to_str().expect("UTF-8 path"),
    ]
    .map(String::from)
    .to_vec();
    let plan = Plan::new(Args::try_parse_from(&argv).expect("arguments"), &argv).expect("plan");

    let measured = inbox_bench::run(&plan).await.expect("smoke run");

    assert!(measured.contains(&Backend::Sqlite), "{measured:?}");
    let pgbench = Command::new("pgbench").arg("--version").output();
    let pgbench_rows = match pgbench {
        Ok(output) if output.status.success() => Script::ALL.map(Variant::Pgbench).to_vec(),
        _ => Vec::new(),
    };
    let report = std::fs::read_to_string(&output).expect("report written");
    for backend in &measured {
        let section = report
            .split("\n## ")
            .find(|section| section.starts_with(backend.name()))
            .unwrap_or_else(|| panic!("no section for {}:\n{report}", backend.name()));
        let mut variants = plan.variants();
        if *backend == Backend::Postgres {
            variants.extend(&pgbench_rows);
        }
        for &consumers in &plan.consumers {
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
    let svg = std::fs::read_to_string(&chart).expect("chart written");
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
    assert!(svg.contains("messages per second"));
}
