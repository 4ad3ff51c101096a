//! One relay process of the outbox chain: a `Relay` with the broker's `OutboxPublisher`
//! on the run's schema, until SIGTERM, reporting each confirmed publish.

use std::time::Duration;

use diesel_async::AsyncPgConnection;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_inbox::outbox::{Outgoing, PublishError, Publisher, Relay, RelaySettings};
use tokio::signal::unix::{SignalKind, signal};

use crate::{BoxError, Broker, RelayArgs};

/// A killed relay's messages are taken again once their lease ends: short, so that
/// this happens within the run, and the copies it publishes reach service B.
const LEASE: Duration = Duration::from_secs(3);

/// The broker's publisher, reporting `published` on stdout for every publish the
/// broker confirmed, which the run counts against the events B received.
struct Reporting<P>(P);

impl<P: Publisher> Publisher for Reporting<P> {
    async fn publish(&self, message: &Outgoing) -> Result<(), PublishError> {
        let published = self.0.publish(message).await;
        if published.is_ok() {
            println!("published");
        }
        published
    }
}

pub(crate) async fn relay(args: RelayArgs) -> Result<(), BoxError> {
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(&args.schema_url);
    let pool = Pool::builder(manager).max_size(2).build()?;
    let settings = RelaySettings::new()
        .with_lease(LEASE)
        .with_poll_interval(Duration::from_millis(20))
        .with_backoff(Duration::from_millis(100), Duration::from_secs(1));
    let relay = match args.broker {
        Broker::Rabbitmq => {
            let publisher = diesel_inbox_lapin::OutboxPublisher::new(&args.endpoints.amqp_url);
            Relay::spawn(pool, Reporting(publisher), settings)
        }
        Broker::Nats => {
            let client = async_nats::connect(&args.endpoints.nats_url).await?;
            let publisher =
                diesel_inbox_nats::OutboxPublisher::new(async_nats::jetstream::new(client));
            Relay::spawn(pool, Reporting(publisher), settings)
        }
    };
    signal(SignalKind::terminate())?.recv().await;
    relay.shut_down().await;
    Ok(())
}
