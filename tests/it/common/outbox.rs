//! The outbox's scenarios: messages commit and roll back with the body that enqueued
//! them, relays racing take each message once, one ordering key's messages go out in
//! commit order, and failed publishes are retried or parked, never dropped.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use diesel::result::Error;
use diesel_async::{AsyncConnection, SimpleAsyncConnection};
use diesel_inbox::outbox::{self, InvalidOutboxMessage, OutboxMessage, Taken};
use diesel_inbox::testing::select_i64;
use diesel_inbox::{
    BatchOutcome, ErrorClass, InboxBackend, InboxError, Outcome, classify, idempotent,
};

use super::{Credit, TestDb, apply, create_tables};

/// What the credit handler does after crediting.
#[derive(Debug, Clone, Copy)]
pub enum Then {
    Commit,
    Fail,
    EnqueueInvalid,
}

#[idempotent(consumer = "outbox-credit", key = credit.message_id.as_str())]
pub async fn credit_and_announce<C>(
    conn: &mut C,
    credit: &Credit,
    then: Then,
) -> Result<Vec<String>, Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    apply(conn, credit).await?;
    let mut ids = Vec::new();
    for event in ["credited", "audited"] {
        let message = OutboxMessage::new("accounts", credit.payload())
            .routing_key(event)
            .header("account", credit.account.to_string());
        ids.push(outbox::enqueue(conn, message).await?);
    }
    match then {
        Then::Commit => Ok(ids),
        Then::Fail => Err(Error::RollbackTransaction),
        Then::EnqueueInvalid => {
            let too_long = OutboxMessage::new("accounts", Vec::new()).routing_key("r".repeat(300));
            outbox::enqueue(conn, too_long).await?;
            Ok(ids)
        }
    }
}

#[idempotent(consumer = "outbox-batch", batch = credits, key = |credit| credit.message_id.as_str())]
pub async fn credit_batch_and_announce<C>(
    conn: &mut C,
    credits: &[Credit],
    fail: bool,
) -> Result<Vec<String>, Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let mut ids = Vec::new();
    for credit in &credits {
        apply(conn, credit).await?;
        ids.push(outbox::enqueue(conn, OutboxMessage::new("accounts", credit.payload())).await?);
    }
    if fail {
        return Err(Error::RollbackTransaction);
    }
    Ok(ids)
}

#[idempotent(consumer = "outbox-claim", key = credit.message_id.as_str(), claim)]
pub async fn claim_and_announce<C>(
    conn: &mut C,
    credit: &Credit,
    fail: bool,
) -> Result<String, Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let id = outbox::enqueue(conn, OutboxMessage::new("accounts", credit.payload())).await?;
    if fail {
        return Err(Error::RollbackTransaction);
    }
    Ok(id)
}

async fn migrated<D: TestDb>(db: &D) -> D::Conn {
    create_tables(db, 16).await;
    let mut conn = db.connect().await;
    outbox::migrate(&mut conn)
        .await
        .expect("migrate the outbox");
    conn
}

async fn count<C: diesel_inbox::testing::TestConnection>(conn: &mut C, sql: &str) -> i64 {
    select_i64(conn, sql).await.expect(sql)
}

/// Takes every due message, in the order taken, and marks each sent.
async fn drain<C>(conn: &mut C) -> Vec<outbox::Outgoing>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let mut sent = Vec::new();
    loop {
        let taken = outbox::take(conn, Duration::from_secs(30), 100)
            .await
            .expect("take");
        if taken.is_empty() {
            return sent;
        }
        for taken in taken {
            sent.push(taken.message().clone());
            taken.sent(conn).await.expect("mark sent");
        }
    }
}

pub async fn messages_commit_and_roll_back_with_the_body<D: TestDb>(db: D) {
    let mut conn = migrated(&db).await;
    let credit = Credit::numbered(1);

    let failed = credit_and_announce(&mut conn, &credit, Then::Fail).await;
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) FROM inbox_outbox").await,
        0
    );

    let Ok(Outcome::Processed(ids)) = credit_and_announce(&mut conn, &credit, Then::Commit).await
    else {
        panic!("the second delivery is processed");
    };
    let again = credit_and_announce(&mut conn, &credit, Then::Commit).await;
    assert!(matches!(again, Ok(Outcome::Duplicate)), "{again:?}");

    let sent = drain(&mut conn).await;
    let sent_ids: Vec<&str> = sent.iter().map(|message| message.message_id()).collect();
    assert_eq!(sent_ids, ids.iter().map(String::as_str).collect::<Vec<_>>());
    assert_ne!(
        ids[0], ids[1],
        "each message of a body has an id of its own"
    );
    assert_eq!(sent[0].routing_key(), "credited");
    assert_eq!(sent[0].headers(), [("account".to_owned(), "1".to_owned())]);
    assert_eq!(sent[0].payload(), credit.payload());
    assert_eq!(sent[0].attempts(), 1);
}

