//! The cluster suite: exactly once across a three-node MariaDB Galera cluster, where a
//! transaction on one node does not wait for the same key on another, and certification
//! aborts the loser at its commit, or mid-body.
//!
//! `GALERA_URLS` names the three nodes (`scripts/galera.sh start` starts them on
//! 127.0.0.1:3311–3313); `GALERA_MESSAGES` sets how many messages the races deliver
//! (default 30; `.ci/run` keeps the default, the long run is in CONTRIBUTING.md).

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use diesel::result::Error;
use diesel_async::{AsyncConnection, AsyncMysqlConnection, SimpleAsyncConnection};
use diesel_inbox::testing::{TestDatabase, select_i64};
use diesel_inbox::{ErrorClass, Outcome, RetryPolicy, classify, idempotent, retry};
use tokio::sync::{Barrier, Notify};

use common::{Credit, TestDb, bounded};

/// The test's database, created through node 1 and replicated to the others.
#[derive(Clone)]
struct Cluster {
    db: TestDatabase<AsyncMysqlConnection>,
    /// Each node's server URL, without a database.
    servers: Vec<String>,
}

/// One cluster test at a time: one of them kills a node, which the others would feel.
/// (cargo-nextest, which runs each test in a process of its own, serialises them with
/// the `galera` test group in `.config/nextest.toml`.)
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn create(test: &str) -> Option<Cluster> {
    let urls = common::server_url(
        "GALERA_URLS",
        "mysql://root@127.0.0.1:3311/test,mysql://root@127.0.0.1:3312/test,mysql://root@127.0.0.1:3313/test",
    )?;
    let servers: Vec<String> = urls
        .split(',')
        .map(|url| {
            let (server, _database) = url.rsplit_once('/').expect("a URL ends with /<database>");
            server.to_owned()
        })
        .collect();
    assert_eq!(servers.len(), 3, "GALERA_URLS names three nodes");
    let db = TestDatabase::mysql(&format!("{}/test", servers[0]), &format!("galera_{test}"))
        .await
        .expect("create the test database on the cluster");
    Some(Cluster { db, servers })
}

impl Cluster {
    /// A connection to node `n` (0, 1 or 2).
    async fn node(&self, n: usize) -> Result<AsyncMysqlConnection, diesel::ConnectionError> {
        let url = format!("{}/{}", self.servers[n % 3], self.db.name());
        AsyncMysqlConnection::establish(&url).await
    }

    /// The common tables with `accounts` accounts, once every node has them: DDL and
    /// writes through node 1 reach the other nodes a moment later, and a delivery there
    /// must not find its table missing.
    async fn create_tables(&self, accounts: i64) {
        common::create_tables(self, accounts).await;
        let count = format!("SELECT COUNT(*) FROM {}.accounts", self.db.name());
        for server in &self.servers {
            let mut conn = AsyncMysqlConnection::establish(&format!("{server}/test"))
                .await
                .expect("connect to every node");
            conn.batch_execute("SET SESSION wsrep_sync_wait = 1")
                .await
                .expect("causal reads");
            let rows = select_i64(&mut conn, &count).await;
            assert_eq!(
                rows.expect("every node has the tables"),
                accounts,
                "{server}"
            );
        }
    }
}

impl TestDb for Cluster {
    type Conn = AsyncMysqlConnection;

    fn database(&self) -> &TestDatabase<AsyncMysqlConnection> {
        &self.db
    }

    /// Nodes do not wait for each other's keys: nothing to watch.
    async fn lock_waiters(&self) -> Option<i64> {
        None
    }

    /// A connection to node 1 whose reads wait until the node has applied everything the
    /// cluster committed before them (`wsrep_sync_wait`): the checks read what the
    /// handlers committed on any node, not a node's lagging view of it.
    async fn connect(&self) -> AsyncMysqlConnection {
        let mut conn = self.node(0).await.expect("connect to node 1");
        conn.batch_execute("SET SESSION wsrep_sync_wait = 1")
            .await
            .expect("causal reads");
        conn
    }
}

fn messages() -> i64 {
    std::env::var("GALERA_MESSAGES").map_or(30, |n| n.parse().expect("GALERA_MESSAGES is a number"))
}

/// Where a delivery stops inside its body until released, and whether it then carries
/// on past a failed statement.
#[derive(Default)]
struct Hold {
    entered: Notify,
    release: Notify,
    swallow: bool,
}

#[idempotent(consumer = "cluster-credit", key = credit.message_id.as_str(), fast_path = false)]
async fn cluster_credit(
    conn: &mut AsyncMysqlConnection,
    credit: &Credit,
    hold: Option<&Hold>,
) -> Result<(), Error> {
    conn.batch_execute(&format!(
        "UPDATE accounts SET balance = balance + 1 WHERE id = {}",
        credit.account
    ))
    .await?;
    if let Some(hold) = hold {
        hold.entered.notify_one();
        hold.release.notified().await;
        if hold.swallow {
            // A brute-force abort by another node's commit surfaces here; this handler
            // ignores it.
            let _ignored = conn
                .batch_execute("UPDATE accounts SET balance = balance WHERE id = 0")
                .await;
        }
    }
    Ok(())
}

