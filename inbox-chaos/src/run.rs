//! The run: plan -> publish -> consume under kills -> drain -> verify -> report.
//!
//! A run has one group of processes (the consumers), or three for the outbox chain
//! (service A, the relays, service B), each killed in turn.

use std::collections::HashSet;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use diesel_async::AsyncPgConnection;
use diesel_inbox::testing::{TestDatabase, select_i64};
use inbox_fixtures::credit::{Credit, CreditTables};
use inbox_fixtures::downstream::Downstream;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::handlers::NAIVE_CONSUMER;
use crate::{BoxError, Broker, Handler, RunArgs, Stage, chain, events, nats, rabbitmq};

const ACCOUNTS: i64 = 50;
/// Messages to a publishing chunk; a duplicate is at most twice as far from its original.
const DUPLICATE_DISTANCE: usize = 12;

#[expect(clippy::large_enum_variant, reason = "one value per run")]
enum Topology {
    Rabbitmq(rabbitmq::Topology),
    Nats(nats::Topology),
}

impl Topology {
    async fn create(args: &RunArgs, name: &str) -> Result<Self, BoxError> {
        match args.broker {
            Broker::Rabbitmq => rabbitmq::Topology::create(&args.endpoints.amqp_url, name)
                .await
                .map(Self::Rabbitmq),
            Broker::Nats => nats::Topology::create(&args.endpoints.nats_url, name)
                .await
                .map(Self::Nats),
        }
    }

    async fn publish(&self, chunks: &[Vec<Credit>]) -> Result<u64, BoxError> {
        match self {
            Self::Rabbitmq(topology) => topology.publish(&chunks.concat()).await,
            Self::Nats(topology) => topology.publish(chunks).await,
        }
    }

    /// Messages still to be handled.
    async fn ready(&self) -> Result<u64, BoxError> {
        match self {
            Self::Rabbitmq(topology) => topology.ready().await,
            Self::Nats(topology) => topology.ready().await,
        }
    }

    /// Messages left in the queue or stream once every consumer has stopped.
    async fn left(&self) -> Result<u64, BoxError> {
        match self {
            Self::Rabbitmq(topology) => topology.ready().await,
            Self::Nats(topology) => topology.stored().await,
        }
    }

    async fn dead_letters(&self) -> Result<u64, BoxError> {
        match self {
            Self::Rabbitmq(topology) => topology.dead_letters().await,
            Self::Nats(topology) => topology.dead_letters().await,
        }
    }

    async fn delete(self) -> Result<(), BoxError> {
        match self {
            Self::Rabbitmq(topology) => topology.delete().await,
            Self::Nats(topology) => topology.delete().await,
        }
    }
}

/// What a group's processes reported: a consumer one line per settled delivery, a
/// relay one per confirmed publish.
#[derive(Default)]
struct Counters {
    processed: AtomicU64,
    declined: AtomicU64,
    published: AtomicU64,
    duplicates: AtomicU64,
    retried: AtomicU64,
    in_progress: AtomicU64,
    dead_lettered: AtomicU64,
    unsettled: AtomicU64,
    redelivered: AtomicU64,
}

