//! The claim-mode run's downstream system: an HTTP service in the driver process, on a
//! loopback port, that credits once per `Idempotency-Key`, as a payment provider
//! does, and counts every call it receives. Being outside the consumers, it survives
//! their kills, and what it counts is what an external system would have seen.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;

use crate::BoxError;
use crate::handlers::Credit;

const IDEMPOTENCY_KEY: &str = "Idempotency-Key";
/// The message the call is for, so that the run can tell one effect per message from
/// one effect per key.
const MESSAGE_ID: &str = "Message-Id";

/// The first call under a key: the one that took effect.
struct Effect {
    message_id: String,
    credit: Credit,
}

#[derive(Default)]
struct Ledger {
    calls: u64,
    effects: HashMap<String, Effect>,
}

/// The running service, as the driver reads it.
pub(crate) struct Downstream {
    url: String,
    ledger: Arc<Mutex<Ledger>>,
}

/// What the service saw, once the consumers have stopped.
pub(crate) struct Tally {
    pub(crate) calls: u64,
    pub(crate) effects: u64,
    /// Messages that took effect under more than one key.
    pub(crate) messages_with_several_effects: u64,
    /// Effects per message id.
    pub(crate) credits: Vec<(String, Credit)>,
}

impl Downstream {
    /// Starts the service on a free loopback port; it stops with the driver.
    pub(crate) async fn start() -> Result<Self, BoxError> {
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let app = axum::Router::new()
            .route("/credits", post(credit))
            .with_state(Arc::clone(&ledger));
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let url = format!("http://{}/credits", listener.local_addr()?);
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Self { url, ledger })
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    pub(crate) fn tally(&self) -> Tally {
        let ledger = self.ledger.lock().expect("ledger");
        let mut effects_per_message: HashMap<&str, u64> = HashMap::new();
        for effect in ledger.effects.values() {
            *effects_per_message.entry(&effect.message_id).or_default() += 1;
        }
        Tally {
            calls: ledger.calls,
            effects: ledger.effects.len() as u64,
            messages_with_several_effects: effects_per_message
                .values()
                .filter(|&&count| count > 1)
                .count() as u64,
            credits: ledger
                .effects
                .values()
                .map(|effect| (effect.message_id.clone(), effect.credit))
                .collect(),
        }
    }
}

async fn credit(
    State(ledger): State<Arc<Mutex<Ledger>>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let header = |name| headers.get(name).and_then(|value| value.to_str().ok());
    let (Some(key), Some(message_id), Some(credit)) = (
        header(IDEMPOTENCY_KEY),
        header(MESSAGE_ID),
        Credit::parse(&body),
    ) else {
        return StatusCode::BAD_REQUEST;
    };
    let mut ledger = ledger.lock().expect("ledger");
    ledger.calls += 1;
    if ledger.effects.contains_key(key) {
        return StatusCode::OK;
    }
    let message_id = message_id.to_owned();
    ledger
        .effects
        .insert(key.to_owned(), Effect { message_id, credit });
    StatusCode::CREATED
}

/// A consumer's client for the service.
pub(crate) struct Client {
    url: String,
    http: reqwest::Client,
}

impl Client {
    pub(crate) fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            http: reqwest::Client::new(),
        }
    }

    /// Credits `credit` under `idempotency_key`: it takes effect on the key's first
    /// call only.
    pub(crate) async fn credit(
        &self,
        idempotency_key: &str,
        message_id: &str,
        credit: Credit,
    ) -> Result<(), reqwest::Error> {
        self.http
            .post(&self.url)
            .header(IDEMPOTENCY_KEY, idempotency_key)
            .header(MESSAGE_ID, message_id)
            .body(credit.payload())
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }
}
