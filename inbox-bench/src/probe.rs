//! What bounds a measurement: log flushes and log volume on the server before and after
//! it, the CPU time the harness and (on a local PostgreSQL) the consumers' backends
//! spent, on PostgreSQL what those backends were waiting for while it ran, and on a
//! Galera cluster each node's replication counters and CPU time. The log counters are
//! server-wide, so other load on the server shows up in them.

use std::collections::HashMap;
use std::time::Duration;

use diesel_async::AsyncMysqlConnection;
use diesel_inbox::schema::INDEX_NAME;
use diesel_inbox::testing::TestDatabase;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::backend::Backend;
use crate::connection::{BenchConnection, Statements as _, connect};

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

/// What a Galera node says about its cluster: the provider, the size, the appliers, and
/// the apply queue's length at which flow control holds every node's commits.
pub async fn cluster_settings(
    conn: &mut AsyncMysqlConnection,
) -> anyhow::Result<Vec<(&'static str, String)>> {
    let status = |name: &str| {
        format!(
            "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
             WHERE VARIABLE_NAME = '{name}'"
        )
    };
    let options = first_text(conn, "SELECT @@wsrep_provider_options").await?;
    let fc_limit = options
        .split(';')
        .filter_map(|option| option.split_once('='))
        .find(|(name, _)| name.trim() == "gcs.fc_limit")
        .map_or_else(
            || "unknown".to_owned(),
            |(_, value)| value.trim().to_owned(),
        );
    Ok(vec![
        (
            "wsrep_provider_version",
            first_text(conn, &status("WSREP_PROVIDER_VERSION")).await?,
        ),
        (
            "wsrep_cluster_size",
            first_text(conn, &status("WSREP_CLUSTER_SIZE")).await?,
        ),
        (
            "wsrep_slave_threads",
            first_text(conn, "SELECT CAST(@@wsrep_slave_threads AS CHAR)").await?,
        ),
        ("gcs.fc_limit", fc_limit),
    ])
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
    /// On a Galera cluster, what each node did, in node order.
    pub nodes: Vec<NodeCosts>,
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

/// What one node of a Galera cluster did during a measurement, from its `wsrep_%` status
/// counters and its process's CPU time.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeCosts {
    /// Write-sets the node replicated: the commits its own clients made.
    pub replicated: i64,
    pub replicated_bytes: i64,
    /// Write-sets the node received from the others, to certify and apply.
    pub received: i64,
    /// Its clients' transactions that failed certification against another node's
    /// commit (a deadlock error at COMMIT).
    pub cert_failures: i64,
    /// Its clients' transactions aborted by an applier mid-body (brute-force aborts).
    pub bf_aborts: i64,
    /// Time the node's commits were held by flow control: some node's apply queue was
    /// longer than `gcs.fc_limit`.
    pub flow_control_paused: Duration,
    /// Flow-control pauses this node asked for.
    pub flow_control_sent: i64,
    /// The sum of every account's balance as this node sees it, once it has applied
    /// everything committed before the measurement ended.
    pub credits: i64,
    /// CPU time of the node's server process, where it runs on this machine.
    pub cpu: Option<Duration>,
}

/// The `wsrep_%` counters of [`NodeCosts`], in its field order.
const WSREP_COUNTERS: [&str; 7] = [
    "WSREP_REPLICATED",
    "WSREP_REPLICATED_BYTES",
    "WSREP_RECEIVED",
    "WSREP_LOCAL_CERT_FAILURES",
    "WSREP_LOCAL_BF_ABORTS",
    "WSREP_FLOW_CONTROL_PAUSED_NS",
    "WSREP_FLOW_CONTROL_SENT",
];

/// A probe of every node around one measurement, on connections whose reads wait until
/// their node has applied what the cluster committed (`wsrep_sync_wait`), so that the
/// counters and the CPU time after it include the appliers' work.
pub struct ClusterProbe {
    before: Vec<NodeCosts>,
    pids: Vec<Option<i64>>,
}

impl ClusterProbe {
    pub async fn start(nodes: &mut [AsyncMysqlConnection]) -> anyhow::Result<Self> {
        let mut pids = Vec::with_capacity(nodes.len());
        let mut before = Vec::with_capacity(nodes.len());
        for conn in nodes.iter_mut() {
            let pid = server_pid(conn).await;
            before.push(node_costs(conn, pid).await?);
            pids.push(pid);
        }
        Ok(Self { before, pids })
    }

    /// Each node's costs since [`ClusterProbe::start`]; `credits` is its total, not a
    /// difference.
    pub async fn finish(
        self,
        nodes: &mut [AsyncMysqlConnection],
    ) -> anyhow::Result<Vec<NodeCosts>> {
        let mut costs = Vec::with_capacity(nodes.len());
        for ((conn, before), pid) in nodes.iter_mut().zip(self.before).zip(self.pids) {
            let after = node_costs(conn, pid).await?;
            costs.push(NodeCosts {
                replicated: after.replicated - before.replicated,
                replicated_bytes: after.replicated_bytes - before.replicated_bytes,
                received: after.received - before.received,
                cert_failures: after.cert_failures - before.cert_failures,
                bf_aborts: after.bf_aborts - before.bf_aborts,
                flow_control_paused: after
                    .flow_control_paused
                    .saturating_sub(before.flow_control_paused),
                flow_control_sent: after.flow_control_sent - before.flow_control_sent,
                credits: after.credits,
                cpu: elapsed_cpu(before.cpu, after.cpu),
            });
        }
        Ok(costs)
    }
}

/// The node's counters now. The balances are read first: a causal read, it waits until
/// the node has applied everything committed before it, and the counters after it.
async fn node_costs(
    conn: &mut AsyncMysqlConnection,
    pid: Option<i64>,
) -> anyhow::Result<NodeCosts> {
    let credits = crate::setup::credits(conn).await?;
    let mut values = [0; WSREP_COUNTERS.len()];
    for (value, name) in values.iter_mut().zip(WSREP_COUNTERS) {
        let query = format!(
            "SELECT CAST(VARIABLE_VALUE AS SIGNED) FROM information_schema.GLOBAL_STATUS
             WHERE VARIABLE_NAME = '{name}'"
        );
        *value = conn
            .query_i64s(query)
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| anyhow::anyhow!("no status variable {name}: is this a Galera node?"))?;
    }
    let [
        replicated,
        replicated_bytes,
        received,
        cert_failures,
        bf_aborts,
        paused,
        sent,
    ] = values;
    Ok(NodeCosts {
        replicated,
        replicated_bytes,
        received,
        cert_failures,
        bf_aborts,
        flow_control_paused: Duration::from_nanos(paused.max(0) as u64),
        flow_control_sent: sent,
        credits,
        cpu: pid.and_then(|pid| cpu_time(&pid.to_string())),
    })
}

/// The pid of the node's `mariadbd`, from its pid file, if it runs on this machine and
/// the file is readable.
async fn server_pid(conn: &mut AsyncMysqlConnection) -> Option<i64> {
    let path = conn
        .query_texts("SELECT @@pid_file".to_owned())
        .await
        .ok()?
        .into_iter()
        .next()?;
    let pid: i64 = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    matches!(comm.trim(), "mariadbd" | "mysqld").then_some(pid)
}
