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
//! ```
//!
//! `--handler claim` runs a claim-mode handler whose body calls an HTTP service in the
//! run's own process, which deduplicates by idempotency key and counts calls and
//! effects: the run verifies one effect per message and reports the calls the
//! deduplication absorbed.
//!
//! The same binary is the consumer (`inbox-chaos consume …`, started by the run).

mod handlers;
mod nats;
mod rabbitmq;
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
    /// The queue or stream of this run.
    #[arg(long)]
    name: String,
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
