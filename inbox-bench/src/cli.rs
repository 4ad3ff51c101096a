//! The command line, and the plan of measurements it resolves to.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::{Parser, ValueEnum};

use crate::backend::Backend;
use crate::variant::{Script, Variant};

/// Measures what exactly-once costs: `#[idempotent]` against its alternatives, on
/// PostgreSQL, MySQL/MariaDB and SQLite, at several consumer counts, in one run.
///
/// Server URLs come from `POSTGRES_URL` and `MYSQL_URL`, a Galera cluster's from
/// `GALERA_URLS`; a backend whose URL is not set is skipped. Each run works in a schema or database of its own and drops it at the
/// end. Ratios are only comparable within one run.
#[derive(Debug, Clone, Parser)]
#[command(name = "inbox-bench", version)]
pub struct Args {
    /// Backends to measure, comma-separated. `galera` is a MariaDB Galera cluster whose
    /// nodes `GALERA_URLS` names (comma-separated `mysql://` URLs): variants 1, 3 and 4
    /// with every consumer on the first node, and spread over all nodes. `all` is the
    /// three single-server backends.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
    pub backend: Vec<BackendChoice>,

    /// Concurrent consumers, each on its own connection, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8,16")]
    pub consumers: Vec<usize>,

    /// Deliveries per measurement [default: 10000, or 100 with --smoke].
    #[arg(long)]
    pub messages: Option<u64>,

    /// Inbox sizes to pre-fill for variant 7, comma-separated (`1M`, `500k` and plain
    /// numbers work), or `none` [default: 1M,10M, or 10k with --smoke].
    #[arg(long, value_parser = parse_prefill)]
    pub prefill: Option<Prefill>,

    /// Variants to measure, comma-separated, by their numbers in the report: 1, 2, 3,
    /// 4, 4b, 4c, 5, 6, 7, 8, the batches b10, b50, b100 and the bare batches bb10, bb50, bb100,
    /// and the references sent by C clients, p1, p2, pb1, pb2 (pgbench), m1, m2
    /// (mariadb-slap), s1, s2 (sqlite3) [default: all]. A subset shortens a run taken to
    /// compare a few of them, such as `1,3,4,m1,m2` or `4,b50,bb50,pb1,pb2`.
    #[arg(long, value_delimiter = ',', value_parser = parse_variant_number)]
    pub variants: Vec<String>,

    /// Times every measurement is repeated; the report gives the median and the range.
    /// Rounds are interleaved (each sweeps all variants), so a burst of other load on
    /// the machine hits every variant alike. Use 3 or more where the machine is shared.
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,

    /// Few messages and a small pre-filled inbox: proves the harness works, in seconds.
    /// Its figures mean nothing.
    #[arg(long)]
    pub smoke: bool,

    /// Where to write the Markdown report.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/BENCHMARKS.md"))]
    pub output: PathBuf,

    /// Where to write the SVG chart of throughput against consumers.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/benchmarks.svg"))]
    pub chart: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendChoice {
    Postgres,
    Mysql,
    Sqlite,
    Galera,
    All,
}

/// The inbox sizes variant 7 runs at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefill(Vec<u64>);

/// What one run measures, with every default resolved.
#[derive(Debug, Clone)]
pub struct Plan {
    pub backends: Vec<Backend>,
    /// The variants measured on the Galera cluster, in report order; empty when the
    /// cluster is not measured.
    pub cluster: Vec<Variant>,
    pub consumers: Vec<usize>,
    pub messages: u64,
    pub rounds: u32,
    /// Inbox sizes for variant 7; empty when it is not measured.
    pub prefill: Vec<u64>,
    /// Old markers variant 8 prunes while the consumers run, when it is measured.
    pub prune: Option<u64>,
    /// The variants measured on an emptied inbox, in report order.
    pub empty_inbox: Vec<Variant>,
    /// The reference rows to run, each on its backend where its client is at hand.
    pub references: Vec<Variant>,
    pub smoke: bool,
    pub output: PathBuf,
    pub chart: PathBuf,
    /// How to reproduce this run, for the report.
    pub command: String,
}

impl Plan {
    /// Resolves `args`; `argv` is the command line as typed, recorded in the report.
    pub fn new(args: Args, argv: &[String]) -> anyhow::Result<Self> {
        let mut backends = Vec::new();
        for choice in &args.backend {
            let chosen: &[Backend] = match choice {
                BackendChoice::Postgres => &[Backend::Postgres],
                BackendChoice::Mysql => &[Backend::Mysql],
                BackendChoice::Sqlite => &[Backend::Sqlite],
                BackendChoice::Galera => &[],
                BackendChoice::All => &Backend::ALL,
            };
            for &backend in chosen {
                if !backends.contains(&backend) {
                    backends.push(backend);
                }
            }
        }
        let mut consumers = args.consumers;
        consumers.sort_unstable();
        consumers.dedup();
        if consumers.first() == Some(&0) || consumers.is_empty() {
            bail!("--consumers needs counts of at least 1");
        }
        let messages = args
            .messages
            .unwrap_or(if args.smoke { 100 } else { 10_000 });
        if messages == 0 {
            bail!("--messages must be at least 1");
        }
        if args.rounds == 0 {
            bail!("--rounds must be at least 1");
        }
        let Prefill(mut prefill) = args.prefill.unwrap_or_else(|| {
            Prefill(if args.smoke {
                vec![10_000]
            } else {
                vec![1_000_000, 10_000_000]
            })
        });
        // Variant 7 grows one inbox from the smallest size to the largest.
        prefill.sort_unstable();
        prefill.dedup();
        let chosen = |variant: Variant| {
            args.variants.is_empty() || args.variants.contains(&variant.number().to_owned())
        };
        if !chosen(Variant::Prefilled { rows: 0 }) {
            prefill.clear();
        } else if prefill.is_empty() && !args.variants.is_empty() {
            bail!("--variants 7 needs inbox sizes to pre-fill, such as --prefill 1M");
        }
        let prune = chosen(Variant::PruneUnderLoad { rows: 0 }).then_some(if args.smoke {
            10_000
        } else {
            1_000_000
        });
        let cluster: Vec<Variant> = if args.backend.contains(&BackendChoice::Galera) {
            Variant::CLUSTER
                .into_iter()
                .filter(|&v| chosen(v))
                .collect()
        } else {
            Vec::new()
        };
        if args.backend.contains(&BackendChoice::Galera) && cluster.is_empty() {
            bail!("--backend galera measures variants 1, 3 and 4: choose at least one of them");
        }
        Ok(Self {
            backends,
            cluster,
            consumers,
            messages,
            rounds: args.rounds,
            prefill,
            prune,
            empty_inbox: Variant::EMPTY_INBOX
                .into_iter()
                .filter(|&v| chosen(v))
                .collect(),
            references: Variant::references().filter(|&v| chosen(v)).collect(),
            smoke: args.smoke,
            output: args.output,
            chart: args.chart,
            command: reproduction(argv),
        })
    }