impl Counters {
    fn record(&self, line: &str) {
        let (label, redelivered) = line.split_once(' ').unwrap_or((line, "0"));
        let counter = match label {
            "processed" => &self.processed,
            "declined" => &self.declined,
            "published" => &self.published,
            "duplicate" => &self.duplicates,
            "retried" => &self.retried,
            "in-progress" => &self.in_progress,
            "dead-lettered" => &self.dead_lettered,
            _ => &self.unsettled,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if redelivered == "1" {
            self.redelivered.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// Confirmed publishes, of a relay group.
    fn published(&self) -> u64 {
        Self::get(&self.published)
    }

    /// Duplicates acked, of a consumer group.
    fn duplicates(&self) -> u64 {
        Self::get(&self.duplicates)
    }

    /// `<n> processed, <n> duplicates acked, …; redeliveries seen: <n>`.
    fn deliveries(&self) -> String {
        let declined = match Self::get(&self.declined) {
            0 => String::new(),
            declined => format!("{declined} declined, "),
        };
        format!(
            "{} processed, {declined}{} duplicates acked, {} retried, \
             {} retried as in progress, {} dead-lettered, {} unsettled; \
             redeliveries seen: {}",
            Self::get(&self.processed),
            Self::get(&self.duplicates),
            Self::get(&self.retried),
            Self::get(&self.in_progress),
            Self::get(&self.dead_lettered),
            Self::get(&self.unsettled),
            Self::get(&self.redelivered),
        )
    }
}

/// Which processes a group runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Service {
    /// The credits' consumers: service A of the chain.
    Credit,
    /// The chain's outbox relays.
    Relay,
    /// The chain's service B, which records the events.
    Record,
}

impl Service {
    fn name(self) -> &'static str {
        match self {
            Self::Credit => "service A",
            Self::Relay => "relays",
            Self::Record => "service B",
        }
    }
}

/// One service's processes: started, killed and stopped together, and what they reported.
struct Processes<'a> {
    service: Service,
    /// How many run at once.
    size: usize,
    args: &'a RunArgs,
    /// The queue or stream the consumers take, or the relays publish to.
    queue: &'a Topology,
    name: &'a str,
    /// The chain's events, which service A sends to.
    events: Option<&'a str>,
    schema_url: &'a str,
    downstream_url: &'a str,
    counters: Arc<Counters>,
    running: Vec<Child>,
    started: u64,
    kills: u64,
}

impl Processes<'_> {
    fn start(&mut self) -> Result<(), BoxError> {
        let mut command = Command::new(std::env::current_exe()?);
        match self.service {
            Service::Credit | Service::Record => {
                let stage = match self.service {
                    Service::Record => Stage::Record,
                    _ => Stage::Credit,
                };
                command
                    .arg("consume")
                    .args(["--handler", &value_name(self.args.handler())])
                    .args(["--stage", &value_name(stage)])
                    .args(["--name", self.name])
                    .args(["--concurrency", &self.args.concurrency.to_string()])
                    .args(["--downstream-url", self.downstream_url]);
                if let Some(events) = self.events {
                    command.args(["--events", events]);
                }
            }
            Service::Relay => {
                command.arg("relay");
            }
        }
        let mut child = command
            .args(["--broker", &value_name(self.args.broker)])
            .args(["--schema-url", self.schema_url])
            .args(["--database-url", &self.args.endpoints.database_url])
            .args(["--amqp-url", &self.args.endpoints.amqp_url])
            .args(["--nats-url", &self.args.endpoints.nats_url])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().expect("piped stdout");
        let counters = Arc::clone(&self.counters);
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                counters.record(&line);
            }
        });
        self.running.push(child);
        self.started += 1;
        Ok(())
    }

    fn start_all(&mut self) -> Result<(), BoxError> {
        for _ in 0..self.size {
            self.start()?;
        }
        Ok(())
    }

    /// SIGKILL to a random process, then a new one in its place.
    async fn kill_one(&mut self) -> Result<(), BoxError> {
        let mut victim = self
            .running
            .swap_remove(fastrand::usize(..self.running.len()));
        victim.start_kill()?;
        victim.wait().await?;
        self.kills += 1;
        self.start()
    }

    /// SIGTERM to every process: a consumer stops taking deliveries and finishes its
    /// handlers, a relay publishes and settles the round under way.
    async fn stop_all(&mut self) -> Result<(), BoxError> {
        for child in &self.running {
            if let Some(pid) = child.id() {
                Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status()
                    .await?;
            }
        }
        for mut child in self.running.drain(..) {
            if tokio::time::timeout(Duration::from_secs(30), child.wait())
                .await
                .is_err()
            {
                child.start_kill()?;
                child.wait().await?;
                let service = self.service.name();
                return Err(
                    format!("a process of {service} did not stop within 30 s of SIGTERM").into(),
                );
            }
        }
        Ok(())
    }
}

