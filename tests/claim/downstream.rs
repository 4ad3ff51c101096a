//! A real downstream system for claim-mode tests: an HTTP service, on a loopback port of
//! its own, that charges once per `Idempotency-Key`, as a payment provider does, and
//! counts every call it receives.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;

#[derive(Default)]
struct Ledger {
    calls: usize,
    /// Calls per idempotency key.
    calls_by_key: HashMap<String, usize>,
}

/// The running service, and a client for it.
#[derive(Clone)]
pub struct Downstream {
    url: String,
    ledger: Arc<Mutex<Ledger>>,
    client: reqwest::Client,
}

impl Downstream {
    /// Starts the service on a free loopback port; it stops with the test's runtime.
    pub async fn start() -> Self {
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let app = axum::Router::new()
            .route("/charges", post(charge))
            .with_state(Arc::clone(&ledger));
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .expect("bind a loopback port");
        let url = format!(
            "http://{}/charges",
            listener.local_addr().expect("local address")
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            url,
            ledger,
            client: reqwest::Client::new(),
        }
    }

    /// Charges under `idempotency_key`: the effect happens on the key's first call only.
    pub async fn charge(&self, idempotency_key: &str) -> Result<(), reqwest::Error> {
        self.client
            .post(&self.url)
            .header("Idempotency-Key", idempotency_key)
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    /// Every call received, repeated ones included.
    pub fn calls(&self) -> usize {
        self.ledger.lock().expect("ledger").calls
    }

    /// Charges that took effect: one per distinct key.
    pub fn effects(&self) -> usize {
        self.ledger.lock().expect("ledger").calls_by_key.len()
    }

    /// The calls that repeated a key seen before, which deduplication absorbed.
    pub fn absorbed(&self) -> usize {
        self.calls() - self.effects()
    }

    /// The most calls any one key received.
    pub fn most_calls_per_key(&self) -> usize {
        let ledger = self.ledger.lock().expect("ledger");
        ledger.calls_by_key.values().copied().max().unwrap_or(0)
    }
}

async fn charge(State(ledger): State<Arc<Mutex<Ledger>>>, headers: HeaderMap) -> StatusCode {
    let Some(key) = headers
        .get("Idempotency-Key")
        .and_then(|key| key.to_str().ok())
    else {
        return StatusCode::BAD_REQUEST;
    };
    let mut ledger = ledger.lock().expect("ledger");
    ledger.calls += 1;
    let seen = ledger.calls_by_key.entry(key.to_owned()).or_default();
    *seen += 1;
    if *seen == 1 {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    }
}
