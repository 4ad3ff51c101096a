use clap::Parser as _;
use inbox_bench::{Args, Plan};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let argv: Vec<String> = std::env::args().collect();
    let plan = Plan::new(Args::parse(), &argv)?;
    inbox_bench::run(&plan).await?;
    Ok(())
}