fn value_name<T: ValueEnum>(value: T) -> String {
    let value = value.to_possible_value().expect("no skipped variants");
    value.get_name().to_owned()
}

/// The unique messages, and the order they are published in, in chunks of
/// `DUPLICATE_DISTANCE`: each duplicate goes into the chunk after its original's, as a
/// producer retrying a lost confirm sends it soon after, close enough for the two
/// copies to be handled at the same time by different consumers.
fn plan(args: &RunArgs, run: &str) -> (Vec<Credit>, Vec<Vec<Credit>>) {
    let unique: Vec<_> = (0..args.messages)
        .map(|n| Credit {
            message_id: format!("{run}-{n}"),
            account: fastrand::i64(0..ACCOUNTS),
            amount: fastrand::i64(1..=1000),
        })
        .collect();
    let mut chunks = Vec::new();
    let mut duplicates = Vec::new();
    for originals in unique.chunks(DUPLICATE_DISTANCE) {
        let mut chunk = originals.to_vec();
        for duplicate in duplicates.drain(..) {
            chunk.insert(fastrand::usize(..=chunk.len()), duplicate);
        }
        duplicates = originals
            .iter()
            .filter(|_| fastrand::f64() < args.duplicates)
            .cloned()
            .collect();
        chunks.push(chunk);
    }
    if !duplicates.is_empty() {
        chunks.push(duplicates);
    }
    (unique, chunks)
}