pub async fn default_ids_are_the_same_on_every_delivery<D: TestDb>(db: D) {
    let mut conn = migrated(&db).await;
    let credit = Credit::numbered(2);
    // The rolled-back delivery's ids are those the committed one writes.
    let failing = credit_and_announce(&mut conn, &credit, Then::Fail).await;
    assert!(failing.is_err());
    let Ok(Outcome::Processed(first)) = credit_and_announce(&mut conn, &credit, Then::Commit).await
    else {
        panic!("processed");
    };
    // Delivered again as if its marker had never been written, it enqueues the same ids.
    conn.batch_execute("DELETE FROM inbox")
        .await
        .expect("forget the marker");
    let Ok(Outcome::Processed(second)) =
        credit_and_announce(&mut conn, &credit, Then::Commit).await
    else {
        panic!("processed in a new database");
    };
    assert_eq!(
        first, second,
        "the ids derive from the consumer, the key and the index"
    );
    // Outside a body, each message gets a random id.
    let mut outside = Vec::new();
    for _ in 0..2 {
        let message = OutboxMessage::new("accounts", Vec::new());
        outside.push(outbox::enqueue(&mut conn, message).await.expect("enqueue"));
    }
    assert_ne!(outside[0], outside[1]);
    let given = OutboxMessage::new("accounts", Vec::new()).id("order-7-shipped");
    assert_eq!(
        outbox::enqueue(&mut conn, given).await.expect("enqueue"),
        "order-7-shipped"
    );
}

pub async fn batch_messages_commit_with_the_batch<D: TestDb>(db: D) {
    let mut conn = migrated(&db).await;
    let credits: Vec<Credit> = (3..7).map(Credit::numbered).collect();

    let failed = credit_batch_and_announce(&mut conn, &credits, true).await;
    assert!(failed.is_err());
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) FROM inbox_outbox").await,
        0
    );

    // Two of them already processed: the body sees, and announces, the other two.
    let first_two: BatchOutcome<Vec<String>> =
        credit_batch_and_announce(&mut conn, &credits[..2], false)
            .await
            .expect("the first two commit");
    assert_eq!(first_two.value().map(Vec::len), Some(2));
    let outcome = credit_batch_and_announce(&mut conn, &credits, false)
        .await
        .expect("the batch commits");
    let ids = outcome.value().expect("the body ran").clone();
    assert_eq!(ids.len(), 2);
    let sent = drain(&mut conn).await;
    assert_eq!(sent.len(), 4);
    let distinct: HashSet<&str> = sent.iter().map(|message| message.message_id()).collect();
    assert_eq!(
        distinct.len(),
        4,
        "no two messages of the batches share an id"
    );
}

pub async fn invalid_messages_are_refused_before_writing<D: TestDb>(db: D) {
    let mut conn = migrated(&db).await;
    let credit = Credit::numbered(8);
    let refused = credit_and_announce(&mut conn, &credit, Then::EnqueueInvalid)
        .await
        .expect_err("a routing key of 300 bytes is refused");
    assert_eq!(
        InboxError::find(&refused),
        Some(&InboxError::InvalidOutboxMessage(
            InvalidOutboxMessage::TooLong {
                field: "routing_key",
                len: 300,
                max: 255
            }
        ))
    );
    assert_eq!(classify(&refused), ErrorClass::Permanent);
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) FROM inbox_outbox").await,
        0
    );
    assert_eq!(count(&mut conn, "SELECT COUNT(*) FROM inbox").await, 0);
}