    /// `(round, consumers)`: each consumer count once per round, round after round.
    pub fn consumer_rounds(&self) -> impl Iterator<Item = (u32, usize)> + '_ {
        (0..self.rounds).flat_map(|round| self.consumers.iter().map(move |&c| (round, c)))
    }

    /// Every variant the harness measures itself, in report order.
    /// The scripts of the reference rows chosen for `backend`.
    pub fn references_on(&self, backend: Backend) -> Vec<Script> {
        self.references
            .iter()
            .filter_map(|&variant| match variant {
                Variant::Reference {
                    backend: on,
                    script,
                } if on == backend => Some(script),
                _ => None,
            })
            .collect()
    }

    pub fn variants(&self) -> Vec<Variant> {
        let mut variants = self.empty_inbox.clone();
        variants.extend(self.prune.map(|rows| Variant::PruneUnderLoad { rows }));
        variants.extend(self.prefill.iter().map(|&rows| Variant::Prefilled { rows }));
        variants
    }
}

/// One of the numbers the report gives its variants: `4b`, `p1`.
fn parse_variant_number(text: &str) -> anyhow::Result<String> {
    let number = text.trim();
    let known = Variant::numbers();
    if known.contains(&number) {
        Ok(number.to_owned())
    } else {
        bail!("`{number}` is not a variant; they are {}", known.join(", "))
    }
}

/// `1M,10M`, `500k`, `10000` or `none`.
fn parse_prefill(text: &str) -> anyhow::Result<Prefill> {
    if text.eq_ignore_ascii_case("none") {
        return Ok(Prefill(Vec::new()));
    }
    text.split(',')
        .map(|item| {
            let item = item.trim();
            let (digits, scale) = match item.char_indices().last() {
                Some((at, 'k' | 'K')) => (&item[..at], 1_000),
                Some((at, 'm' | 'M')) => (&item[..at], 1_000_000),
                _ => (item, 1),
            };
            let count: u64 = digits
                .parse()
                .with_context(|| format!("`{item}` is not a row count like 1M, 500k or 10000"))?;
            match count * scale {
                0 => bail!("a pre-filled inbox needs at least 1 row; use `none` to skip"),
                rows => Ok(rows),
            }
        })
        .collect::<anyhow::Result<_>>()
        .map(Prefill)
}

/// The command that reproduces this run, with the server URLs it read (passwords masked).
fn reproduction(argv: &[String]) -> String {
    let mut parts = Vec::new();
    for variable in ["POSTGRES_URL", "MYSQL_URL", "GALERA_URLS"] {
        match std::env::var(variable) {
            Ok(url) if !url.is_empty() => {
                parts.push(format!("{variable}={}", mask_password(&url)));
            }
            _ => {}
        }
    }
    parts.push("cargo run --release -p inbox-bench --".to_owned());
    parts.extend(argv.iter().skip(1).cloned());
    parts.join(" ")
}