pub(crate) async fn run(args: RunArgs) -> Result<(), BoxError> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.timeout_secs);
    let broker = value_name(args.broker);
    let handler = value_name(args.handler());
    let chained = args.handler().is_chain();
    let run_id = format!("{}{}", std::process::id(), fastrand::u32(..));
    let name = format!("inbox-chaos-{broker}-{run_id}");
    let events_name = format!("{name}-events");

    let db = TestDatabase::postgres(
        &args.endpoints.database_url,
        &format!("chaos_{broker}_{run_id}"),
    )
    .await?;
    let mut conn = db.connect().await?;
    conn.create_credit_tables(ACCOUNTS).await?;
    if chained {
        chain::create_tables(&mut conn).await?;
    }

    let topology = match Topology::create(&args, &name).await {
        Ok(topology) => topology,
        Err(error) => {
            drop(conn);
            db.cleanup().await?;
            return Err(error);
        }
    };
    let events = if chained {
        match Topology::create(&args, &events_name).await {
            Ok(events) => Some(events),
            Err(error) => {
                drop(conn);
                topology.delete().await?;
                db.cleanup().await?;
                return Err(error);
            }
        }
    } else {
        None
    };
    let downstream = Downstream::start().await?;
    let (unique, published) = plan(&args, &run_id);
    let relays = if chained {
        format!(
            ", {} relays, {} event consumers x {} handlers, {} credits declined",
            args.relays,
            args.consumers,
            args.concurrency,
            unique
                .iter()
                .filter(|credit| events::declined(credit))
                .count(),
        )
    } else {
        String::new()
    };
    println!(
        "{broker}, {handler} handler: {} messages, {} of them published twice ({} publishes), \
         {} consumers x {} handlers{relays}, a SIGKILL every ~{} ms",
        unique.len(),
        published.iter().map(Vec::len).sum::<usize>() - unique.len(),
        published.iter().map(Vec::len).sum::<usize>(),
        args.consumers,
        args.concurrency,
        args.kill_every_ms,
    );
    let outcome = async {
        let dropped = topology.publish(&published).await?;
        let published_in = started.elapsed();
        if dropped > 0 {
            println!("the broker dropped {dropped} copies as duplicates of its own");
        }
        let group = |service, size, queue, name| Processes {
            service,
            size,
            args: &args,
            queue,
            name,
            events: None,
            schema_url: db.url(),
            downstream_url: downstream.url(),
            counters: Arc::default(),
            running: Vec::new(),
            started: 0,
            kills: 0,
        };
        let mut groups = vec![group(Service::Credit, args.consumers, &topology, &name)];
        if let Some(events) = &events {
            groups[0].events = Some(&events_name);
            groups.push(group(Service::Relay, args.relays, events, &events_name));
            groups.push(group(Service::Record, args.consumers, events, &events_name));
        }
        let kills = consume_under_kills(&args, &mut groups, &mut conn, &unique, deadline).await?;
        let elapsed = started.elapsed();
        let mut verdict = verify(&args, &topology, &mut conn, &unique, &downstream).await?;
        let figures = match &events {
            Some(events) => {
                let queue = chain::EventsQueue {
                    left: events.left().await?,
                    dead_letters: events.dead_letters().await?,
                };
                Some(chain::verify(args.handler(), &mut conn, &unique, queue, &mut verdict).await?)
            }
            None => None,
        };
        let started_processes: u64 = groups.iter().map(|group| group.started).sum();
        let by_service = if chained {
            let kills: Vec<String> = groups
                .iter()
                .map(|group| format!("{} {}", group.service.name(), group.kills))
                .collect();
            format!("{}; ", kills.join(", "))
        } else {
            String::new()
        };
        println!("kills survived: {kills} ({by_service}processes started: {started_processes})");
        for group in &groups {
            if group.service != Service::Relay {
                let service = if chained {
                    format!("{}: ", group.service.name())
                } else {
                    String::new()
                };
                println!(
                    "{service}deliveries settled: {}",
                    group.counters.deliveries()
                );
            }
        }
        if let (Some(figures), [_, relays, recorders]) = (figures, &groups[..]) {
            figures.report(relays.counters.published(), recorders.counters.duplicates());
        }
        println!(
            "elapsed: {:.1} s (publishing {:.1} s, consuming under kills until drained {:.1} s)",
            elapsed.as_secs_f64(),
            published_in.as_secs_f64(),
            (elapsed - published_in).as_secs_f64(),
        );
        if args.handler() == Handler::Claim {
            println!(
                "downstream: {} calls, {} effects, {} calls absorbed by the idempotency-key \
                 deduplication",
                downstream.calls(),
                downstream.effects(),
                downstream.absorbed(),
            );
        }
        Ok::<_, BoxError>(verdict)
    }
    .await;
    drop(conn);
    topology.delete().await?;
    if let Some(events) = events {
        events.delete().await?;
    }
    db.cleanup().await?;
    let failures = outcome?;
    if failures.is_empty() {
        if chained {
            println!(
                "PASSED: every credit applied exactly once, and its event recorded exactly once"
            );
        } else {
            println!("PASSED: every credit applied exactly once");
        }
        Ok(())
    } else {
        for failure in &failures {
            println!("FAILED: {failure}");
        }
        Err(format!("{} checks failed", failures.len()).into())
    }
}