/// Sent messages older than the window go, in batches, with the ordering keys no unsent
/// message uses; unsent ones and recent sent ones stay. A key whose row is gone numbers
/// its next message after its unsent ones, so that order holds across a prune.
pub async fn sent_messages_are_pruned_with_idle_keys<D: TestDb>(db: D) {
    let mut conn = migrated(&db).await;
    for n in 0..2_500 {
        let message = OutboxMessage::new("d", Vec::new());
        let message = match n {
            0..3 => message.ordering_key("idle"),
            3..5 => message.ordering_key("busy"),
            _ => message,
        };
        outbox::enqueue(&mut conn, message).await.expect("enqueue");
    }
    assert_eq!(drain(&mut conn).await.len(), 2_500);
    let pending = OutboxMessage::new("d", b"pending".to_vec()).ordering_key("busy");
    outbox::enqueue(&mut conn, pending).await.expect("enqueue");

    let kept = outbox::prune_sent(&mut conn, Duration::from_secs(3_600))
        .await
        .expect("prune");
    assert_eq!(kept, 0, "nothing was sent an hour ago");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let pruned = outbox::prune_sent(&mut conn, Duration::from_millis(1))
        .await
        .expect("prune");
    assert_eq!(pruned, 2_500);
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) FROM inbox_outbox").await,
        1,
        "the unsent one stays"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT COUNT(*) FROM inbox_outbox_keys WHERE ordering_key = 'idle'"
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT COUNT(*) FROM inbox_outbox_keys WHERE ordering_key = 'busy'"
        )
        .await,
        1
    );

    // A key's row pruned while it has an unsent message: the next message still goes
    // after it.
    conn.batch_execute("DELETE FROM inbox_outbox_keys")
        .await
        .expect("forget the keys");
    let later = OutboxMessage::new("d", b"later".to_vec()).ordering_key("busy");
    outbox::enqueue(&mut conn, later).await.expect("enqueue");
    let payloads: Vec<Vec<u8>> = drain(&mut conn)
        .await
        .iter()
        .map(|message| message.payload().to_vec())
        .collect();
    assert_eq!(payloads, [b"pending".to_vec(), b"later".to_vec()]);
}

/// A claim's body runs outside a transaction: what it enqueues commits at once, like
/// its other writes, and stays when the body fails. Run again, it enqueues the same id,
/// which the receiver drops.
pub async fn claim_bodies_enqueue_at_once_with_stable_ids<D: TestDb>(db: D) {
    let mut conn = migrated(&db).await;
    let credit = Credit::numbered(9);
    let failed = claim_and_announce(&mut conn, &credit, true).await;
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) FROM inbox_outbox").await,
        1
    );
    let Ok(Outcome::Processed(id)) = claim_and_announce(&mut conn, &credit, false).await else {
        panic!("the next delivery runs the body again");
    };
    let sent = drain(&mut conn).await;
    let ids: Vec<&str> = sent.iter().map(|message| message.message_id()).collect();
    assert_eq!(
        ids,
        [id.as_str(), id.as_str()],
        "both runs enqueue the same id"
    );
}

