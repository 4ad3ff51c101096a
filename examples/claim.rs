//! Claim mode: consumers send a receipt e-mail per order through a real HTTP "mail
//! provider" on a loopback port, exactly once in intent, and the provider deduplicates by
//! the idempotency key each call carries. One consumer dies in the middle of a call; the
//! delivery that takes its claim over after the lease calls again with the same key.
//!
//! ```text
//! cargo run --example claim --features postgres,mysql,sqlite,testing  # embedded SQLite
//! DATABASE_URL=postgres://user@host/db cargo run --example claim --features postgres,mysql,sqlite,testing  # PostgreSQL
//! DATABASE_URL=mysql://user@host/db cargo run --example claim --features postgres,mysql,sqlite,testing  # MySQL, MariaDB
//! ```
//!
//! Each run works in a scratch schema, database or file made by `diesel_inbox::testing`,
//! and drops it at the end.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use diesel_async::AsyncConnection;
use diesel_inbox::testing::{TestConnection, TestDatabase};
use diesel_inbox::{Claim, Disposition, ErrorClass, InboxBackend, Outcome, idempotent};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const ORDERS: u64 = 30;
const CONSUMERS: usize = 3;
/// Short for the demo, so that the takeover after the crash comes within a second.
const LEASE: Duration = Duration::from_millis(800);
/// How long the mail provider takes to answer.
const PROVIDER_LATENCY: Duration = Duration::from_millis(40);

/// An order was placed: send its receipt.
#[derive(Debug, Clone)]
struct OrderPlaced {
    order_id: u64,
    email: String,
}

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error("database: {0}")]
    Database(#[from] diesel::result::Error),
    #[error("mail provider: {0}")]
    Mail(#[from] reqwest::Error),
}

impl diesel_inbox::Classify for AppError {
    fn class(&self) -> ErrorClass {
        match self {
            Self::Database(error) => error.class(),
            // The provider is down, overloaded or slow: a later delivery can succeed.
            Self::Mail(error)
                if error.is_connect()
                    || error.is_timeout()
                    || error.status().is_some_and(|status| {
                        status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS
                    }) =>
            {
                ErrorClass::Transient
            }
            // It refused this e-mail: no retry helps.
            Self::Mail(_) => ErrorClass::Permanent,
        }
    }
}

/// The mail provider's client: one POST per e-mail, keyed for deduplication.
#[derive(Clone)]
struct Mailer {
    client: reqwest::Client,
    url: String,
}

impl Mailer {
    async fn send(&self, to: &str, idempotency_key: &str) -> Result<(), AppError> {
        self.client
            .post(&self.url)
            .header("Idempotency-Key", idempotency_key)
            .body(format!("Your receipt, {to}"))
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }
}

#[idempotent(consumer = "receipt-email", key = order.order_id, claim, lease = LEASE)]
async fn send_receipt<C>(
    conn: &mut C,
    mailer: &Mailer,
    order: &OrderPlaced,
) -> Result<u32, AppError>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let claim = Claim::current();
    mailer
        .send(&order.email, &claim.idempotency_key().to_string())
        .await?;
    Ok(claim.attempt())
}

/// The provider's side: every request counted, one e-mail per idempotency key.
#[derive(Default)]
struct Outbox {
    requests: usize,
    sent: HashMap<String, usize>,
}

async fn receive(State(outbox): State<Arc<Mutex<Outbox>>>, headers: HeaderMap) -> StatusCode {
    let Some(key) = headers.get("Idempotency-Key").and_then(|k| k.to_str().ok()) else {
        return StatusCode::BAD_REQUEST;
    };
    {
        let mut outbox = outbox.lock().expect("outbox");
        outbox.requests += 1;
        *outbox.sent.entry(key.to_owned()).or_default() += 1;
    }
    // Accepted at once, answered after a while, as a real provider's API is.
    tokio::time::sleep(PROVIDER_LATENCY).await;
    StatusCode::ACCEPTED
}