/// How far the run has come: the credits applied, and whether everything is done.
async fn progress(
    args: &RunArgs,
    groups: &[Processes<'_>],
    conn: &mut AsyncPgConnection,
    unique: &[Credit],
) -> Result<(i64, bool), BoxError> {
    let applied = match args.handler() {
        Handler::Inbox => "SELECT COUNT(DISTINCT message_id) FROM inbox".to_owned(),
        Handler::Naive => "SELECT COUNT(DISTINCT message_id) FROM naive_inbox".to_owned(),
        Handler::Claim => {
            "SELECT COUNT(DISTINCT message_id) FROM inbox WHERE lease_ends_at IS NULL".to_owned()
        }
        Handler::Outbox | Handler::OutboxNaive | Handler::OutboxAfterCommit => {
            chain::applied_sql(args.handler())
        }
    };
    let applied = select_i64(conn, &applied).await?;
    let expected = if args.handler().is_chain() {
        chain::committed(unique).count()
    } else {
        unique.len()
    };
    if applied < expected as i64 {
        return Ok((applied, false));
    }
    if args.handler().is_chain() && !chain::relayed(args.handler(), conn).await? {
        return Ok((applied, false));
    }
    for group in groups {
        if group.service != Service::Relay && group.queue.ready().await? > 0 {
            return Ok((applied, false));
        }
    }
    Ok((applied, true))
}

/// Runs the groups' processes, killing one once they are under way and then about
/// every `kill_every_ms` (the groups in turn, in a new random order each round), until
/// every message has been applied and none is left to handle; then stops the groups
/// gracefully, in the order messages flow through them, and lets one consumer of each
/// take what their stop handed back. Returns the number of kills.
async fn consume_under_kills(
    args: &RunArgs,
    groups: &mut [Processes<'_>],
    conn: &mut AsyncPgConnection,
    unique: &[Credit],
    deadline: Instant,
) -> Result<u64, BoxError> {
    for group in groups.iter_mut() {
        group.start_all()?;
    }
    let next_kill = |from: Instant| from + args.kill_interval().mul_f64(0.5 + fastrand::f64());
    let mut kill_at = next_kill(Instant::now());
    let mut kills = 0;
    let mut turns: Vec<usize> = Vec::new();
    loop {
        let (applied, done) = progress(args, groups, conn, unique).await?;
        if done {
            break;
        }
        if Instant::now() > deadline {
            for group in groups.iter_mut() {
                group.stop_all().await?;
            }
            return Err(format!(
                "not drained in time: {applied} of {} messages applied",
                unique.len()
            )
            .into());
        }
        // The first kill as soon as the consumers are under way, so that a run that
        // drains faster than the first interval is still killed mid-stream.
        if Instant::now() >= kill_at || (kills == 0 && applied > 0) {
            if turns.is_empty() {
                turns = (0..groups.len()).collect();
                fastrand::shuffle(&mut turns);
            }
            let victim = turns.pop().expect("refilled");
            groups[victim].kill_one().await?;
            kills += 1;
            kill_at = next_kill(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for group in groups.iter_mut() {
        match group.service {
            // What service A did while its copies were drained is published first.
            Service::Relay => {
                while chain::unsent(conn).await? > 0 {
                    if Instant::now() > deadline {
                        return Err("the outbox was not relayed in time".into());
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                group.stop_all().await?;
            }
            Service::Credit | Service::Record => {
                group.stop_all().await?;
                // Deliveries prefetched but not started when the consumers stopped went
                // back to the queue: one more consumer, without kills, takes them.
                while group.queue.ready().await? > 0 {
                    if Instant::now() > deadline {
                        return Err(
                            "deliveries handed back at the stop were not drained in time".into(),
                        );
                    }
                    group.start()?;
                    while group.queue.ready().await? > 0 && Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    group.stop_all().await?;
                }
            }
        }
    }
    Ok(kills)
}

/// Every balance equals the sum of its unique messages (for the chain, of those service A
/// did not decline), one marker per message, the
/// queue is empty and nothing was dead-lettered; for the claim handler, the balances
/// are the downstream service's, each message took effect under one key only, and no
/// claim is left open. Returns what failed.
async fn verify(
    args: &RunArgs,
    topology: &Topology,
    conn: &mut AsyncPgConnection,
    unique: &[Credit],
    downstream: &Downstream,
) -> Result<Vec<String>, BoxError> {
    let mut failures = Vec::new();
    let balances = if args.handler() == Handler::Claim {
        sums_by_account(&downstream.credits())
    } else {
        conn.balances().await?
    };
    // The chain's service A declines some credits, which must leave no trace.
    let committed: Vec<Credit> = if args.handler().is_chain() {
        chain::committed(unique).cloned().collect()
    } else {
        unique.to_vec()
    };
    let expected = sums_by_account(&committed);
    let mut wrong_accounts = 0;
    let mut excess = 0;
    for (&balance, &want) in balances.iter().zip(&expected) {
        if balance != want {
            wrong_accounts += 1;
            excess += balance - want;
        }
    }
    if wrong_accounts > 0 {
        failures.push(format!(
            "{wrong_accounts} of {ACCOUNTS} balances differ from the sum of their unique \
             messages, by {excess} in total"
        ));
    }
    let unique_count = unique.len() as i64;
    match args.handler() {
        Handler::Inbox => check_markers(conn, unique_count, &mut failures).await?,
        // `chain::verify` checks service A's markers, beside service B's.
        Handler::Outbox | Handler::OutboxNaive | Handler::OutboxAfterCommit => {}
        Handler::Claim => {
            check_markers(conn, unique_count, &mut failures).await?;
            check_effects(conn, unique, downstream, &mut failures).await?;
        }
        Handler::Naive => {
            let doubled = select_i64(
                conn,
                &format!(
                    "SELECT COUNT(*) FROM (SELECT message_id FROM naive_inbox \
                     WHERE consumer = '{NAIVE_CONSUMER}' \
                     GROUP BY message_id HAVING COUNT(*) > 1) AS doubled"
                ),
            )
            .await?;
            let applied =
                format!("SELECT COUNT(*) FROM naive_inbox WHERE consumer = '{NAIVE_CONSUMER}'");
            let extra = select_i64(conn, &applied).await? - unique_count;
            if doubled > 0 {
                failures.push(format!(
                    "double-applied messages: {doubled} ({extra} extra credits)"
                ));
            }
        }
    }
    let left = topology.left().await?;
    if left > 0 {
        failures.push(format!("{left} messages left in the queue"));
    }
    let dead = topology.dead_letters().await?;
    if dead > 0 {
        failures.push(format!("{dead} messages dead-lettered"));
    }
    Ok(failures)
}

/// The sum of `credits` per account, for accounts `0..ACCOUNTS`.
fn sums_by_account(credits: &[Credit]) -> Vec<i64> {
    let mut sums = vec![0; ACCOUNTS as usize];
    for credit in credits {
        sums[credit.account as usize] += credit.amount;
    }
    sums
}

async fn check_markers(
    conn: &mut AsyncPgConnection,
    unique_count: i64,
    failures: &mut Vec<String>,
) -> Result<(), BoxError> {
    let markers = select_i64(conn, "SELECT COUNT(*) FROM inbox").await?;
    let keys = select_i64(conn, "SELECT COUNT(DISTINCT message_id) FROM inbox").await?;
    if markers != unique_count || keys != unique_count {
        failures.push(format!(
            "{markers} markers for {keys} keys, expected one for each of {unique_count} messages"
        ));
    }
    Ok(())
}

/// One downstream effect per message, under one key, and every claim completed.
async fn check_effects(
    conn: &mut AsyncPgConnection,
    unique: &[Credit],
    downstream: &Downstream,
    failures: &mut Vec<String>,
) -> Result<(), BoxError> {
    let published: HashSet<&str> = unique
        .iter()
        .map(|credit| credit.message_id.as_str())
        .collect();
    let credits = downstream.credits();
    let effected: HashSet<&str> = credits
        .iter()
        .map(|credit| credit.message_id.as_str())
        .collect();
    let missing = published.difference(&effected).count();
    let unknown = effected.difference(&published).count();
    let effects = downstream.effects();
    if effects != unique.len() || missing > 0 || unknown > 0 {
        failures.push(format!(
            "{effects} downstream effects for {} messages ({missing} messages without one, \
             {unknown} effects for no published message)",
            unique.len(),
        ));
    }
    let several = downstream.messages_with_several_effects();
    if several > 0 {
        failures.push(format!(
            "{several} messages took effect downstream under more than one idempotency key"
        ));
    }
    let open = select_i64(
        conn,
        "SELECT COUNT(*) FROM inbox WHERE lease_ends_at IS NOT NULL",
    )
    .await?;
    let stale = diesel_inbox::claims::list_stale(conn).await?.len();
    if open > 0 || stale > 0 {
        failures.push(format!(
            "claims left open: {open} markers not completed, {stale} stale claims listed"
        ));
    }
    Ok(())
}