/// A holds its marker on node 1 inside its body while B commits the same key on node 2:
/// B does not wait, and certification aborts A. A must end in a transient error, never
/// `Processed`, also when its body swallows the abort; its retry is a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_loser_across_nodes_is_transient_never_processed() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(cluster) = create("forced_overlap").await else {
        return;
    };
    bounded(async {
        cluster.create_tables(2).await;
        for (n, swallow) in [(0_i64, false), (1, true)] {
            let message = Credit::numbered(n);
            let hold = Arc::new(Hold {
                swallow,
                ..Hold::default()
            });
            let mut on_node_1 = cluster.node(0).await.unwrap();
            let first = tokio::spawn({
                let (hold, message) = (Arc::clone(&hold), message.clone());
                async move { cluster_credit(&mut on_node_1, &message, Some(&hold)).await }
            });
            hold.entered.notified().await;
            let mut on_node_2 = cluster.node(1).await.unwrap();
            assert_eq!(
                cluster_credit(&mut on_node_2, &message, None)
                    .await
                    .unwrap(),
                Outcome::Processed(()),
                "B on node 2 does not wait for A on node 1"
            );
            hold.release.notify_one();
            let error = first
                .await
                .unwrap()
                .expect_err("certification aborts A, which committed nothing");
            assert_eq!(
                classify(&error),
                ErrorClass::Transient,
                "swallowed: {swallow}: {error}"
            );

            let redelivered = retry(&RetryPolicy::new().with_max_retries(20), || {
                let (cluster, message) = (cluster.clone(), message.clone());
                async move {
                    let mut conn = cluster
                        .node(0)
                        .await
                        .map_err(|e| Error::QueryBuilderError(e.into()))?;
                    cluster_credit(&mut conn, &message, None).await
                }
            })
            .await
            .unwrap();
            assert_eq!(redelivered, Outcome::Duplicate);
        }
        assert_eq!(common::balances(&cluster, 2).await, vec![1, 1]);
    })
    .await;
    cluster.cleanup().await;
}

/// How the race's workers retry: patiently, since a node may be down.
fn cluster_retries() -> RetryPolicy {
    RetryPolicy::new()
        .with_max_retries(50)
        .with_max_delay(Duration::from_millis(200))
}

/// A connection to the node after the one `next` names, round-robin, so that a retry
/// moves on from a node that failed; a node that refuses is a retryable error.
async fn next_node(
    cluster: &Cluster,
    next: &std::sync::atomic::AtomicUsize,
) -> Result<AsyncMysqlConnection, Error> {
    let node = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    cluster.node(node).await.map_err(|error| {
        Error::DatabaseError(
            diesel::result::DatabaseErrorKind::ClosedConnection,
            Box::new(error.to_string()),
        )
    })
}

/// What one worker does with a delivery: run it through the retry helper, on a node
/// chosen round-robin, and move on to the next node when one fails.
async fn deliver(cluster: &Cluster, worker: usize, message: &Credit) -> Outcome<()> {
    let next = std::sync::atomic::AtomicUsize::new(worker);
    retry(&cluster_retries(), || async {
        let mut conn = next_node(cluster, &next).await?;
        cluster_credit(&mut conn, message, None).await
    })
    .await
    .unwrap_or_else(|error| panic!("{message:?} failed for good: {error}"))
}

/// A batch of credits in one transaction, delivered as [`deliver`] does one; returns how
/// many of its messages it processed.
async fn deliver_batch(cluster: &Cluster, worker: usize, batch: &[Credit]) -> usize {
    let next = std::sync::atomic::AtomicUsize::new(worker);
    retry(&cluster_retries(), || async {
        let mut conn = next_node(cluster, &next).await?;
        cluster_batch_credit(&mut conn, batch).await
    })
    .await
    .unwrap_or_else(|error| panic!("{batch:?} failed for good: {error}"))
    .processed()
}

#[idempotent(consumer = "cluster-batch", batch = credits, key = |credit| credit.message_id.as_str())]
async fn cluster_batch_credit(
    conn: &mut AsyncMysqlConnection,
    credits: &[Credit],
) -> Result<(), Error> {
    for credit in credits {
        conn.batch_execute(&format!(
            "UPDATE accounts SET balance = balance + 1 WHERE id = {}",
            credit.account
        ))
        .await?;
    }
    Ok(())
}

/// How the race's workers handle a delivery.
#[derive(Clone, Copy, PartialEq)]
enum Handler {
    Idempotent,
    /// In batches of two, each message's and the next one's, so that every batch
    /// overlaps the batches of the rounds before and after it.
    Batch,
    Naive,
}