/// Three relays take from one outbox at once, and one of them stops halfway without
/// marking what it took: every message is taken by one relay at a time, the abandoned
/// ones again once their lease ends, and one key's messages in the order enqueued.
pub async fn racing_relays_take_each_message_once<D: TestDb>(db: D) {
    const MESSAGES: usize = 120;
    const KEYS: usize = 6;
    let mut conn = migrated(&db).await;
    for n in 0..MESSAGES {
        let message = OutboxMessage::new("accounts", n.to_string().into_bytes())
            .ordering_key(format!("key-{}", n % KEYS));
        outbox::enqueue(&mut conn, message).await.expect("enqueue");
    }
    let lease = Duration::from_millis(800);
    let mut relays = Vec::new();
    for relay in 0..3 {
        let db = db.clone();
        relays.push(tokio::spawn(async move {
            let mut conn = db.connect().await;
            let mut published: Vec<(usize, usize)> = Vec::new();
            let mut idle = 0;
            while idle < 20 {
                let taken = outbox::take(&mut conn, lease, 4).await.expect("take");
                if taken.is_empty() {
                    idle += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                idle = 0;
                // The first relay abandons its second take: those messages wait for
                // their lease to end, and another relay takes them.
                if relay == 0 && published.len() >= 4 {
                    drop(taken);
                    return published;
                }
                for taken in taken {
                    let n: usize = String::from_utf8_lossy(taken.message().payload())
                        .parse()
                        .expect("a number");
                    published.push((relay, n));
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    taken.sent(&mut conn).await.expect("mark sent");
                }
            }
            published
        }));
    }
    let mut published = Vec::new();
    for relay in relays {
        published.extend(relay.await.expect("a relay"));
    }
    let mut times: BTreeMap<usize, usize> = BTreeMap::new();
    for &(_, n) in &published {
        *times.entry(n).or_default() += 1;
    }
    assert_eq!(times.len(), MESSAGES, "every message is published");
    assert!(
        times.values().all(|&count| count == 1),
        "no message is published twice while its lease runs: {times:?}"
    );
    assert!(published.iter().any(|&(relay, _)| relay != 0));
    assert_eq!(
        count(
            &mut conn,
            "SELECT COUNT(*) FROM inbox_outbox WHERE sent_at IS NULL"
        )
        .await,
        0
    );
}

/// One key's messages are numbered in the order their transactions commit: a second
/// transaction that enqueues under the key waits for the first, and the relay takes
/// only the first unsent message of a key.
pub async fn one_keys_messages_go_out_in_commit_order<D: TestDb>(db: D) {
    let mut conn = migrated(&db).await;
    let mut first = db.connect().await;
    first.batch_execute("BEGIN").await.expect("begin");
    let message = OutboxMessage::new("accounts", b"first".to_vec()).ordering_key("account-1");
    outbox::enqueue(&mut first, message)
        .await
        .expect("enqueue the first");

    let second = tokio::spawn({
        let db = db.clone();
        async move {
            let mut conn = db.connect().await;
            let message =
                OutboxMessage::new("accounts", b"second".to_vec()).ordering_key("account-1");
            outbox::enqueue(&mut conn, message)
                .await
                .expect("enqueue the second");
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "the second waits for the first transaction"
    );
    first
        .batch_execute("COMMIT")
        .await
        .expect("commit the first");
    second.await.expect("the second commits after it");

    let taken = outbox::take(&mut conn, Duration::from_secs(30), 10)
        .await
        .expect("take");
    let payloads: Vec<&[u8]> = taken
        .iter()
        .map(|taken| taken.message().payload())
        .collect();
    assert_eq!(
        payloads,
        [b"first".as_slice()],
        "only the key's first message is due"
    );
    for taken in taken {
        taken.sent(&mut conn).await.expect("sent");
    }
    let payloads: Vec<Vec<u8>> = drain(&mut conn)
        .await
        .iter()
        .map(|message| message.payload().to_vec())
        .collect();
    assert_eq!(payloads, [b"second".to_vec()]);
}

/// Takes the first due message, if there is one.
async fn take_one<C>(conn: &mut C) -> Option<Taken>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let mut taken = outbox::take(conn, Duration::from_secs(30), 1)
        .await
        .expect("take");
    taken.pop()
}

/// A publish that failed is retried after its delay; one that never can succeed is
/// parked, listed for the operator with its reason, and holds back its key until it is
/// requeued or discarded.
pub async fn failed_publishes_are_retried_or_parked<D: TestDb>(db: D) {
    let mut conn = migrated(&db).await;
    for payload in ["a1", "a2"] {
        let message = OutboxMessage::new("accounts", payload.as_bytes().to_vec()).ordering_key("a");
        outbox::enqueue(&mut conn, message).await.expect("enqueue");
    }
    let first = take_one(&mut conn).await.expect("a1 is due");
    assert!(
        first
            .retry_later(&mut conn, Duration::from_millis(400), "broker unreachable")
            .await
            .expect("retry later")
    );
    assert!(
        take_one(&mut conn).await.is_none(),
        "a1 waits, and a2 waits behind it"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let again = take_one(&mut conn).await.expect("a1 is due again");
    assert_eq!(again.message().payload(), b"a1");
    assert_eq!(again.message().attempts(), 2);
    assert_eq!(again.message().last_error(), Some("broker unreachable"));

    assert!(
        again
            .park(&mut conn, "NOT_FOUND - no exchange 'accounts'")
            .await
            .expect("park")
    );
    assert!(
        take_one(&mut conn).await.is_none(),
        "a parked message holds back its key"
    );
    let parked = outbox::parked(&mut conn, 0, 10)
        .await
        .expect("list the parked");
    assert_eq!(parked.len(), 1);
    assert_eq!(
        parked[0].last_error(),
        Some("NOT_FOUND - no exchange 'accounts'")
    );

    assert!(
        outbox::requeue(&mut conn, parked[0].row_id())
            .await
            .expect("requeue")
    );
    let requeued = take_one(&mut conn).await.expect("a1 is due once requeued");
    assert!(
        requeued
            .park(&mut conn, "still unroutable")
            .await
            .expect("park")
    );
    assert!(
        outbox::discard(&mut conn, parked[0].row_id())
            .await
            .expect("discard")
    );
    assert!(
        !outbox::discard(&mut conn, parked[0].row_id())
            .await
            .expect("discard twice")
    );
    let key_rows = "SELECT COUNT(*) FROM inbox_outbox_keys WHERE ordering_key = 'a'";
    assert_eq!(
        count(&mut conn, key_rows).await,
        1,
        "a2 still numbers after it"
    );
    let next = take_one(&mut conn)
        .await
        .expect("a2 goes once a1 is discarded");
    assert_eq!(next.message().payload(), b"a2");

    // Discarding a key's last message deletes the key's row too.
    let lonely = OutboxMessage::new("accounts", b"l1".to_vec()).ordering_key("lonely");
    outbox::enqueue(&mut conn, lonely).await.expect("enqueue");
    let lonely = take_one(&mut conn).await.expect("l1 is due");
    let lonely_row = lonely.message().row_id();
    assert!(lonely.park(&mut conn, "unroutable").await.expect("park"));
    assert!(
        outbox::discard(&mut conn, lonely_row)
            .await
            .expect("discard")
    );
    let lonely_key = "SELECT COUNT(*) FROM inbox_outbox_keys WHERE ordering_key = 'lonely'";
    assert_eq!(count(&mut conn, lonely_key).await, 0);

    // A relay whose lease ended cannot settle what another relay took since.
    let lease = Duration::from_millis(200);
    assert!(
        next.retry_later(&mut conn, Duration::ZERO, "retry at once")
            .await
            .expect("retry")
    );
    let short = outbox::take(&mut conn, lease, 1)
        .await
        .expect("take")
        .pop()
        .expect("a2");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let taken_over = take_one(&mut conn)
        .await
        .expect("a2 is due once the lease ends");
    assert!(!short.park(&mut conn, "too late").await.expect("park"));
    taken_over.sent(&mut conn).await.expect("sent");
    assert!(
        outbox::parked(&mut conn, 0, 10)
            .await
            .expect("list")
            .is_empty()
    );
}

/// Enqueues two messages under the ordering key `key`.
#[idempotent(consumer = "outbox-announce-twice", key = key)]
async fn announce_twice<C>(conn: &mut C, key: &str) -> Result<(), Error>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    // The first's text is not ASCII and its payload not UTF-8, so that a session that
    // converts parameters would show; the second is empty: no routing key, no headers,
    // no payload.
    let first = OutboxMessage::new("d-é", FIRST_PAYLOAD.to_vec())
        .id(FIRST_ID)
        .routing_key("r-日本")
        .header("h", "ü")
        .ordering_key(key);
    outbox::enqueue(conn, first).await?;
    outbox::enqueue(conn, OutboxMessage::new("d", Vec::new()).ordering_key(key)).await?;
    Ok(())
}

/// [`announce_twice`]'s first message's id and payload.
const FIRST_ID: &str = "first-é-😀";
const FIRST_PAYLOAD: &[u8] = &[b'f', 0xC3, 0xA9, 0xFF, 0x00, 0x80];

/// Enqueues two messages of one ordering key, then takes, parks, requeues, sends,
/// discards and prunes them, checking from a second session that each step committed.
/// Before each step the session reads, which opens a transaction where autocommit is
/// off. `label` names the session's settings.
pub async fn relay_steps_commit<D: TestDb>(db: &D, conn: &mut D::Conn, label: &str) {
    let mut observer = db.connect().await;
    let mut committed = async |sql: &str| select_i64(&mut observer, sql).await.expect(sql);
    assert_eq!(
        announce_twice(conn, label).await,
        Ok(Outcome::Processed(())),
        "{label}"
    );
    let unsent = "SELECT COUNT(*) FROM inbox_outbox WHERE sent_at IS NULL AND NOT parked";
    assert_eq!(committed(unsent).await, 2, "{label}");

    let read = async |conn: &mut D::Conn| {
        select_i64(conn, "SELECT COUNT(*) FROM inbox_outbox")
            .await
            .expect("the session's read");
    };
    let lease = Duration::from_secs(30);
    read(conn).await;
    let mut taken = outbox::take(conn, lease, 10)
        .await
        .unwrap_or_else(|error| panic!("{label}: take: {error}"));
    assert_eq!(
        taken.len(),
        1,
        "{label}: the key's second waits for its first"
    );
    let first = taken.remove(0);
    let message = first.message();
    assert_eq!(
        (
            message.message_id(),
            message.destination(),
            message.routing_key()
        ),
        (FIRST_ID, "d-é", "r-日本"),
        "{label}"
    );
    assert_eq!(message.ordering_key(), Some(label), "{label}");
    assert_eq!(
        message.headers(),
        [("h".to_owned(), "ü".to_owned())],
        "{label}"
    );
    assert_eq!(message.payload(), FIRST_PAYLOAD, "{label}");
    let row = message.row_id();
    read(conn).await;
    assert!(
        first.park(conn, "probe").await.expect("park"),
        "{label}: parked"
    );
    read(conn).await;
    let parked = outbox::parked(conn, 0, 10).await.expect("parked");
    assert_eq!(parked.len(), 1, "{label}");
    read(conn).await;
    assert!(
        outbox::requeue(conn, row).await.expect("requeue"),
        "{label}"
    );
    assert_eq!(committed(unsent).await, 2, "{label}: requeued");

    let first = outbox::take(conn, lease, 10).await.expect("take again");
    assert_eq!(first.len(), 1, "{label}");
    read(conn).await;
    outbox::sent_all(conn, first).await.expect("sent");
    let sent = "SELECT COUNT(*) FROM inbox_outbox WHERE sent_at IS NOT NULL";
    assert_eq!(committed(sent).await, 1, "{label}: sent");

    let mut second = outbox::take(conn, lease, 10)
        .await
        .expect("take the second");
    assert_eq!(second.len(), 1, "{label}");
    let second = second.remove(0);
    let row = second.message().row_id();
    assert!(second.park(conn, "probe").await.expect("park"), "{label}");
    read(conn).await;
    assert!(
        outbox::discard(conn, row).await.expect("discard"),
        "{label}"
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    read(conn).await;
    let pruned = outbox::prune_sent(conn, Duration::from_millis(1))
        .await
        .unwrap_or_else(|error| panic!("{label}: prune: {error}"));
    assert_eq!(pruned, 1, "{label}");
    assert_eq!(
        committed("SELECT COUNT(*) FROM inbox_outbox").await,
        0,
        "{label}"
    );
    assert_eq!(
        committed("SELECT COUNT(*) FROM inbox_outbox_keys").await,
        0,
        "{label}: the key's row goes with its last message"
    );
}

/// [`relay_steps_commit`] in a session of each of `sessions`' settings.
pub async fn relay_commits_in_each_session<D: TestDb>(db: D, sessions: &[&str]) {
    let mut setup = db.connect().await;
    outbox::migrate(&mut setup)
        .await
        .expect("migrate the outbox");
    for settings in sessions {
        let mut conn = super::connect_with(&db, settings).await;
        relay_steps_commit(&db, &mut conn, settings).await;
    }
}

macro_rules! outbox_scenarios {
    ($db:expr, sessions = [$($settings:expr),+ $(,)?] $(,)?) => {
        outbox_scenarios!(@tests $db;
            messages_commit_and_roll_back_with_the_body,
            default_ids_are_the_same_on_every_delivery,
            batch_messages_commit_with_the_batch,
            invalid_messages_are_refused_before_writing,
            racing_relays_take_each_message_once,
            one_keys_messages_go_out_in_commit_order,
            failed_publishes_are_retried_or_parked,
            claim_bodies_enqueue_at_once_with_stable_ids,
            sent_messages_are_pruned_with_idle_keys,
        );

        /// The relay's, the pruner's and the operator's calls begin and commit in a
        /// session of each of these settings.
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn the_relay_commits_in_every_session() {
            if let Some(db) = $db("outbox_relay_sessions").await {
                common::bounded(common::outbox::relay_commits_in_each_session(
                    db.clone(),
                    &[$($settings),+],
                ))
                .await;
                common::TestDb::cleanup(db).await;
            }
        }
    };
    (@tests $db:expr; $($test:ident),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $test() {
            if let Some(db) = $db(concat!("outbox_", stringify!($test))).await {
                common::bounded(common::outbox::$test(db.clone())).await;
                common::TestDb::cleanup(db).await;
            }
        }
    )+};
}