/// `scheme://user:secret@host` becomes `scheme://user:***@host`.
fn mask_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((credentials, host)) if credentials.contains(':') => {
            let user = credentials.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_sizes_take_suffixes_and_none() {
        assert_eq!(
            parse_prefill("1M,10M").unwrap(),
            Prefill(vec![1_000_000, 10_000_000])
        );
        assert_eq!(parse_prefill("500k").unwrap(), Prefill(vec![500_000]));
        assert_eq!(parse_prefill("10000").unwrap(), Prefill(vec![10_000]));
        assert_eq!(parse_prefill("none").unwrap(), Prefill(vec![]));
        assert!(parse_prefill("0").is_err());
        assert!(parse_prefill("ten").is_err());
    }

    #[test]
    fn passwords_are_masked() {
        assert_eq!(
            mask_password("postgres://bench:secret@db:5432/test"),
            "postgres://bench:***@db:5432/test"
        );
        assert_eq!(
            mask_password("mysql://root@127.0.0.1:3306/test"),
            "mysql://root@127.0.0.1:3306/test"
        );
    }

    #[test]
    fn smoke_mode_is_small() {
        let args =
            Args::try_parse_from(["inbox-bench", "--smoke", "--consumers", "4,1,4"]).unwrap();
        let plan = Plan::new(args, &[]).unwrap();
        assert_eq!(plan.consumers, vec![1, 4]);
        assert_eq!(plan.messages, 100);
        assert_eq!(plan.prefill, vec![10_000]);
        assert_eq!(plan.backends, Backend::ALL.to_vec());
        assert_eq!(plan.prune, Some(10_000));
        assert_eq!(plan.variants().len(), Variant::EMPTY_INBOX.len() + 2);
        assert_eq!(plan.references, Variant::references().collect::<Vec<_>>());
    }

    #[test]
    fn the_cluster_is_chosen_by_name_and_measures_its_variants() {
        let plan = |argv: &[&str]| Plan::new(Args::try_parse_from(argv).unwrap(), &[]);
        let all = plan(&["inbox-bench"]).unwrap();
        assert!(all.cluster.is_empty(), "`all` leaves the cluster out");
        let galera = plan(&["inbox-bench", "--backend", "galera"]).unwrap();
        assert!(galera.backends.is_empty());
        assert_eq!(galera.cluster, Variant::CLUSTER);
        let chosen = plan(&[
            "inbox-bench",
            "--backend",
            "galera,mysql",
            "--variants",
            "4,1",
        ]);
        let chosen = chosen.unwrap();
        assert_eq!(chosen.backends, [Backend::Mysql]);
        assert_eq!(chosen.cluster, [Variant::Bare, Variant::Idempotent]);
        assert!(plan(&["inbox-bench", "--backend", "galera", "--variants", "2"]).is_err());
    }

    #[test]
    fn variants_can_be_chosen_by_number() {
        let args = Args::try_parse_from(["inbox-bench", "--variants", "4,1,p2,5"]).unwrap();
        let plan = Plan::new(args, &[]).unwrap();
        assert_eq!(
            plan.variants(),
            vec![
                Variant::Bare,
                Variant::Idempotent,
                Variant::Duplicates { percent: 50 },
                Variant::Duplicates { percent: 100 },
            ]
        );
        assert_eq!(
            plan.references,
            vec![Variant::Reference {
                backend: Backend::Postgres,
                script: Script::MarkerInsert
            }]
        );
        assert!(plan.prefill.is_empty(), "variant 7 was not chosen");

        let args = Args::try_parse_from(["inbox-bench", "--variants", "7", "--prefill", "1M"]);
        let plan = Plan::new(args.unwrap(), &[]).unwrap();
        assert_eq!(
            plan.variants(),
            vec![Variant::Prefilled { rows: 1_000_000 }]
        );

        assert_eq!(
            Variant::numbers(),
            [
                "1", "2", "3", "4", "4b", "4c", "5", "6", "b10", "b50", "b100", "bb10", "bb50",
                "bb100", "8", "7", "p1", "p2", "pb1", "pb2", "m1", "m2", "s1", "s2"
            ]
        );
        for number in Variant::numbers() {
            let args = Args::try_parse_from(["inbox-bench", "--variants", number]).unwrap();
            let plan = Plan::new(args, &[]).unwrap();
            let measured = plan.variants().into_iter();
            let numbers: Vec<_> = measured
                .chain(plan.references.iter().copied())
                .map(Variant::number)
                .collect();
            assert!(
                !numbers.is_empty() && numbers.iter().all(|&n| n == number),
                "--variants {number} measures {numbers:?}"
            );
        }
        let args = Args::try_parse_from(["inbox-bench", "--variants", "7", "--prefill", "none"]);
        assert!(Plan::new(args.unwrap(), &[]).is_err());

        let error = Args::try_parse_from(["inbox-bench", "--variants", "4d"]).unwrap_err();
        assert!(
            error.to_string().contains("`4d` is not a variant"),
            "{error}"
        );
    }
}