/// Six workers spread over the three nodes; every message reaches all of them at once.
/// `kill` kills node 3 with SIGKILL halfway, then brings it back. Returns each
/// message's balance.
async fn race(cluster: &Cluster, handler: Handler, kill: bool) -> Vec<i64> {
    let messages = messages();
    cluster.create_tables(messages).await;
    let workers = 6;
    let barrier = Arc::new(Barrier::new(workers));
    let tasks: Vec<_> = (0..workers)
        .map(|worker| {
            let (cluster, barrier) = (cluster.clone(), Arc::clone(&barrier));
            tokio::spawn(async move {
                let mut processed = 0;
                for n in 0..messages {
                    barrier.wait().await;
                    if kill && worker == 0 && n == messages / 2 {
                        galera(&["kill", "3"]);
                    }
                    let message = Credit::numbered(n);
                    processed += match handler {
                        Handler::Idempotent => {
                            let outcome = deliver(&cluster, worker, &message).await;
                            usize::from(outcome == Outcome::Processed(()))
                        }
                        Handler::Batch => {
                            let batch = [message, Credit::numbered((n + 1) % messages)];
                            deliver_batch(&cluster, worker, &batch).await
                        }
                        Handler::Naive => {
                            let mut conn = cluster.node(worker).await.expect("the nodes are up");
                            let outcome = naive_credit(&mut conn, &message).await;
                            usize::from(outcome == Outcome::Processed(()))
                        }
                    };
                }
                processed
            })
        })
        .collect();
    let mut processed = 0;
    for task in tasks {
        processed += task.await.unwrap();
    }
    if kill {
        galera(&["restart", "3"]);
    } else if handler != Handler::Naive {
        // With a node killed, a delivery can commit there and lose its answer with the
        // connection: its retry is then the duplicate, and nobody sees `Processed`.
        assert_eq!(
            processed, messages as usize,
            "one delivery of each message processed it"
        );
    }
    if kill {
        let mut node_3 = cluster.node(2).await.unwrap();
        node_3
            .batch_execute("SET SESSION wsrep_sync_wait = 1")
            .await
            .unwrap();
        let mut node_1 = cluster.connect().await;
        let query = "SELECT COUNT(*) FROM inbox";
        assert_eq!(
            select_i64(&mut node_3, query).await.unwrap(),
            select_i64(&mut node_1, query).await.unwrap(),
            "the rejoined node has every marker"
        );
        let total = "SELECT SUM(balance) FROM accounts";
        assert_eq!(select_i64(&mut node_3, total).await.unwrap(), messages);
    }
    common::balances(cluster, messages).await
}

/// Check, then insert and credit in one transaction, on a table without a unique index:
/// the handler most people write first. A failed delivery is dropped.
async fn naive_credit(conn: &mut AsyncMysqlConnection, credit: &Credit) -> Outcome<()> {
    let seen = format!(
        "SELECT COUNT(*) FROM naive_inbox WHERE message_id = '{}' AND consumer = 'naive'",
        credit.message_id
    );
    if select_i64(conn, &seen).await.unwrap() > 0 {
        return Outcome::Duplicate;
    }
    let apply = format!(
        "BEGIN; INSERT INTO naive_inbox (message_id, consumer) VALUES ('{}', 'naive'); \
         UPDATE accounts SET balance = balance + 1 WHERE id = {}; COMMIT",
        credit.message_id, credit.account
    );
    match conn.batch_execute(&apply).await {
        Ok(()) => Outcome::Processed(()),
        Err(_) => {
            let _ = conn.batch_execute("ROLLBACK").await;
            Outcome::Duplicate
        }
    }
}

fn galera(args: &[&str]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/galera.sh");
    let status = std::process::Command::new(script)
        .args(args)
        .status()
        .expect("run scripts/galera.sh");
    assert!(status.success(), "scripts/galera.sh {args:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn races_across_nodes_apply_each_message_exactly_once() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(cluster) = create("race").await else {
        return;
    };
    let balances = bounded(race(&cluster, Handler::Idempotent, false)).await;
    assert_eq!(balances, vec![1; balances.len()]);
    cluster.cleanup().await;
}

/// The same race with batch handlers, each batch overlapping its neighbours: every
/// message is applied once, by one batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_across_nodes_apply_each_message_exactly_once() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(cluster) = create("batch_race").await else {
        return;
    };
    let balances = bounded(race(&cluster, Handler::Batch, false)).await;
    assert_eq!(balances, vec![1; balances.len()]);
    cluster.cleanup().await;
}

/// The same race loses a node to SIGKILL halfway: its workers move to the survivors, no
/// message is lost or applied twice, and the node rejoins with every marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_killed_mid_run_loses_no_message() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(cluster) = create("node_killed").await else {
        return;
    };
    let balances = bounded(race(&cluster, Handler::Idempotent, true)).await;
    assert_eq!(balances, vec![1; balances.len()]);
    cluster.cleanup().await;
}

