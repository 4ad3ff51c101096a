//! The facts about the machine and the build that a reader needs to weigh the figures.

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone)]
pub struct Machine {
    pub date: String,
    pub cores: usize,
    pub cpu: Option<String>,
    pub memory: Option<String>,
    pub kernel: Option<String>,
    pub os: Option<String>,
    /// The 1, 5 and 15-minute load averages, at the start of the run.
    pub load: Option<String>,
    pub rustc: &'static str,
    pub optimized: bool,
    /// The workspace's commit, and whether the work tree had changes.
    pub revision: Option<String>,
}

impl Machine {
    pub fn probe() -> Self {
        Self {
            date: utc_now(),
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            cpu: proc_field("/proc/cpuinfo", "model name"),
            memory: proc_field("/proc/meminfo", "MemTotal").and_then(|total| {
                let kib: f64 = total.trim_end_matches(" kB").trim().parse().ok()?;
                Some(format!("{:.1} GiB", kib / 1024.0 / 1024.0))
            }),
            kernel: read_trimmed("/proc/sys/kernel/osrelease"),
            os: read_trimmed("/etc/os-release").and_then(|release| {
                let line = release.lines().find(|l| l.starts_with("PRETTY_NAME="))?;
                Some(line["PRETTY_NAME=".len()..].trim_matches('"').to_owned())
            }),
            load: load_average(),
            rustc: env!("INBOX_BENCH_RUSTC"),
            optimized: !cfg!(debug_assertions),
            revision: revision(),
        }
    }
}

pub fn load_average() -> Option<String> {
    let text = read_trimmed("/proc/loadavg")?;
    Some(
        text.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|text| text.trim().to_owned())
}

/// The value of the first `name: value` line of a /proc file.
fn proc_field(path: &str, name: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == name).then(|| value.trim().to_owned())
    })
}

/// `c17f148`, or `c17f148 with uncommitted changes`. Read-only: optional locks are off,
/// so git does not even refresh the index.
fn revision() -> Option<String> {
    let git = |args: &[&str]| {
        let output = Command::new("git")
            .args(["-C", env!("CARGO_MANIFEST_DIR")])
            .args(args)
            .env("GIT_OPTIONAL_LOCKS", "0")
            .output()
            .ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
    };
    let commit = git(&["rev-parse", "--short", "HEAD"])?;
    let changed = git(&["status", "--porcelain", "--untracked-files=no"])?;
    Some(if changed.is_empty() {
        commit
    } else {
        format!("{commit} with uncommitted changes")
    })
}

/// `2026-11-30 20:54 UTC`.
fn utc_now() -> String {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    let (days, of_day) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        of_day / 3600,
        of_day % 3600 / 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * shifted_month + 2) / 5 + 1) as u32;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::civil_from_days;

    #[test]
    fn days_become_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_787), (2026, 11, 30));
    }
}
