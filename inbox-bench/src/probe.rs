//! What bounds a measurement: log flushes and log volume on the server before and after
//! it, the CPU time the harness and (on a local PostgreSQL) the consumers' backends
//! spent, and on PostgreSQL what those backends were waiting for while it ran. The log
//! counters are server-wide, so other load on the server shows up in them.

use std::collections::HashMap;
use std::time::Duration;

use diesel_inbox::schema::INDEX_NAME;
use diesel_inbox::testing::TestDatabase;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::backend::Backend;
use crate::connection::{BenchConnection, connect};

/// How often the consumers' PostgreSQL backends are sampled. Coarse enough to cost the
/// 2-core machine little, fine enough for a few hundred samples per measurement.
const SAMPLE_EVERY: Duration = Duration::from_millis(10);

/// The server's version and the settings that decide what a commit costs.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    pub version: String,
    pub settings: Vec<(&'static str, String)>,
}

pub async fn server_info<C: BenchConnection>(conn: &mut C) -> anyhow::Result<ServerInfo> {
    let (version, settings): (&str, &[&'static str]) = match C::BACKEND {
        Backend::Postgres => (
            "SELECT version()",
            &[
                "synchronous_commit",
                "fsync",
                "wal_sync_method",
                "shared_buffers",
                "max_wal_size",
            ],
        ),
        Backend::Mysql => (
            "SELECT VERSION()",
            &[
                "innodb_flush_log_at_trx_commit",
                "innodb_buffer_pool_size",
                "log_bin",
                "sync_binlog",
            ],
        ),
        Backend::Sqlite => (
            "SELECT 'SQLite ' || sqlite_version()",
            &["journal_mode", "synchronous"],
        ),
    };
    let version = first_text(conn, version).await?;
    let mut values = Vec::new();
    for &setting in settings {
        let query = match C::BACKEND {
            Backend::Postgres => format!("SELECT current_setting('{setting}')"),
            Backend::Mysql => format!("SELECT CAST(@@{setting} AS CHAR)"),
            Backend::Sqlite => format!("SELECT CAST({setting} AS TEXT) FROM pragma_{setting}"),
        };
        values.push((setting, first_text(conn, &query).await?));
    }
    Ok(ServerInfo {
        version,
        settings: values,
    })
}

async fn first_text<C: BenchConnection>(conn: &mut C, query: &str) -> anyhow::Result<String> {
    conn.query_texts(query.to_owned())
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("`{query}` returned no row"))
}

/// What one measurement cost beyond its time, totals over all its deliveries.
#[derive(Debug, Clone, Default)]
pub struct Diagnostics {
    /// Flushes to disk: PostgreSQL WAL syncs; InnoDB fsyncs, the redo log's included
    /// (with `innodb_flush_method = O_DIRECT` data files need none per commit).
    pub log_flushes: Option<i64>,
    /// Bytes written to the WAL or the redo log.
    pub log_bytes: Option<i64>,
    /// Where the consumers' backends spent their time, as samples per wait event
    /// (PostgreSQL only; `CPU` when running, `Client:ClientRead` when waiting for the
    /// next statement from the harness).
    pub waits: WaitSamples,
    /// CPU time of the harness's process: consumers, driver and progress bars.
    pub client_cpu: Option<Duration>,
    /// CPU time of the consumers' PostgreSQL backends, where the server is local.
    pub server_cpu: Option<Duration>,
}

/// The queries for [`Diagnostics::log_flushes`] and [`Diagnostics::log_bytes`].
fn counter_queries(backend: Backend) -> Option<[&'static str; 2]> {
    match backend {
        Backend::Postgres => Some([
            "SELECT wal_sync FROM pg_stat_wal",
            "SELECT wal_bytes::bigint FROM pg_stat_wal",
        ]),
        Backend::Mysql => Some([
            "SELECT CAST(VARIABLE_VALUE AS SIGNED) FROM information_schema.GLOBAL_STATUS
             WHERE VARIABLE_NAME = 'INNODB_DATA_FSYNCS'",
            "SELECT CAST(VARIABLE_VALUE AS SIGNED) FROM information_schema.GLOBAL_STATUS
             WHERE VARIABLE_NAME = 'INNODB_OS_LOG_WRITTEN'",
        ]),
        // SQLite keeps no such counters.
        Backend::Sqlite => None,
    }
}

/// A counter that cannot be read (another MySQL flavour, no permission) is left out
/// rather than failing the run.
async fn read_counter<C: BenchConnection>(conn: &mut C, query: &str) -> Option<i64> {
    conn.query_i64s(query.to_owned())
        .await
        .ok()
        .and_then(|values| values.into_iter().next())
}

/// A probe around one measurement.
pub struct Probe {
    before: [Option<i64>; 2],
    client_cpu: Option<Duration>,
    server_cpu: Option<Duration>,
    backend_pids: Vec<i64>,
    sampler: Option<Sampler>,
}

/// Samples per wait event.
type WaitSamples = HashMap<String, u64>;

/// The task sampling the consumers' PostgreSQL backends, and the switch that stops it.
struct Sampler {
    stop: watch::Sender<bool>,
    task: JoinHandle<anyhow::Result<WaitSamples>>,
}