/// The naive check-then-insert handler, in the same race across the nodes, applies some
/// message twice: the race is real.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_race_across_nodes_catches_the_naive_handler() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(cluster) = create("naive").await else {
        return;
    };
    let balances = bounded(race(&cluster, Handler::Naive, false)).await;
    assert!(
        balances.iter().any(|&balance| balance > 1),
        "the naive handler applied every message once: {balances:?}"
    );
    cluster.cleanup().await;
}

/// A certification conflict on a business row, with no inbox involved, is transient too;
/// a business unique violation stays permanent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn business_conflicts_are_classified_on_the_cluster() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(cluster) = create("business_conflicts").await else {
        return;
    };
    bounded(async {
        cluster.create_tables(1).await;
        let mut on_node_1 = cluster.node(0).await.unwrap();
        let mut on_node_2 = cluster.node(1).await.unwrap();
        on_node_1
            .batch_execute("BEGIN; UPDATE accounts SET balance = balance + 1 WHERE id = 0")
            .await
            .unwrap();
        on_node_2
            .batch_execute("UPDATE accounts SET balance = balance + 10 WHERE id = 0")
            .await
            .unwrap();
        let error = on_node_1
            .batch_execute("COMMIT")
            .await
            .expect_err("certification aborts the first");
        assert_eq!(classify(&error), ErrorClass::Transient, "{error}");

        on_node_1
            .batch_execute("INSERT INTO ledger (entry) VALUES ('once')")
            .await
            .unwrap();
        let error = on_node_2
            .batch_execute("INSERT INTO ledger (entry) VALUES ('once')")
            .await
            .expect_err("the entry exists");
        assert_eq!(classify(&error), ErrorClass::Permanent, "{error}");
    })
    .await;
    cluster.cleanup().await;
}

/// On a cluster the upgrade's `ALTER` runs in total order: the index ends on the digest
/// on every node, with every marker, and nothing else of the upgrade is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_upgrade_on_a_cluster_reaches_every_node() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(cluster) = create("upgrade").await else {
        return;
    };
    bounded(async {
        cluster.create_tables(1).await;
        let mut admin = cluster.connect().await;
        admin
            .batch_execute(
                "ALTER TABLE inbox DROP INDEX ux_inbox_message_consumer, DROP COLUMN key_digest, \
                 ADD UNIQUE INDEX ux_inbox_message_consumer (message_id, consumer); \
                 INSERT INTO inbox (message_id, consumer) SELECT UUID(), 'credit' FROM seq_1_to_1000",
            )
            .await
            .unwrap();
        let upgrade = diesel_inbox::upgrade_unique_index(&mut admin).await;
        assert_eq!(upgrade, Ok(diesel_inbox::schema::IndexUpgrade::Rebuilt));
        for node in 0..3 {
            let mut conn = cluster.node(node).await.unwrap();
            conn.batch_execute("SET SESSION wsrep_sync_wait = 1").await.unwrap();
            let on_digest = "SELECT COUNT(*) FROM information_schema.statistics \
                 WHERE table_schema = DATABASE() AND table_name = 'inbox' \
                 AND index_name = 'ux_inbox_message_consumer' AND column_name = 'key_digest'";
            assert_eq!(select_i64(&mut conn, on_digest).await, Ok(1), "node {node}");
            let left = "SELECT (SELECT COUNT(*) FROM information_schema.tables \
                 WHERE table_schema = DATABASE() AND table_name LIKE 'diesel_inbox_%') \
                 + (SELECT COUNT(*) FROM information_schema.triggers \
                 WHERE trigger_schema = DATABASE())";
            assert_eq!(select_i64(&mut conn, left).await, Ok(0), "node {node}");
            let markers = "SELECT COUNT(*) FROM inbox";
            assert_eq!(select_i64(&mut conn, markers).await, Ok(1000), "node {node}");
        }
    })
    .await;
    cluster.cleanup().await;
}

/// Credits account 0, then leaves the crate's COMMIT a transaction that is not the
/// marker's, with a savepoint of the crate's name in it: what a node leaves when another
/// node's commit aborts the transaction while the crate's `RELEASE SAVEPOINT` runs. The
/// server reports only a warning there, and the COMMIT after it, in the same batch, ends
/// a new, empty transaction. This body does the same by hand.
#[idempotent(consumer = "replaced", key = credit.message_id.as_str(), fast_path = false)]
async fn credit_in_a_replaced_transaction(
    conn: &mut AsyncMysqlConnection,
    credit: &Credit,
) -> Result<(), Error> {
    conn.batch_execute(
        "UPDATE accounts SET balance = balance + 1 WHERE id = 0; \
         ROLLBACK; SAVEPOINT diesel_inbox_marker",
    )
    .await
}

