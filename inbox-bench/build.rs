//! Records the compiler's version for the report: the rustc that built the harness, not
//! whichever one is on PATH when it runs.

use std::process::Command;

fn main() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .map_or_else(|| "unknown".to_owned(), |text| text.trim().to_owned());
    println!("cargo:rustc-env=INBOX_BENCH_RUSTC={version}");
    println!("cargo:rerun-if-env-changed=RUSTC");
}
