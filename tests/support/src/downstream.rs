//! A real downstream system for claim-mode handlers: an HTTP service on a loopback port
//! of its own that credits once per `Idempotency-Key`, as a payment provider does, and
//! counts every call it receives. What it counts is what an external system would have
//! seen, whatever happened to the callers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;

use crate::credit::Credit;

const IDEMPOTENCY_KEY: &str = "Idempotency-Key";
/// The message a call is for, so that one effect per message can be told from one
/// effect per key.
const MESSAGE_ID: &str = "Message-Id";

/// What the service saw under one idempotency key.
struct Effect {
    /// The first call's credit: the one that took effect.
    credit: Credit,
    calls: usize,
}

#[derive(Default)]
struct Ledger {
    calls: usize,
    effects: HashMap<String, Effect>,
}

/// The running service, what it counted, and a client for it.
#[derive(Clone)]
pub struct Downstream {
    client: Client,
    ledger: Arc<Mutex<Ledger>>,
}

impl Downstream {
    /// Starts the service on a free loopback port; it stops with the runtime it was
    /// started on.
    pub async fn start() -> std::io::Result<Self> {
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let app = axum::Router::new()
            .route("/credits", post(credit))
            .with_state(Arc::clone(&ledger));
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let url = format!("http://{}/credits", listener.local_addr()?);
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Self {
            client: Client::new(&url),
            ledger,
        })
    }

    /// Where a [`Client`] in another process reaches the service.
    pub fn url(&self) -> &str {
        &self.client.url
    }

    /// Credits `credit` under `idempotency_key`, as [`Client::credit`] does.
    pub async fn credit(
        &self,
        idempotency_key: &str,
        credit: &Credit,
    ) -> Result<(), reqwest::Error> {
        self.client.credit(idempotency_key, credit).await
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().expect("ledger")
    }

    /// Every call received, repeated ones included.
    pub fn calls(&self) -> usize {
        self.ledger().calls
    }

    /// Credits that took effect: one per distinct key.
    pub fn effects(&self) -> usize {
        self.ledger().effects.len()
    }

    /// The calls that repeated a key seen before, which deduplication absorbed.
    pub fn absorbed(&self) -> usize {
        let ledger = self.ledger();
        ledger.calls - ledger.effects.len()
    }

    /// The most calls any one key received.
    pub fn most_calls_per_key(&self) -> usize {
        let ledger = self.ledger();
        ledger
            .effects
            .values()
            .map(|effect| effect.calls)
            .max()
            .unwrap_or(0)
    }

    /// Messages that took effect under more than one key.
    pub fn messages_with_several_effects(&self) -> usize {
        let ledger = self.ledger();
        let mut effects_per_message: HashMap<&str, usize> = HashMap::new();
        for effect in ledger.effects.values() {
            *effects_per_message
                .entry(&effect.credit.message_id)
                .or_default() += 1;
        }
        effects_per_message
            .values()
            .filter(|&&count| count > 1)
            .count()
    }

    /// The credits that took effect, one per key.
    pub fn credits(&self) -> Vec<Credit> {
        let ledger = self.ledger();
        ledger
            .effects
            .values()
            .map(|effect| effect.credit.clone())
            .collect()
    }
}

async fn credit(
    State(ledger): State<Arc<Mutex<Ledger>>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let header = |name| headers.get(name).and_then(|value| value.to_str().ok());
    let (Some(key), Some(credit)) = (
        header(IDEMPOTENCY_KEY),
        header(MESSAGE_ID).and_then(|message_id| Credit::parse(message_id, &body)),
    ) else {
        return StatusCode::BAD_REQUEST;
    };
    let mut ledger = ledger.lock().expect("ledger");
    ledger.calls += 1;
    match ledger.effects.get_mut(key) {
        Some(effect) => {
            effect.calls += 1;
            StatusCode::OK
        }
        None => {
            let effect = Effect { credit, calls: 1 };
            ledger.effects.insert(key.to_owned(), effect);
            StatusCode::CREATED
        }
    }
}

/// A client for the service, in any process.
#[derive(Clone)]
pub struct Client {
    url: String,
    http: reqwest::Client,
}

impl Client {
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            http: reqwest::Client::new(),
        }
    }

    /// Credits `credit` under `idempotency_key`: it takes effect on the key's first call
    /// only.
    pub async fn credit(
        &self,
        idempotency_key: &str,
        credit: &Credit,
    ) -> Result<(), reqwest::Error> {
        self.http
            .post(&self.url)
            .header(IDEMPOTENCY_KEY, idempotency_key)
            .header(MESSAGE_ID, &credit.message_id)
            .body(credit.payload())
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }
}