/// On a node, a COMMIT that ends a newer transaction does not pass for the marker's: the
/// call is transient and nothing commits, whether the connection's check after the
/// COMMIT is prepared by this call or was by an earlier one, and in whatever language
/// the server reports the failed check. Without that check the call returns `Processed`
/// for a message whose credit and marker were rolled back, and the message is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_commit_that_ends_a_newer_transaction_commits_nothing() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(cluster) = create("replaced_transaction").await else {
        return;
    };
    bounded(async {
        cluster.create_tables(1).await;
        let mut credited = 0;
        for (n, language) in (0..).zip(["en_US", "de_DE", "fr_FR", "ja_JP", "zh_CN"]) {
            let mut conn =
                common::connect_with(&cluster, &format!("SET lc_messages = '{language}'")).await;
            for attempt in ["first commit", "prepared"] {
                let message = Credit {
                    message_id: format!("msg-{n}-{attempt}"),
                    account: 0,
                    amount: 1,
                };
                let error = credit_in_a_replaced_transaction(&mut conn, &message)
                    .await
                    .expect_err("the marker's transaction is gone");
                assert_eq!(
                    classify(&error),
                    ErrorClass::Transient,
                    "{language}, {attempt}: {error}"
                );
                assert_eq!(common::balances(&cluster, 1).await, vec![credited]);
                // The session is as it was, and the redelivery is processed.
                assert_eq!(
                    select_i64(&mut conn, "SELECT @@autocommit").await.unwrap(),
                    1
                );
                assert_eq!(
                    common::credit(&mut conn, &message).await.unwrap(),
                    Outcome::Processed(())
                );
                credited += 1;
                assert_eq!(common::balances(&cluster, 1).await, vec![credited]);
            }
        }

        // A connection that moves to another database, where a statement prepared in
        // the first would read the first one's inbox, prepares the check again there.
        let Some(other) = create("replaced_transaction_other").await else {
            return;
        };
        other.create_tables(1).await;
        let mut conn = cluster.connect().await;
        let message = Credit::numbered(0);
        assert_eq!(
            common::credit(&mut conn, &message).await.unwrap(),
            Outcome::Processed(())
        );
        // Every id the other database's markers will take is a marker here, so a check
        // read in the wrong inbox would find one.
        conn.batch_execute(
            "INSERT IGNORE INTO inbox (id, message_id, consumer) \
             SELECT seq, CONCAT('filler-', seq), 'filler' FROM seq_1_to_1000",
        )
        .await
        .unwrap();
        conn.batch_execute(&format!("USE {}", other.db.name()))
            .await
            .unwrap();
        let error = credit_in_a_replaced_transaction(&mut conn, &message)
            .await
            .expect_err("the marker's transaction is gone");
        assert_eq!(classify(&error), ErrorClass::Transient, "{error}");
        assert_eq!(common::balances(&other, 1).await, vec![0]);
        assert_eq!(
            common::credit(&mut conn, &message).await.unwrap(),
            Outcome::Processed(())
        );
        assert_eq!(common::balances(&other, 1).await, vec![1]);
        other.cleanup().await;
    })
    .await;
    cluster.cleanup().await;
}

/// The claim-mode consumer of the partition test: its body is the external call, counted
/// per message by the test.
#[idempotent(consumer = "cluster-claim", key = credit.message_id.as_str(), claim,
             lease = Duration::from_secs(5))]
async fn cluster_claim(
    conn: &mut AsyncMysqlConnection,
    credit: &Credit,
    calls: &std::sync::Mutex<std::collections::HashMap<i64, u32>>,
) -> Result<(), Error> {
    *calls.lock().unwrap().entry(credit.account).or_default() += 1;
    Ok(())
}

/// How each kind of consumer in the partition test delivers a message.
#[derive(Clone, Copy, Debug)]
enum Consumer {
    Transactional,
    Batch,
    Claim,
}

/// What the partition test's consumers saw, counted as they saw it.
#[derive(Default)]
struct PartitionTally {
    /// Set while node 3 is outside the primary component.
    partitioned: std::sync::atomic::AtomicBool,
    /// Failed runs while it was, each retried.
    failed_while_partitioned: std::sync::atomic::AtomicUsize,
    /// Deliveries that ended in an error no retry fixes: each would be a dead letter.
    dead_letters: std::sync::Mutex<Vec<String>>,
    claim_calls: std::sync::Mutex<std::collections::HashMap<i64, u32>>,
}

