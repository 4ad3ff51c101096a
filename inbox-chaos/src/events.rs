//! The outbox chain's second hop: the "credited" event service A announces and service
//! B records, which of A's credits are declined, where the events go, and the naive
//! variant's publisher, which sends them from A's body instead of through the outbox.

use async_nats::jetstream;
use inbox_fixtures::credit::Credit;
use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Channel};

use crate::BoxError;

/// Every `DECLINE_EVERY`-th message (by its number, the end of its id) is declined by
/// service A after its credit and its event were written: the transaction rolls back,
/// and the message is acknowledged with no effect.
pub(crate) const DECLINE_EVERY: u64 = 10;

diesel::table! {
    /// Service B's effect: one row per event it processed. No unique index, so that an
    /// event recorded twice shows as two rows instead of failing the second insert.
    received_events (event_id) {
        event_id -> Text,
        credit_id -> Text,
        account -> BigInt,
        amount -> BigInt,
    }
}

pub(crate) const CREATE_TABLES: &str = "
    CREATE TABLE received_events (
        event_id TEXT NOT NULL, credit_id TEXT NOT NULL, account BIGINT NOT NULL,
        amount BIGINT NOT NULL
    );
";

/// Whether service A declines `credit`: the same answer on every delivery.
pub(crate) fn declined(credit: &Credit) -> bool {
    credit
        .message_id
        .rsplit('-')
        .next()
        .and_then(|n| n.parse::<u64>().ok())
        .is_some_and(|n| n % DECLINE_EVERY == DECLINE_EVERY - 1)
}

/// What service A announces: the credit, under an id of the event's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Credited {
    pub(crate) credit_id: String,
    pub(crate) account: i64,
    pub(crate) amount: i64,
}

impl Credited {
    pub(crate) fn of(credit: &Credit) -> Self {
        Self {
            credit_id: credit.message_id.clone(),
            account: credit.account,
            amount: credit.amount,
        }
    }

    /// `"<credit id> <account> <amount>"`.
    pub(crate) fn payload(&self) -> Vec<u8> {
        format!("{} {} {}", self.credit_id, self.account, self.amount).into_bytes()
    }

    pub(crate) fn parse(payload: &[u8]) -> Option<Self> {
        let mut fields = std::str::from_utf8(payload).ok()?.split(' ');
        let event = Self {
            credit_id: fields.next()?.to_owned(),
            account: fields.next()?.parse().ok()?,
            amount: fields.next()?.parse().ok()?,
        };
        fields.next().is_none().then_some(event)
    }
}

/// Where service A sends its events, as an outbox message names it: RabbitMQ's default
/// exchange and the events' queue as the routing key, or the events' subject.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    pub(crate) destination: String,
    pub(crate) routing_key: String,
}

/// The naive variant's publisher: straight to the broker, confirmed, from A's body.
pub(crate) enum Direct {
    Rabbitmq(Channel),
    Nats(jetstream::Context),
}

impl Direct {
    /// Publishes `event` as `event_id` on `route`, and waits for the broker's confirmation.
    pub(crate) async fn publish(
        &self,
        route: &Route,
        event_id: &str,
        event: &Credited,
    ) -> Result<(), BoxError> {
        match self {
            Self::Rabbitmq(channel) => {
                let properties = BasicProperties::default()
                    .with_message_id(event_id.into())
                    .with_delivery_mode(2);
                let confirm = channel
                    .basic_publish(
                        &route.destination,
                        &route.routing_key,
                        BasicPublishOptions::default(),
                        &event.payload(),
                        properties,
                    )
                    .await?
                    .await?;
                if confirm.is_ack() {
                    Ok(())
                } else {
                    Err("RabbitMQ refused an event".into())
                }
            }
            Self::Nats(jetstream) => {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(async_nats::header::NATS_MESSAGE_ID, event_id);
                jetstream
                    .publish_with_headers(
                        route.destination.clone(),
                        headers,
                        event.payload().into(),
                    )
                    .await?
                    .await?;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_reads_back_from_its_payload() {
        let credit = Credit {
            message_id: "123-9".to_owned(),
            account: 4,
            amount: 70,
        };
        let event = Credited::of(&credit);
        assert_eq!(Credited::parse(&event.payload()), Some(event));
        assert_eq!(Credited::parse(b"123-9 4"), None);
        assert_eq!(Credited::parse(b"123-9 4 70 1"), None);
    }

    #[test]
    fn every_tenth_message_is_declined() {
        let credit = |n: u32| Credit {
            message_id: format!("5517-{n}"),
            account: 0,
            amount: 1,
        };
        let declined: Vec<u32> = (0..30).filter(|&n| declined(&credit(n))).collect();
        assert_eq!(declined, [9, 19, 29]);
    }
}