async fn start_provider() -> Result<(String, Arc<Mutex<Outbox>>), BoxError> {
    let outbox = Arc::new(Mutex::new(Outbox::default()));
    let app = axum::Router::new()
        .route("/messages", axum::routing::post(receive))
        .with_state(Arc::clone(&outbox));
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let url = format!("http://{}/messages", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((url, outbox))
}

async fn run<C: TestConnection>(db: TestDatabase<C>) -> Result<(), BoxError> {
    let (url, outbox) = start_provider().await?;
    let mailer = Mailer {
        client: reqwest::Client::new(),
        url,
    };
    let orders: Vec<OrderPlaced> = (1..=ORDERS)
        .map(|order_id| OrderPlaced {
            order_id,
            email: format!("customer-{order_id}@example.com"),
        })
        .collect();

    // A consumer dies while sending the first receipt: its claim outlives it.
    {
        let mut conn = db.connect().await?;
        let (mailer, order) = (mailer.clone(), orders[0].clone());
        let dying = tokio::spawn(async move { send_receipt(&mut conn, &mailer, &order).await });
        // Killed while the provider is still answering: the e-mail is out, the claim open.
        while outbox.lock().expect("outbox").requests == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        dying.abort();
        println!("a consumer died while sending the receipt of order 1");
    }

    // Every consumer receives every order, as redeliveries after lost acks would.
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let (db, mailer, orders) = (db.clone(), mailer.clone(), orders.clone());
            tokio::spawn(async move {
                let mut conn = db.connect().await?;
                let (mut sent, mut duplicates, mut retries) = (0, 0, 0);
                for order in &orders {
                    loop {
                        let result = send_receipt(&mut conn, &mailer, order).await;
                        match Disposition::of(&result) {
                            Disposition::Ack => {
                                if let Ok(Outcome::Processed(attempt)) = result {
                                    sent += 1;
                                    if attempt > 1 {
                                        println!(
                                            "order {} taken over after the lease, attempt {attempt}",
                                            order.order_id
                                        );
                                    }
                                } else {
                                    duplicates += 1;
                                }
                                break;
                            }
                            Disposition::Retry { after, .. } => {
                                retries += 1;
                                let after = after.unwrap_or(Duration::from_millis(20));
                                tokio::time::sleep(after.min(Duration::from_millis(200))).await;
                            }
                            Disposition::DeadLetter { reason } => {
                                return Err::<_, BoxError>(reason.into());
                            }
                            other => return Err(format!("not handled: {other:?}").into()),
                        }
                    }
                }
                Ok((sent, duplicates, retries))
            })
        })
        .collect();
    let (mut sent, mut duplicates, mut retries) = (0, 0, 0);
    for consumer in consumers {
        let (s, d, r) = consumer.await??;
        (sent, duplicates, retries) = (sent + s, duplicates + d, retries + r);
    }
    let (requests, emails) = {
        let outbox = outbox.lock().expect("outbox");
        (outbox.requests, outbox.sent.len())
    };
    println!(
        "{ORDERS} orders, {CONSUMERS} consumers: {sent} receipts processed, {duplicates} \
         duplicates acknowledged, {retries} redeliveries while a claim was held"
    );
    println!(
        "mail provider: {requests} requests, {emails} distinct e-mails ({} repeated key \
         absorbed)",
        requests - emails
    );
    assert_eq!(emails, orders.len(), "one e-mail per order");
    db.cleanup().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL").unwrap_or_default();
    let name = format!("claim_example_{}", std::process::id());
    match url.split("://").next() {
        Some("postgres" | "postgresql") => run(TestDatabase::postgres(&url, &name).await?).await,
        Some("mysql" | "mariadb") => run(TestDatabase::mysql(&url, &name).await?).await,
        Some("") => run(TestDatabase::sqlite(&name).await?).await,
        _ => {
            Err("DATABASE_URL must start with postgres:// or mysql:// (unset it for SQLite)".into())
        }
    }
}
