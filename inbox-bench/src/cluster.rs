//! A MariaDB Galera cluster (multi-primary): its nodes, where each consumer connects, and
//! waiting until every node has applied what the run wrote through the first.
//!
//! Every node takes writes, and a commit on one is certified on all of them before it
//! returns; the other nodes apply it a moment later. The run's database is created and
//! reset through the first node, so every node must be seen to have caught up before the
//! consumers start, and the checks afterwards read with `wsrep_sync_wait`.

use anyhow::{Context as _, bail, ensure};
use diesel_async::{AsyncConnection, AsyncMysqlConnection, SimpleAsyncConnection};
use diesel_inbox::testing::select_i64;

/// The cluster's nodes, as `GALERA_URLS` names them.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// The first node's URL as given, through which the run's database is administered.
    pub admin_url: String,
    /// Each node's server URL, without a database.
    servers: Vec<String>,
}

impl Cluster {
    /// The cluster `GALERA_URLS` names (comma-separated `mysql://…/<database>` URLs, at
    /// least two), or why it is skipped.
    pub fn from_env() -> Result<Self, String> {
        let example = "mysql://root@127.0.0.1:3311/test,mysql://root@127.0.0.1:3312/test,\
                       mysql://root@127.0.0.1:3313/test";
        let urls = match std::env::var("GALERA_URLS") {
            Ok(urls) if !urls.is_empty() => urls,
            _ => {
                return Err(format!(
                    "skipping {NAME}: GALERA_URLS is not set (for example GALERA_URLS={example}, \
                     the cluster that scripts/galera.sh start starts)"
                ));
            }
        };
        Self::parse(&urls).map_err(|error| format!("skipping {NAME}: {error:#}"))
    }

    fn parse(urls: &str) -> anyhow::Result<Self> {
        let urls: Vec<&str> = urls.split(',').map(str::trim).collect();
        let mut servers = Vec::new();
        for url in &urls {
            let server = url
                .strip_prefix("mysql://")
                .and_then(|rest| rest.rsplit_once('/'))
                .map(|(host, _database)| format!("mysql://{host}"));
            servers.push(server.with_context(|| {
                format!("GALERA_URLS: `{url}` is not a mysql://host/database URL")
            })?);
        }
        ensure!(
            servers.len() >= 2,
            "GALERA_URLS names one node; a cluster has several"
        );
        Ok(Self {
            admin_url: urls[0].to_owned(),
            servers,
        })
    }

    pub fn nodes(&self) -> usize {
        self.servers.len()
    }

    /// Node `n`'s URL of `database`.
    pub fn node_url(&self, n: usize, database: &str) -> String {
        format!("{}/{database}", self.servers[n])
    }

    /// A connection to node `n` whose reads wait until the node has applied everything
    /// the cluster committed before them.
    pub async fn causal(&self, n: usize, database: &str) -> anyhow::Result<AsyncMysqlConnection> {
        let url = self.node_url(n, database);
        let mut conn = AsyncMysqlConnection::establish(&url)
            .await
            .with_context(|| format!("connect to {url}"))?;
        conn.batch_execute("SET SESSION wsrep_sync_wait = 1")
            .await
            .with_context(|| format!("causal reads on {url}"))?;
        Ok(conn)
    }
}

/// What the report calls the cluster.
pub const NAME: &str = "MariaDB Galera";

/// Waits until every node's `accounts` holds `accounts` rows and its inbox is empty, as
/// the first node left them: after the tables are created, and after each reset (a
/// `TRUNCATE` through the first node, which a transaction on another node that has not
/// applied it yet would conflict with).
pub async fn wait_for_every_node(
    nodes: &mut [AsyncMysqlConnection],
    accounts: i64,
) -> anyhow::Result<()> {
    for (n, conn) in nodes.iter_mut().enumerate() {
        let seen = select_i64(conn, "SELECT COUNT(*) FROM accounts").await?;
        let markers = select_i64(conn, "SELECT COUNT(*) FROM inbox").await?;
        if seen != accounts || markers != 0 {
            bail!(
                "node {}: {seen} accounts and {markers} markers after a causal read, \
                 where the first node has {accounts} and none",
                n + 1
            );
        }
    }
    Ok(())
}

/// Where a measurement's consumers connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Every consumer on the first node: the others only apply its writes.
    OneNode,
    /// Consumer `i` on node `i mod n`: every node executes a share and applies the rest.
    EveryNode,
}

impl Placement {
    /// The order of one round: alternated from round to round, so that neither placement
    /// always runs first after a reset.
    pub fn order(round: u32) -> [Self; 2] {
        if round.is_multiple_of(2) {
            [Self::OneNode, Self::EveryNode]
        } else {
            [Self::EveryNode, Self::OneNode]
        }
    }

    /// The node consumer `consumer` connects to, of `nodes`.
    pub fn node(self, consumer: usize, nodes: usize) -> usize {
        match self {
            Self::OneNode => 0,
            Self::EveryNode => consumer % nodes,
        }
    }

    pub fn label(self, nodes: usize) -> String {
        match self {
            Self::OneNode => "one node".to_owned(),
            Self::EveryNode => format!("{nodes} nodes"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_the_nodes() {
        let cluster = Cluster::parse(
            "mysql://root@127.0.0.1:3311/test, mysql://root@127.0.0.1:3312/test,mysql://root@h:3313/x",
        )
        .unwrap();
        assert_eq!(cluster.nodes(), 3);
        assert_eq!(cluster.admin_url, "mysql://root@127.0.0.1:3311/test");
        assert_eq!(cluster.node_url(2, "db"), "mysql://root@h:3313/db");
        assert!(Cluster::parse("mysql://root@127.0.0.1:3311/test").is_err());
        assert!(Cluster::parse("postgres://a/b,postgres://c/d").is_err());
    }

    #[test]
    fn consumers_spread_round_robin() {
        let nodes: Vec<usize> = (0..5).map(|c| Placement::EveryNode.node(c, 3)).collect();
        assert_eq!(nodes, [0, 1, 2, 0, 1]);
        assert_eq!(Placement::OneNode.node(4, 3), 0);
        assert_ne!(Placement::order(0), Placement::order(1));
    }
}
