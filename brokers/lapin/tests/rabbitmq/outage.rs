//! A database outage in the middle of a consumer service's run. Consumers take credits
//! from RabbitMQ and reach the database through a TCP proxy that the test controls; once
//! a third of the messages are processed, the proxy refuses new connections and resets
//! the open ones for a few seconds, then comes back. Every message must then be applied
//! exactly once, with nothing dead-lettered: an outage is never the message's fault.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel_async::AsyncConnection;
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, PoolError, PoolableConnection,
};
use diesel_inbox::testing::{TestConnection, TestDatabase, select_i64};
use diesel_inbox::{Disposition, InboxBackend, RetryPolicy, idempotent, retry};
use diesel_inbox_lapin::{Queues, Settled, message_key};
use futures_util::StreamExt as _;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use tokio_util::sync::CancellationToken;

use broker_test_support::{Proxy, server_url};

use super::{Broker, broker};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const MESSAGES: usize = 300;
const ACCOUNTS: usize = 10;
const CONSUMERS: usize = 4;
const OUTAGE: Duration = Duration::from_secs(3);

#[idempotent(consumer = "outage-credit", key = message_id)]
async fn credit<C>(conn: &mut C, message_id: &str, account: i64) -> diesel::QueryResult<()>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    conn.batch_execute(&format!(
        "UPDATE accounts SET balance = balance + 1 WHERE id = {account}"
    ))
    .await
}

/// What the consumers did, counted as they did it.
#[derive(Default)]
struct Tally {
    processed: AtomicUsize,
    /// Runs that `retry` ran again, and deliveries sent back through the retry queue.
    failed_runs: AtomicUsize,
    retried_deliveries: AtomicUsize,
    dead_letters: Mutex<Vec<String>>,
    /// Set once the outage has begun: failures from then on prove it landed mid-run.
    outage: AtomicBool,
    failed_during_outage: AtomicUsize,
}

/// Runs the service against the database at `url` (`upstream` is its server's address)
/// and checks every message was applied once and none was dead-lettered.
async fn outage_dead_letters_nothing<C>(db: TestDatabase<C>, upstream: SocketAddr, test: &str)
where
    C: TestConnection + PoolableConnection + 'static,
    C::Backend: InboxBackend,
    AsyncDieselConnectionManager<C>: deadpool::managed::Manager<Type = C, Error = PoolError>,
{
    let Some(broker) = broker(test).await else {
        return;
    };
    let broker = Broker {
        queues: broker
            .queues
            .clone()
            .with_retry_delay(Duration::from_millis(500)),
        ..broker
    };
    let mut conn = db.connect().await.expect("connect");
    conn.batch_execute("CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)")
        .await
        .expect("accounts");
    let accounts = (1..=ACCOUNTS)
        .map(|id| format!("({id}, 0)"))
        .collect::<Vec<_>>()
        .join(", ");
    conn.batch_execute(&format!("INSERT INTO accounts VALUES {accounts}"))
        .await
        .expect("accounts");
    for n in 0..MESSAGES {
        let account = n % ACCOUNTS + 1;
        broker
            .publish(Some(&format!("m-{n}")), account.to_string().as_bytes())
            .await;
    }

    let proxy = Proxy::start(upstream).await;
    let pool = deadpool::managed::Pool::builder(AsyncDieselConnectionManager::<C>::new(
        proxy.url(db.url()),
    ))
    .max_size(CONSUMERS)
    .wait_timeout(Some(Duration::from_secs(1)))
    .runtime(deadpool::Runtime::Tokio1)
    .build()
    .expect("a pool");
    let tally = Arc::new(Tally::default());
    let stop = CancellationToken::new();
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|n| {
            tokio::spawn(consume(
                broker.queues.clone(),
                pool.clone(),
                Arc::clone(&tally),
                stop.clone(),
                format!("{test}-{n}"),
            ))
        })
        .collect();

    // The outage, once a third of the messages are processed.
    while tally.processed.load(Ordering::Relaxed) < MESSAGES / 3 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tally.outage.store(true, Ordering::Relaxed);
    proxy.cut();
    let processed_at_cut = tally.processed.load(Ordering::Relaxed);
    tokio::time::sleep(OUTAGE).await;
    proxy.restore();
    tally.outage.store(false, Ordering::Relaxed);

    let markers = || async {
        let mut conn = db.connect().await.expect("connect");
        select_i64(&mut conn, "SELECT COUNT(*) FROM inbox")
            .await
            .expect("markers")
    };
    for _ in 0..600 {
        let dead = tally.dead_letters.lock().unwrap().len() as i64;
        if markers().await + dead >= MESSAGES as i64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    for consumer in consumers {
        consumer.await.expect("a consumer panicked");
    }

    assert!(
        processed_at_cut < MESSAGES,
        "the outage began after the run ({processed_at_cut} processed)"
    );
    assert!(
        tally.failed_during_outage.load(Ordering::Relaxed) > 0,
        "no delivery failed during the outage ({processed_at_cut} processed before it, {} \
         after it)",
        tally.processed.load(Ordering::Relaxed)
    );
    let dead_letters = tally.dead_letters.lock().unwrap().clone();
    assert!(
        dead_letters.is_empty(),
        "{} dead-lettered, the first because: {}",
        dead_letters.len(),
        dead_letters[0]
    );
    assert!(broker.get(broker.queues.dead_letter()).await.is_none());
    let mut conn = db.connect().await.expect("connect");
    for account in 1..=ACCOUNTS {
        let balance = select_i64(
            &mut conn,
            &format!("SELECT balance FROM accounts WHERE id = {account}"),
        )
        .await
        .expect("balance");
        assert_eq!(balance, (MESSAGES / ACCOUNTS) as i64, "account {account}");
    }
    let markers = select_i64(&mut conn, "SELECT COUNT(*) FROM inbox")
        .await
        .expect("markers");
    assert_eq!(markers, MESSAGES as i64);
    eprintln!(
        "{test}: {processed_at_cut} processed before the outage; {} runs retried in place, \
         {} deliveries through the retry queue, {} failures during the outage",
        tally.failed_runs.load(Ordering::Relaxed),
        tally.retried_deliveries.load(Ordering::Relaxed),
        tally.failed_during_outage.load(Ordering::Relaxed),
    );
    drop(conn);
    pool.close();
    db.cleanup().await.expect("drop the test database");
    broker.cleanup().await;
}