impl Probe {
    /// Reads the counters and, on PostgreSQL, starts sampling the consumers' backends.
    pub async fn start<C: BenchConnection>(
        db: &TestDatabase<C>,
        admin: &mut C,
        consumers: &mut [C],
    ) -> anyhow::Result<Self> {
        let mut before = [None, None];
        if let Some(queries) = counter_queries(C::BACKEND) {
            for (value, query) in before.iter_mut().zip(queries) {
                *value = read_counter(admin, query).await;
            }
        }
        let mut backend_pids = Vec::new();
        let mut server_cpu = None;
        let mut sampler = None;
        if C::BACKEND == Backend::Postgres {
            for conn in consumers.iter_mut() {
                backend_pids.extend(
                    conn.query_i64s("SELECT pg_backend_pid()::bigint".to_owned())
                        .await?,
                );
            }
            server_cpu = backends_cpu_time(&backend_pids);
            let (stop, stopped) = watch::channel(false);
            let conn = connect(db).await?;
            let task = tokio::spawn(sample_waits(conn, pid_list(&backend_pids), stopped));
            sampler = Some(Sampler { stop, task });
        }
        Ok(Self {
            before,
            client_cpu: cpu_time("self"),
            server_cpu,
            backend_pids,
            sampler,
        })
    }

    /// Stops sampling, reads the CPU times, closes the consumers' connections and reads
    /// the log counters again: PostgreSQL backends publish their WAL statistics at exit.
    pub async fn finish<C: BenchConnection>(
        self,
        admin: &mut C,
        consumers: Vec<C>,
    ) -> anyhow::Result<Diagnostics> {
        let mut counters = Diagnostics {
            client_cpu: elapsed_cpu(self.client_cpu, cpu_time("self")),
            server_cpu: elapsed_cpu(self.server_cpu, backends_cpu_time(&self.backend_pids)),
            ..Diagnostics::default()
        };
        drop(consumers);
        if let Some(Sampler { stop, task }) = self.sampler {
            // A closed receiver means the sampler already ended; its result says why.
            let _ = stop.send(true);
            counters.waits = task.await??;
            wait_for_exit(admin, &self.backend_pids).await?;
        }
        if let Some([flushes, bytes]) = counter_queries(C::BACKEND) {
            let after_flushes = read_counter(admin, flushes).await;
            let after_bytes = read_counter(admin, bytes).await;
            counters.log_flushes = difference(self.before[0], after_flushes);
            counters.log_bytes = difference(self.before[1], after_bytes);
        }
        Ok(counters)
    }
}

fn difference(before: Option<i64>, after: Option<i64>) -> Option<i64> {
    Some(after? - before?)
}

fn elapsed_cpu(before: Option<Duration>, after: Option<Duration>) -> Option<Duration> {
    after?.checked_sub(before?)
}

/// User plus system CPU time of a process (`self` or a pid), all its threads included.
fn cpu_time(process: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{process}/stat")).ok()?;
    // Fields after the command name, which is parenthesised and may contain spaces:
    // state is the 3rd field, utime the 14th and stime the 15th.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // /proc counts in USER_HZ, which Linux fixes at 100 for user space.
    Some(Duration::from_millis(ticks * 10))
}

/// The summed CPU time of local PostgreSQL backends; `None` unless every pid is a local
/// `postgres` process (a remote server's pids mean nothing here).
fn backends_cpu_time(pids: &[i64]) -> Option<Duration> {
    pids.iter()
        .map(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            if comm.trim() != "postgres" {
                return None;
            }
            cpu_time(&pid.to_string())
        })
        .sum()
}

fn pid_list(pids: &[i64]) -> String {
    pids.iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Counts, until told to stop, what each of the consumers' backends is doing.
async fn sample_waits<C: BenchConnection>(
    mut conn: C,
    pids: String,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<WaitSamples> {
    let query = format!(
        "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU')
         FROM pg_stat_activity WHERE pid IN ({pids})"
    );
    let mut samples = HashMap::new();
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                for event in conn.query_texts(query.clone()).await? {
                    *samples.entry(event).or_default() += 1;
                }
            }
            _ = stop.changed() => return Ok(samples),
        }
    }
}

/// Waits until the given PostgreSQL backends have exited (and so published their
/// statistics), for at most a few seconds.
async fn wait_for_exit<C: BenchConnection>(admin: &mut C, pids: &[i64]) -> anyhow::Result<()> {
    let query = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE pid IN ({})",
        pid_list(pids)
    );
    for _ in 0..500 {
        if admin.query_i64s(query.clone()).await?.first() == Some(&0) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    anyhow::bail!("the consumers' PostgreSQL backends did not exit within 5 s")
}

/// The size of the inbox's unique index and, where the server tells, its depth.
#[derive(Debug, Clone)]
pub struct IndexShape {
    pub rows: u64,
    pub bytes: Option<i64>,
    pub levels: Option<i64>,
}

pub async fn index_shape<C: BenchConnection>(conn: &mut C, rows: u64) -> IndexShape {
    let bytes = match C::BACKEND {
        Backend::Postgres => format!("SELECT pg_relation_size('{INDEX_NAME}')"),
        // The table's only secondary index is the inbox's.
        Backend::Mysql => "SELECT CAST(index_length AS SIGNED) FROM information_schema.tables
                           WHERE table_schema = DATABASE() AND table_name = 'inbox'"
            .to_owned(),
        // Needs SQLite built with the dbstat table, as Debian's is.
        Backend::Sqlite => format!("SELECT sum(pgsize) FROM dbstat WHERE name = '{INDEX_NAME}'"),
    };
    let bytes = read_counter(conn, &bytes).await;
    // pageinspect's metapage gives the root's level; leaves are level 0.
    let levels = match C::BACKEND {
        Backend::Postgres => {
            let _ = conn
                .batch_execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
                .await;
            read_counter(
                conn,
                &format!("SELECT level::bigint + 1 FROM bt_metap('{INDEX_NAME}')"),
            )
            .await
        }
        Backend::Mysql | Backend::Sqlite => None,
    };
    IndexShape {
        rows,
        bytes,
        levels,
    }
}