impl PartitionTally {
    fn failed(&self) {
        if self.partitioned.load(std::sync::atomic::Ordering::Relaxed) {
            self.failed_while_partitioned
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Puts node 3 back into the cluster when dropped, even by a failing test, so that the
/// tests after it find three nodes.
struct Rejoin;

impl Drop for Rejoin {
    fn drop(&mut self) {
        galera(&["rejoin", "3"]);
    }
}

/// One consumer: delivers its messages in turn, each through the retry helper on a node
/// chosen round-robin (a retry moves on to the next node), patient enough to outlast the
/// partition.
async fn partition_consumer(
    cluster: Cluster,
    tally: Arc<PartitionTally>,
    consumer: Consumer,
    worker: usize,
    messages: std::ops::Range<i64>,
) {
    let policy = RetryPolicy::new()
        .with_max_retries(300)
        .with_max_delay(Duration::from_millis(200));
    let next = std::sync::atomic::AtomicUsize::new(worker);
    for n in messages {
        let message = Credit::numbered(n);
        let settled = retry(&policy, || async {
            let mut conn = next_node(&cluster, &next)
                .await
                .inspect_err(|_| tally.failed())?;
            let delivered = match consumer {
                Consumer::Transactional => cluster_credit(&mut conn, &message, None)
                    .await
                    .map(|outcome| outcome.is_processed()),
                Consumer::Batch => cluster_batch_credit(&mut conn, std::slice::from_ref(&message))
                    .await
                    .map(|batch| batch.processed() == 1),
                // A live claim elsewhere (taken by a delivery that lost its answer in the
                // partition) comes back later, as a broker would redeliver it.
                Consumer::Claim => {
                    match cluster_claim(&mut conn, &message, &tally.claim_calls).await {
                        Ok(Outcome::InProgress { .. }) => Err(Error::DatabaseError(
                            diesel::result::DatabaseErrorKind::SerializationFailure,
                            Box::new(String::from("held by a live claim")),
                        )),
                        other => other.map(|outcome| outcome.is_processed()),
                    }
                }
            };
            delivered.inspect_err(|_| tally.failed())
        })
        .await;
        if let Err(error) = settled {
            let class = classify(&error);
            tally
                .dead_letters
                .lock()
                .unwrap()
                .push(format!("{consumer:?} {n}: {class:?}: {error}"));
        }
    }
}

/// Node 3 is cut off from the others mid-run, as a network partition does, while
/// transactional, batch and claim-mode consumers deliver through all three nodes, then
/// joins again. Statements sent to it once it has left the primary component get 1047,
/// and a commit in flight as it leaves gets 1180 ("Not connected to Primary
/// Component"): every one of them is retried on another node, nothing is dead-lettered,
/// every message is applied once, and every claim completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partitioned_node_dead_letters_nothing() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(cluster) = create("partition").await else {
        return;
    };
    // Each consumer kind has messages and accounts of its own.
    let per_kind = 4 * messages();
    bounded(async {
        cluster.create_tables(3 * per_kind).await;
        let tally = Arc::new(PartitionTally::default());
        let mut consumers = Vec::new();
        for (k, consumer) in [Consumer::Transactional, Consumer::Batch, Consumer::Claim]
            .into_iter()
            .enumerate()
        {
            // Two workers per kind, each with half of the kind's messages.
            for half in 0..2 {
                let start = k as i64 * per_kind + half * per_kind / 2;
                consumers.push(tokio::spawn(partition_consumer(
                    cluster.clone(),
                    Arc::clone(&tally),
                    consumer,
                    2 * k + half as usize,
                    start..start + per_kind / 2,
                )));
            }
        }

        // The partition, once deliveries are under way.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let rejoin = Rejoin;
        galera(&["isolate", "3"]);
        let mut node_3 = cluster.node(2).await.expect("node 3");
        let left = async {
            loop {
                let status = select_text(&mut node_3, "wsrep_cluster_status").await;
                if status != "Primary" {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), left)
            .await
            .expect("node 3 leaves the primary component");
        tally
            .partitioned
            .store(true, std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(3)).await;
        tally
            .partitioned
            .store(false, std::sync::atomic::Ordering::Relaxed);
        drop(rejoin);

        for consumer in consumers {
            consumer.await.expect("a consumer panicked");
        }
        let dead_letters = tally.dead_letters.lock().unwrap().clone();
        assert!(dead_letters.is_empty(), "dead-lettered: {dead_letters:#?}");
        let failed = tally
            .failed_while_partitioned
            .load(std::sync::atomic::Ordering::Relaxed);
        assert!(failed > 0, "no delivery met the partition");

        // Transactional and batch consumers credit their accounts once each.
        let balances = common::balances(&cluster, 3 * per_kind).await;
        assert_eq!(
            balances[..2 * per_kind as usize],
            vec![1; 2 * per_kind as usize]
        );
        // Every claim completed, at its first attempt or at a takeover's.
        let mut conn = cluster.connect().await;
        let consumer = "consumer = 'cluster-claim'";
        let count = |condition: &str| {
            format!("SELECT COUNT(*) FROM inbox WHERE {consumer} AND {condition}")
        };
        assert_eq!(
            select_i64(&mut conn, &count("lease_ends_at IS NULL"))
                .await
                .unwrap(),
            per_kind,
            "every claim completed"
        );
        assert_eq!(
            select_i64(&mut conn, &count("attempts > 2")).await.unwrap(),
            0,
            "no claim taken over more than once"
        );
        let calls = tally.claim_calls.lock().unwrap().clone();
        assert_eq!(calls.len() as i64, per_kind, "every claim's call was made");
        eprintln!(
            "partition: {failed} runs failed while node 3 was outside the primary component; \
             {} claim calls for {per_kind} claims",
            calls.values().sum::<u32>()
        );
    })
    .await;
    cluster.cleanup().await;
}

/// A status variable of the node `conn` is connected to; SHOW STATUS answers on a node
/// outside the primary component too.
async fn select_text(conn: &mut AsyncMysqlConnection, variable: &str) -> String {
    #[derive(diesel::QueryableByName)]
    struct Status {
        #[diesel(sql_type = diesel::sql_types::Text)]
        #[diesel(column_name = Value)]
        value: String,
    }
    let query = format!("SHOW STATUS LIKE '{variable}'");
    let status: Status = diesel_async::RunQueryDsl::get_result(diesel::sql_query(query), conn)
        .await
        .expect("SHOW STATUS");
    status.value
}

/// A claim-mode handler that may fail at most twice: its third delivery is refused.
#[idempotent(consumer = "cluster-exhausting", key = credit.message_id.as_str(), claim,
             max_attempts = 2)]
