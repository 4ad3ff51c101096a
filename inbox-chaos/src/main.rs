//! The crash test of issue #12: credit messages flow through a real RabbitMQ queue or
//! NATS JetStream stream to consumer processes, one of which is killed with SIGKILL and
//! started again about once a second, until the queue is drained. Then every effect is
//! counted against what was published.
//!
//! ```text
//! cargo run --release -p inbox-chaos -- --broker rabbitmq
//! cargo run --release -p inbox-chaos -- --broker nats
//! cargo run --release -p inbox-chaos -- --broker rabbitmq --naive   # must report double-applied messages
//! cargo run --release -p inbox-chaos -- --broker nats --handler claim
//! cargo run --release -p inbox-chaos -- --broker rabbitmq --handler outbox
//! cargo run --release -p inbox-chaos -- --broker nats --handler outbox-naive   # must fail
//! ```
//!
//! `--handler claim` runs a claim-mode handler whose body calls an HTTP service in the
//! run's own process, which deduplicates by idempotency key and counts calls and
//! effects: the run verifies one effect per message and reports the calls the
//! deduplication absorbed.
//!
//! `--handler outbox` runs the chain of issue #34: service A consumes the credits,
//! credits and enqueues a "credited" event in the same transaction (declining every
//! tenth credit after that, which rolls both back), relays publish the outbox to a
//! second queue or stream, and service B records each event with `#[idempotent]`. A's,
//! the relays' and B's processes are all killed. `--handler outbox-naive` publishes the
//! event from A's body instead, and `--handler outbox-after-commit` once A's handler
//! has committed: the same checks catch both.
//!
//! The same binary is the consumer (`inbox-chaos consume …`) and the relay
//! (`inbox-chaos relay …`), started by the run.

mod chain;
mod events;
mod handlers;
mod nats;
mod rabbitmq;
mod relay;
mod run;

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Parser)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    consume: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One consumer process (started by the run).
    #[command(hide = true)]
    Consume(ConsumeArgs),
    /// One outbox relay process (started by the run, for the outbox chain).
    #[command(hide = true)]
    Relay(RelayArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Broker {
    Rabbitmq,
    Nats,
}

/// The handler the consumers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Handler {
    /// `#[idempotent]`: the marker and the credit in one transaction.
    Inbox,
    /// "Have I seen this message?", then the credit: what the inbox replaces.
    Naive,
    /// `#[idempotent(…, claim)]`: the credit is a call to an HTTP service that
    /// deduplicates by the claim's idempotency key.
    Claim,
    /// The outbox chain: service A credits and enqueues "credited" in one transaction,
    /// relays publish it, service B records it with `#[idempotent]`.
    Outbox,
    /// The chain with A publishing "credited" from its body: what the outbox replaces.
    OutboxNaive,
    /// The chain with A publishing "credited" once its handler has committed: what the
    /// outbox replaces, the other way.
    OutboxAfterCommit,
}

impl Handler {
    /// Whether the run is the outbox chain, with relays and service B.
    fn is_chain(self) -> bool {
        matches!(
            self,
            Self::Outbox | Self::OutboxNaive | Self::OutboxAfterCommit
        )
    }

    /// Whether service A publishes its events itself, instead of through the outbox.
    fn publishes_directly(self) -> bool {
        matches!(self, Self::OutboxNaive | Self::OutboxAfterCommit)
    }
}

/// Which service of the run a consumer process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Stage {
    /// The credits' consumer (service A of the chain), running `--handler`.
    Credit,
    /// Service B of the outbox chain: records the "credited" events.
    Record,
}

#[derive(Debug, Clone, Args)]
struct Endpoints {
    /// The PostgreSQL server; the run works in a schema of its own and drops it.
    #[arg(
        long,
        env = "POSTGRES_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    database_url: String,
    #[arg(
        long,
        env = "AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672"
    )]
    amqp_url: String,
    #[arg(long, env = "NATS_URL", default_value = "127.0.0.1:4222")]
    nats_url: String,
}

#[derive(Debug, Clone, Args)]
struct RunArgs {
    #[arg(long, value_enum, default_value = "rabbitmq")]
    broker: Broker,
    /// Unique credit messages to publish.
    #[arg(long, default_value_t = 2000)]
    messages: usize,
    /// The share of messages published a second time with the same id.
    #[arg(long, default_value_t = 0.2)]
    duplicates: f64,
    /// Consumer processes.
    #[arg(long, default_value_t = 3)]
    consumers: usize,
    /// Handlers each consumer runs at once (and its prefetch).
    #[arg(long, default_value_t = 8)]
    concurrency: u16,
    /// Relay processes of the outbox chain (and consumers of its events: `--consumers`).
    #[arg(long, default_value_t = 2)]
    relays: usize,
    /// Mean time between two kills, in milliseconds (each one 0.5 to 1.5 times it).
    #[arg(long, default_value_t = 1000)]
    kill_every_ms: u64,
    #[arg(long, value_enum, default_value = "inbox")]
    handler: Handler,
    /// Run the naive check-then-insert handler: `--handler naive`.
    #[arg(long, conflicts_with = "handler")]
    naive: bool,
    /// Give up (and fail) after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
    #[command(flatten)]
    endpoints: Endpoints,
}

#[derive(Debug, Clone, Args)]
struct ConsumeArgs {
    #[arg(long, value_enum)]
    broker: Broker,
    #[arg(long, value_enum)]
    handler: Handler,
    #[arg(long, value_enum, default_value = "credit")]
    stage: Stage,
    /// The queue or stream this consumer takes.
    #[arg(long)]
    name: String,
    /// The queue or stream of the chain's events, which service A sends to.
    #[arg(long)]
    events: Option<String>,
    #[arg(long)]
    concurrency: u16,
    /// The run's schema.
    #[arg(long)]
    schema_url: String,
    /// The run's downstream HTTP service, which the claim handler calls.
    #[arg(long)]
    downstream_url: String,
    #[command(flatten)]
    endpoints: Endpoints,
}

#[derive(Debug, Clone, Args)]
struct RelayArgs {
    #[arg(long, value_enum)]
    broker: Broker,
    /// The run's schema, whose outbox the relay publishes.
    #[arg(long)]
    schema_url: String,
    #[command(flatten)]
    endpoints: Endpoints,
}

impl RunArgs {
    fn handler(&self) -> Handler {
        if self.naive {
            Handler::Naive
        } else {
            self.handler
        }
    }

    fn kill_interval(&self) -> Duration {
        Duration::from_millis(self.kill_every_ms)
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.consume {
        Some(Command::Consume(args)) => match args.broker {
            Broker::Rabbitmq => rabbitmq::consume(args).await,
            Broker::Nats => nats::consume(args).await,
        },
        Some(Command::Relay(args)) => relay::relay(args).await,
        None => run::run(cli.run).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("inbox-chaos: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
