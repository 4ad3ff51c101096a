//! The crash test's short configuration, as CI runs it: 300 messages, a consumer killed
//! with SIGKILL every ~400 ms, on each broker, with the `#[idempotent]` handler and the
//! claim-mode one; and the naive handler, which it must catch double-applying messages.
//! The outbox chain likewise on each broker, service A, the relays and service B killed
//! in turn every ~150 ms; and its naive variant, which it must catch announcing
//! rolled-back credits.

use std::process::Command;

/// Runs `inbox-chaos` with `args`, killing every ~400 ms; `None` when a service's URL
/// is not set (a failure under CI, where every service runs).
fn chaos(args: &[&str]) -> Option<(bool, String)> {
    chaos_killing_every("400", args)
}

/// Runs `inbox-chaos` with `args`, killing every `kill_every_ms`.
fn chaos_killing_every(kill_every_ms: &str, args: &[&str]) -> Option<(bool, String)> {
    for variable in ["POSTGRES_URL", "AMQP_URL", "NATS_URL"] {
        if std::env::var(variable).map_or(true, |url| url.is_empty()) {
            assert!(
                std::env::var_os("CI").is_none(),
                "{variable} is not set, and CI runs every suite"
            );
            eprintln!("SKIPPED: {variable} is not set");
            return None;
        }
    }
    let output = Command::new(env!("CARGO_BIN_EXE_inbox-chaos"))
        .args([
            "--messages",
            "300",
            "--kill-every-ms",
            kill_every_ms,
            "--timeout-secs",
            "120",
        ])
        .args(args)
        .output()
        .expect("run inbox-chaos");
    let report = String::from_utf8_lossy(&output.stdout).into_owned();
    eprintln!("{report}{}", String::from_utf8_lossy(&output.stderr));
    Some((output.status.success(), report))
}

fn kills(report: &str) -> u64 {
    report
        .lines()
        .find_map(|line| line.strip_prefix("kills survived: "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|count| count.parse().ok())
        .expect("the report counts kills")
}

fn passes_under_kills(broker: &str, handler: &str) {
    let Some((passed, report)) = chaos(&["--broker", broker, "--handler", handler]) else {
        return;
    };
    assert!(passed, "the crash test failed on {broker}:\n{report}");
    assert!(report.contains("PASSED"), "{report}");
    assert!(kills(&report) > 0, "no consumer was killed:\n{report}");
}

#[test]
fn rabbitmq_applies_each_credit_once_while_consumers_are_killed() {
    passes_under_kills("rabbitmq", "inbox");
}

#[test]
fn nats_applies_each_credit_once_while_consumers_are_killed() {
    passes_under_kills("nats", "inbox");
}

#[test]
fn rabbitmq_claims_call_downstream_once_per_message_while_consumers_are_killed() {
    passes_under_kills("rabbitmq", "claim");
}

#[test]
fn nats_claims_call_downstream_once_per_message_while_consumers_are_killed() {
    passes_under_kills("nats", "claim");
}

#[test]
fn the_naive_handler_is_caught_double_applying() {
    let Some((passed, report)) = chaos(&["--broker", "rabbitmq", "--naive"]) else {
        return;
    };
    assert!(!passed, "the naive handler passed:\n{report}");
    assert!(
        report.contains("FAILED: double-applied messages: "),
        "{report}"
    );
}

/// The kills of each service of the chain: service A, relays, service B.
fn kills_by_service(report: &str) -> [u64; 3] {
    let line = report
        .lines()
        .find(|line| line.starts_with("kills survived: "))
        .expect("the report counts kills");
    ["service A ", "relays ", "service B "].map(|service| {
        line.split_once(service)
            .and_then(|(_, rest)| rest.split([',', ';']).next())
            .and_then(|count| count.parse().ok())
            .unwrap_or_else(|| panic!("no kills of {service}in {line}"))
    })
}

/// Kills every ~150 ms: the chain drains in a few seconds, and each of its three
/// services must be killed at least once.
fn chain_passes_under_kills(broker: &str) {
    let args = ["--broker", broker, "--handler", "outbox"];
    let Some((passed, report)) = chaos_killing_every("150", &args) else {
        return;
    };
    assert!(passed, "the outbox chain failed on {broker}:\n{report}");
    assert!(report.contains("PASSED"), "{report}");
    let kills = kills_by_service(&report);
    assert!(
        kills.iter().all(|&kills| kills > 0),
        "a service was never killed ({kills:?}):\n{report}"
    );
}

#[test]
fn rabbitmq_outbox_chain_announces_each_committed_credit_once_while_all_are_killed() {
    chain_passes_under_kills("rabbitmq");
}

#[test]
fn nats_outbox_chain_announces_each_committed_credit_once_while_all_are_killed() {
    chain_passes_under_kills("nats");
}

#[test]
fn the_naive_chain_is_caught_announcing_rolled_back_credits() {
    let Some((passed, report)) = chaos(&["--broker", "rabbitmq", "--handler", "outbox-naive"])
    else {
        return;
    };
    assert!(!passed, "the naive chain passed:\n{report}");
    assert!(
        report.contains("FAILED: events for credits that rolled back: "),
        "{report}"
    );
}