async fn exhausting_claim(
    conn: &mut AsyncMysqlConnection,
    credit: &Credit,
    fail: bool,
) -> Result<(), Error> {
    if fail {
        Err(Error::RollbackTransaction)
    } else {
        Ok(())
    }
}

/// An operator releases an exhausted claim on node 1, right after unrelated writes that
/// node 2 takes a while to apply, and the message is redelivered on node 2 at once. Read
/// from node 2's lagging view, the claim was still exhausted: `AttemptsExhausted`,
/// `Permanent`, and the message went back to the dead letters. A refusal is read from
/// the cluster's latest commits now, and the redelivery runs the body (after a transient
/// error or two, where its read met the release being applied).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operators_release_is_seen_on_every_node() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(cluster) = create("release_by_hand").await else {
        return;
    };
    bounded(async {
        let mut node_1 = cluster.node(0).await.expect("node 1");
        let mut node_2 = cluster.node(1).await.expect("node 2");
        node_1
            .batch_execute("CREATE TABLE traffic (id BIGINT AUTO_INCREMENT PRIMARY KEY, pad TEXT)")
            .await
            .expect("create traffic");
        for run in 0..(messages() / 6).max(3) {
            let credit = Credit::numbered(run);
            for _ in 0..2 {
                exhausting_claim(&mut node_1, &credit, true)
                    .await
                    .expect_err("the body fails");
            }
            let refused = exhausting_claim(&mut node_1, &credit, false)
                .await
                .expect_err("exhausted");
            assert_eq!(
                diesel_inbox::InboxError::find(&refused),
                Some(&diesel_inbox::InboxError::Claim(
                    diesel_inbox::ClaimError::AttemptsExhausted { attempts: 2 }
                ))
            );

            node_1
                .batch_execute(
                    "INSERT INTO traffic (pad) SELECT REPEAT('x', 100) FROM seq_1_to_20000",
                )
                .await
                .expect("unrelated traffic");
            let released = diesel_inbox::claims::release_by_hand(
                &mut node_1,
                "cluster-exhausting",
                &credit.message_id,
            )
            .await;
            assert!(released.expect("release by hand"), "run {run}");
            // A brute-force abort of the redelivery's read by node 1's release, still
            // being applied, is transient: the broker delivers it again.
            let mut retries = 0;
            let redelivered = loop {
                let result = exhausting_claim(&mut node_2, &credit, false).await;
                if let Some(outcome) = common::settled(result, &run, &mut retries) {
                    break outcome;
                }
            };
            assert_eq!(redelivered, Outcome::Processed(()), "run {run}");
        }
    })
    .await;
    cluster.cleanup().await;
}

/// Each message's bodies: how many ran, and the most that ever ran at once.
#[derive(Default)]
struct Bodies(std::sync::Mutex<std::collections::HashMap<i64, (u32, u32, u32)>>);

impl Bodies {
    async fn run(&self, account: i64) {
        {
            let mut bodies = self.0.lock().unwrap();
            let (running, total, most) = bodies.entry(account).or_default();
            *running += 1;
            *total += 1;
            *most = (*most).max(*running);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.0.lock().unwrap().get_mut(&account).unwrap().0 -= 1;
    }
}

#[idempotent(consumer = "cluster-stalled", key = credit.message_id.as_str(), claim,
             lease = Duration::from_secs(2))]
async fn stalled_claim(
    conn: &mut AsyncMysqlConnection,
    credit: &Credit,
    bodies: &Bodies,
) -> Result<(), Error> {
    bodies.run(credit.account).await;
    Ok(())
}

/// Starts node 2 again when dropped, even by a failing test, so that the tests after it
/// find three nodes.
struct Restart2;

impl Drop for Restart2 {
    fn drop(&mut self) {
        galera(&["restart", "2"]);
    }
}

