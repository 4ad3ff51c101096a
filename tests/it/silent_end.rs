//! A MySQL/MariaDB transaction that ends between a batch's marker inserts without an
//! error reaching the handler: what a Galera node can leave when another node's commit
//! aborts the transaction (seen on a three-node cluster: after a duplicate's 1062, the
//! statements that followed ran outside any transaction). Forced here on one server, by
//! a connection that ends its own transaction at a chosen insert while another
//! delivery commits the same batch's new message.

use crate::common;
use crate::mysql;

use diesel::QueryResult;
use diesel::connection::{CacheSize, Instrumentation};
use diesel::mysql::Mysql;
use diesel::query_builder::{AsQuery, QueryFragment, QueryId};
use diesel_async::{
    AnsiTransactionManager, AsyncConnection, AsyncConnectionCore, AsyncMysqlConnection,
    SimpleAsyncConnection,
};
use diesel_inbox::{ErrorClass, classify};
use futures_util::future::BoxFuture;

use common::{Credit, TestDb, bounded};

/// A connection that, at the single-row marker insert of [`Interrupting::at`]'s key, ends
/// its transaction, lets [`Interrupting::other`] deliver `at`'s batch, then runs the
/// insert outside the transaction.
struct Interrupting {
    conn: AsyncMysqlConnection,
    other: AsyncMysqlConnection,
    /// The key whose insert is interrupted, and the batch the other connection delivers
    /// then (none when empty).
    at: Option<(String, Vec<Credit>)>,
}

impl Interrupting {
    /// Whether `statement` is the single-row marker insert to interrupt: its key is
    /// bound as the hex digits of its bytes.
    fn interrupts(&self, statement: &str) -> bool {
        self.at.as_ref().is_some_and(|(key, _)| {
            statement.contains("INSERT INTO inbox (")
                && statement.contains(&format!("\"{}\"", common::keys::utf8_hex(key)))
                && statement
                    .matches(
                        "(UNHEX(CONVERT(? USING ascii)), UNHEX(CONVERT(? USING ascii)), DEFAULT)",
                    )
                    .count()
                    == 1
        })
    }
}

impl SimpleAsyncConnection for Interrupting {
    async fn batch_execute(&mut self, query: &str) -> QueryResult<()> {
        self.conn.batch_execute(query).await
    }
}

impl AsyncConnectionCore for Interrupting {
    type ExecuteFuture<'conn, 'query> = BoxFuture<'conn, QueryResult<usize>>;
    type LoadFuture<'conn, 'query> =
        <AsyncMysqlConnection as AsyncConnectionCore>::LoadFuture<'conn, 'query>;
    type Stream<'conn, 'query> =
        <AsyncMysqlConnection as AsyncConnectionCore>::Stream<'conn, 'query>;
    type Row<'conn, 'query> = <AsyncMysqlConnection as AsyncConnectionCore>::Row<'conn, 'query>;
    type Backend = Mysql;

    fn load<'conn, 'query, T>(&'conn mut self, source: T) -> Self::LoadFuture<'conn, 'query>
    where
        T: AsQuery + 'query,
        T::Query: QueryFragment<Mysql> + QueryId + 'query,
    {
        self.conn.load(source)
    }

    fn execute_returning_count<'conn, 'query, T>(
        &'conn mut self,
        source: T,
    ) -> Self::ExecuteFuture<'conn, 'query>
    where
        T: QueryFragment<Mysql> + QueryId + 'query,
    {
        let statement = diesel::debug_query::<Mysql, _>(&source).to_string();
        if !self.interrupts(&statement) {
            return self.conn.execute_returning_count(source);
        }
        let (key, batch) = self.at.take().expect("interrupted once");
        let Self { conn, other, .. } = self;
        Box::pin(async move {
            conn.batch_execute("ROLLBACK").await?;
            if !batch.is_empty() {
                let delivered = common::batch::batch_credit(other, &batch).await?;
                assert_eq!(delivered.processed(), batch.len(), "the other delivery");
            }
            // The insert, outside the transaction.
            conn.batch_execute(&format!(
                "INSERT INTO inbox (message_id, consumer) VALUES ('{key}', 'batch_credit')"
            ))
            .await
            .map(|()| 1)
        })
    }
}

impl AsyncConnection for Interrupting {
    type TransactionManager = AnsiTransactionManager;

    async fn establish(database_url: &str) -> diesel::ConnectionResult<Self> {
        Ok(Self {
            conn: AsyncMysqlConnection::establish(database_url).await?,
            other: AsyncMysqlConnection::establish(database_url).await?,
            at: None,
        })
    }

    fn transaction_state(&mut self) -> &mut AnsiTransactionManager {
        self.conn.transaction_state()
    }

    fn instrumentation(&mut self) -> &mut dyn Instrumentation {
        self.conn.instrumentation()
    }

    fn set_instrumentation(&mut self, instrumentation: impl Instrumentation) {
        self.conn.set_instrumentation(instrumentation);
    }

    fn set_prepared_statement_cache_size(&mut self, size: CacheSize) {
        self.conn.set_prepared_statement_cache_size(size);
    }
}

/// A batch `[msg-9, msg-10]` whose `msg-9` was processed before: its markers go in as
/// `msg-10`, then `msg-9`, the duplicate, each on its own once their two-row insert met
/// the duplicate. The transaction ends at the insert of `key`, after `other` delivers
/// its batch, and the call carries on outside it. The call must be transient, with
/// nothing of it committed, and its redelivery must credit what is left to credit.
async fn interrupted_at(test: &str, key: &str, other: Vec<Credit>) {
    let Some(db) = mysql::create(test).await else {
        return;
    };
    bounded(async {
        common::create_tables(&db, 11).await;
        let mut conn = db.connect().await;
        let earlier = common::batch::batch_credit(&mut conn, &[Credit::numbered(9)])
            .await
            .unwrap();
        assert_eq!(earlier.processed(), 1);

        let delivered_by_other = other.len();
        let mut interrupting = Interrupting {
            conn: db.connect().await,
            other: db.connect().await,
            at: Some((key.to_owned(), other)),
        };
        let batch = [Credit::numbered(9), Credit::numbered(10)];
        let interrupted = common::batch::batch_credit(&mut interrupting, &batch).await;
        assert!(interrupting.at.is_none(), "the insert was interrupted");
        let error = interrupted.expect_err("the batch's transaction ended underneath it");
        assert_eq!(classify(&error), ErrorClass::Transient, "{error}");

        let redelivered = common::batch::batch_credit(&mut interrupting, &batch)
            .await
            .unwrap();
        assert_eq!(redelivered.processed(), 1 - delivered_by_other);
        let balances = common::balances(&db, 11).await;
        assert_eq!(&balances[9..], [1, 1], "each message credited once");
        assert_eq!(db.inbox_rows().await, 2);
    })
    .await;
    db.cleanup().await;
}

/// The transaction ends at the duplicate's insert, once another delivery committed
/// `msg-10`. Read back by key, the marker's id was that delivery's, which passed for
/// this call's own committed marker: the call failed for good as committed early.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_whose_transaction_ends_at_a_duplicate_is_transient() {
    interrupted_at(
        "silent_end_at_duplicate",
        "msg-9",
        vec![Credit::numbered(10)],
    )
    .await;
}

/// The transaction ends at `msg-10`'s insert, which then runs outside it. With
/// autocommit on, it committed on its own: `msg-10` marked processed, never credited.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_whose_transaction_ends_at_a_new_marker_commits_nothing() {
    interrupted_at("silent_end_at_new_marker", "msg-10", Vec::new()).await;
}