/// One consumer of the service: a channel of its own, prefetch 2, each delivery run with
/// the guide's retry loop and settled through `Queues`.
async fn consume<C>(
    queues: Queues,
    pool: deadpool::managed::Pool<AsyncDieselConnectionManager<C>>,
    tally: Arc<Tally>,
    stop: CancellationToken,
    tag: String,
) where
    C: PoolableConnection + 'static,
    C::Backend: InboxBackend,
    AsyncDieselConnectionManager<C>: deadpool::managed::Manager<Type = C, Error = PoolError>,
{
    let url = server_url("AMQP_URL").expect("AMQP_URL");
    let connection = diesel_inbox_lapin::connect(&url).await.expect("connect");
    let channel = super::confirming_channel(&connection).await;
    channel
        .basic_qos(2, BasicQosOptions::default())
        .await
        .expect("prefetch");
    let mut deliveries = channel
        .basic_consume(
            queues.work(),
            &tag,
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let policy = RetryPolicy::new()
        .with_max_retries(3)
        .with_min_delay(Duration::from_millis(20))
        .with_max_delay(Duration::from_millis(200));
    loop {
        let delivery = tokio::select! {
            () = stop.cancelled() => break,
            delivery = deliveries.next() => match delivery {
                Some(delivery) => delivery.expect("a delivery"),
                None => break,
            },
        };
        let key = message_key(&delivery).expect("a key").to_owned();
        let account: i64 = std::str::from_utf8(&delivery.data)
            .expect("utf-8")
            .parse()
            .expect("an account");
        let result = retry(&policy, || async {
            let mut conn = pool.get().await.inspect_err(|_| tally.failed())?;
            let outcome = credit(&mut *conn, &key, account)
                .await
                .inspect_err(|_| tally.failed())?;
            Ok::<_, BoxError>(outcome)
        })
        .await;
        let disposition = Disposition::of(&result);
        match queues
            .settle(&channel, &delivery, &disposition)
            .await
            .expect("settle")
        {
            Settled::Acked => {
                if matches!(result, Ok(diesel_inbox::Outcome::Processed(()))) {
                    tally.processed.fetch_add(1, Ordering::Relaxed);
                }
            }
            Settled::Retried { .. } => {
                tally.retried_deliveries.fetch_add(1, Ordering::Relaxed);
            }
            Settled::DeadLettered { reason } => tally.dead_letters.lock().unwrap().push(reason),
            other => panic!("a settlement this test does not know: {other:?}"),
        }
    }
    let _ = channel.close(200, "done").await;
    let _ = connection.close(200, "done").await;
}

impl Tally {
    fn failed(&self) {
        self.failed_runs.fetch_add(1, Ordering::Relaxed);
        if self.outage.load(Ordering::Relaxed) {
            self.failed_during_outage.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_outage_dead_letters_nothing() {
    let Some(url) = server_url("POSTGRES_URL") else {
        return;
    };
    let db = TestDatabase::<diesel_async::AsyncPgConnection>::postgres(&url, "rabbitmq_outage")
        .await
        .expect("test schema");
    let upstream = server_address(db.url());
    outage_dead_letters_nothing(db, upstream, "pg-outage").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mariadb_outage_dead_letters_nothing() {
    let Some(url) = server_url("MYSQL_URL") else {
        return;
    };
    let db = TestDatabase::<diesel_async::AsyncMysqlConnection>::mysql(&url, "rabbitmq_outage")
        .await
        .expect("test database");
    let upstream = server_address(db.url());
    outage_dead_letters_nothing(db, upstream, "mariadb-outage").await;
}

/// The `host:port` of a database URL, which must name the server by IP address.
fn server_address(url: &str) -> SocketAddr {
    let authority = url.split("://").nth(1).expect("a URL");
    let authority = authority.split(['/', '?']).next().expect("an authority");
    let host = authority.rsplit('@').next().expect("a host");
    host.parse().expect("the server's IP address and port")
}