/// Node 2 is killed, and claims made on node 1 at once take seconds to commit while the
/// cluster waits out the dead node: longer than their 2-second lease. Copies of the same
/// messages delivered on node 3 meanwhile find the leases ended and take the claims over.
/// A body must never start on a claim whose lease is used up: both bodies then ran at
/// once. Now the claim is renewed first, or given up when taken over, and no two bodies
/// of a message ever overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_claim_commit_never_overlaps_bodies() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(cluster) = create("stalled_claim").await else {
        return;
    };
    bounded(async {
        let bodies = Arc::new(Bodies::default());
        let mut connections = Vec::new();
        for node in [0, 2] {
            for _ in 0..3 {
                connections.push(cluster.node(node).await.expect("connect"));
            }
        }
        let restart = Restart2;
        galera(&["kill", "2"]);
        let mut deliveries = Vec::new();
        for (n, mut conn) in connections.into_iter().enumerate() {
            let bodies = Arc::clone(&bodies);
            deliveries.push(tokio::spawn(async move {
                if n >= 3 {
                    // The copies, on node 3, once node 1's claims have been waiting.
                    tokio::time::sleep(Duration::from_secs(3)).await;
                }
                stalled_claim(&mut conn, &Credit::numbered(n as i64 % 3), &bodies).await
            }));
        }
        for delivery in deliveries {
            let settled = delivery.await.expect("a delivery panicked");
            if let Err(error) = &settled {
                assert_ne!(classify(error), ErrorClass::Permanent, "{error}");
            }
        }

        // Redeliveries complete every message.
        let mut conn = cluster.node(0).await.expect("node 1");
        for n in 0..3 {
            let credit = Credit::numbered(n);
            let mut completed = false;
            for _ in 0..20 {
                match stalled_claim(&mut conn, &credit, &bodies).await {
                    Ok(Outcome::Processed(()) | Outcome::Duplicate) => {
                        completed = true;
                        break;
                    }
                    _ => tokio::time::sleep(Duration::from_millis(500)).await,
                }
            }
            assert!(completed, "message {n} completed");
        }
        let bodies = bodies.0.lock().unwrap().clone();
        eprintln!("stalled claims: bodies (running, run, most at once) per message: {bodies:?}");
        for (account, (_, _, most)) in bodies {
            assert_eq!(most, 1, "message {account}: bodies overlapped");
        }
        drop(restart);
    })
    .await;
    cluster.cleanup().await;
}

/// Three relays, one on each node, take from one outbox at once. `SKIP LOCKED` skips
/// only the rows taken on the same node; two nodes taking the same message conflict at
/// certification, and the loser's take fails, retryably, and is tried again. Every
/// message goes to exactly one relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relays_on_every_node_take_each_outbox_message_once() {
    use diesel_inbox::outbox::{self, OutboxMessage};

    let _alone = ONE_AT_A_TIME.lock().await;
    let Some(cluster) = create("outbox_relays").await else {
        return;
    };
    let mut conn = cluster.connect().await;
    outbox::migrate(&mut conn)
        .await
        .expect("migrate the outbox");
    let total = messages() * 4;
    for n in 0..total {
        let message = OutboxMessage::new("accounts", n.to_string().into_bytes())
            .ordering_key(format!("key-{}", n % 5));
        outbox::enqueue(&mut conn, message).await.expect("enqueue");
    }
    let published = bounded(async {
        let mut relays = Vec::new();
        for node in 0..3 {
            let cluster = cluster.clone();
            relays.push(tokio::spawn(async move {
                let mut conn = cluster.node(node).await.expect("connect");
                let (mut published, mut lost_certification, mut idle) = (Vec::new(), 0, 0);
                while idle < 10 {
                    let taken = match outbox::take(&mut conn, Duration::from_secs(30), 3).await {
                        Ok(taken) => taken,
                        Err(error) => {
                            assert_ne!(classify(&error), ErrorClass::Permanent, "{error}");
                            lost_certification += 1;
                            continue;
                        }
                    };
                    if taken.is_empty() {
                        idle += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    idle = 0;
                    for taken in &taken {
                        let n: i64 = String::from_utf8_lossy(taken.message().payload())
                            .parse()
                            .expect("a number");
                        published.push(n);
                    }
                    let ids: Vec<i64> = taken.iter().map(|t| t.message().row_id()).collect();
                    // A mark that fails leaves its messages taken until the lease ends,
                    // after the test: a message taken twice shows as published twice.
                    if let Err(error) = outbox::sent_all(&mut conn, taken).await {
                        eprintln!("node {node}: marking {ids:?} sent failed: {error}");
                    }
                }
                (published, lost_certification)
            }));
        }
        let mut published = Vec::new();
        for relay in relays {
            let (taken, lost) = relay.await.expect("a relay");
            eprintln!(
                "a relay published {} and lost {lost} takes at certification",
                taken.len()
            );
            published.extend(taken);
        }
        published
    })
    .await;
    let mut published = published;
    published.sort_unstable();
    assert_eq!(
        published,
        (0..total).collect::<Vec<_>>(),
        "every message once"
    );
    assert_eq!(
        select_i64(
            &mut conn,
            "SELECT COUNT(*) FROM inbox_outbox WHERE sent_at IS NULL"
        )
        .await
        .expect("count"),
        0
    );
    drop(conn);
    cluster.cleanup().await;
}
