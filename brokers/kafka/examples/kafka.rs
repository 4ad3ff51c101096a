//! A Kafka consumer of credit messages, exactly once on PostgreSQL, through rskafka
//! (pure Rust). With a broker (`scripts/kafka.sh start` runs one on 127.0.0.1:9092):
//!
//! ```text
//! DATABASE_URL=postgres://… KAFKA_BROKERS=127.0.0.1:9092 cargo run -p diesel-inbox-kafka --example kafka
//! ```
//!
//! It reads partition 0 of the topic `credits`, records with a JSON body
//! `{"account": 1, "amount": 250}`, keyed by their `message-id` header (where the
//! outbox's `OutboxPublisher` puts a message's id), else by (topic,
//! partition, offset, timestamp). The order is the point: the handler's transaction commits the
//! marker and the credit, and only then is the offset committed. A crash between the
//! two re-reads the record, which the inbox answers `Duplicate`; the other order would
//! lose it. rskafka has no consumer groups, so the offset is committed to a table of the
//! same database, in a statement of its own after the handler; with a consumer-group
//! client (rdkafka), `store_offset` the record after the handler returns, with
//! `enable.auto.offset.store=false`.

use std::time::Duration;

use diesel::prelude::*;
use diesel::upsert::excluded;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use diesel_inbox::{Disposition, idempotent};
use diesel_inbox_kafka::{ID_HEADER, RecordKey, message_key};
use rskafka::client::ClientBuilder;
use rskafka::client::partition::{Compression, OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::record::RecordAndOffset;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const TOPIC: &str = "credits";
const DEAD_LETTER_TOPIC: &str = "credits.dead-letter";
const PARTITION: i32 = 0;

diesel::table! {
    accounts (id) {
        id -> BigInt,
        balance -> BigInt,
    }
}

diesel::table! {
    /// The consumer's committed position: the next offset to read.
    kafka_offsets (topic, partition) {
        topic -> Text,
        partition -> Integer,
        next_offset -> BigInt,
    }
}

#[derive(Debug, serde::Deserialize)]
struct CreditRequested {
    account: i64,
    amount: i64,
}

#[idempotent(consumer = "credit", key = key)]
async fn credit(
    conn: &mut AsyncPgConnection,
    key: RecordKey<'_>,
    msg: &CreditRequested,
) -> QueryResult<()> {
    diesel::update(accounts::table.find(msg.account))
        .set(accounts::balance.eq(accounts::balance + msg.amount))
        .execute(conn)
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let pool = Pool::builder(AsyncDieselConnectionManager::<AsyncPgConnection>::new(
        std::env::var("DATABASE_URL")?,
    ))
    .build()?;
    let mut conn = pool.get().await?;
    diesel_inbox::migrate(&mut conn).await?;
    conn.batch_execute(
        "CREATE TABLE IF NOT EXISTS accounts (id bigint PRIMARY KEY, balance bigint NOT NULL);
         CREATE TABLE IF NOT EXISTS kafka_offsets (topic text, partition integer,
             next_offset bigint NOT NULL, PRIMARY KEY (topic, partition))",
    )
    .await?;
    diesel_inbox::check_consumers()?;

    let brokers = std::env::var("KAFKA_BROKERS")?;
    let client = ClientBuilder::new(brokers.split(',').map(str::to_owned).collect())
        .build()
        .await?;
    let records = client
        .partition_client(TOPIC, PARTITION, UnknownTopicHandling::Retry)
        .await?;
    let dead_letters = client
        .partition_client(DEAD_LETTER_TOPIC, PARTITION, UnknownTopicHandling::Retry)
        .await?;

    let committed = kafka_offsets::table
        .find((TOPIC, PARTITION))
        .select(kafka_offsets::next_offset)
        .first(&mut conn)
        .await
        .optional()?;
    drop(conn);
    let mut offset = match committed {
        Some(offset) => offset,
        None => records.get_offset(OffsetAt::Earliest).await?,
    };
    loop {
        let (batch, _high_watermark) = records.fetch_records(offset, 1..1_000_000, 500).await?;
        // A connection per batch: one that a retry leaves broken (the database restarted,
        // say) goes back to the pool, which discards it, and the next batch gets another.
        let mut conn = match pool.get().await {
            Ok(conn) => conn,
            Err(error) => {
                eprintln!("no database connection: {error}; reading the batch again");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        for record in batch {
            match handle(&mut conn, &record).await {
                Disposition::Ack => {}
                Disposition::Retry { after, reason } => {
                    // Nothing was committed: read from this record again after a pause,
                    // on another connection.
                    eprintln!("offset {}: {reason}; reading it again", record.offset);
                    tokio::time::sleep(after.unwrap_or(Duration::from_secs(1))).await;
                    break;
                }
                Disposition::DeadLetter { reason } => {
                    dead_letter(&dead_letters, &record, &reason).await?;
                }
                // One a later release adds: the safe reading is that nothing committed.
                _ => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    break;
                }
            }
            // After the handler's commit, never before it.
            offset = record.offset + 1;
            commit_offset(&mut conn, offset).await?;
        }
    }
}

async fn handle(conn: &mut AsyncPgConnection, record: &RecordAndOffset) -> Disposition {
    let key = match message_key(ID_HEADER, TOPIC, PARTITION, record) {
        Ok(key) => key,
        Err(missing) => {
            return Disposition::DeadLetter {
                reason: missing.to_string(),
            };
        }
    };
    let body = record.record.value.as_deref().unwrap_or_default();
    match serde_json::from_slice::<CreditRequested>(body) {
        Ok(msg) => Disposition::of(&credit(conn, key, &msg).await),
        Err(error) => Disposition::DeadLetter {
            reason: format!("not a credit message: {error}"),
        },
    }
}

async fn commit_offset(conn: &mut AsyncPgConnection, next_offset: i64) -> QueryResult<()> {
    diesel::insert_into(kafka_offsets::table)
        .values((
            kafka_offsets::topic.eq(TOPIC),
            kafka_offsets::partition.eq(PARTITION),
            kafka_offsets::next_offset.eq(next_offset),
        ))
        .on_conflict((kafka_offsets::topic, kafka_offsets::partition))
        .do_update()
        .set(kafka_offsets::next_offset.eq(excluded(kafka_offsets::next_offset)))
        .execute(conn)
        .await?;
    Ok(())
}

/// Copies the record to the dead-letter topic with the reason (and, without an id, its
/// place, which keys the copy as the original), before its offset is committed: a
/// crash in between dead-letters it twice, never not at all.
async fn dead_letter(
    dead_letters: &PartitionClient,
    record: &RecordAndOffset,
    reason: &str,
) -> Result<(), BoxError> {
    let copy = diesel_inbox_kafka::dead_letter(ID_HEADER, TOPIC, PARTITION, record, reason);
    dead_letters
        .produce(vec![copy], Compression::NoCompression)
        .await?;
    Ok(())
}
