//! A pruner over an owned pool is one line, for both of diesel-async's pools: the pool
//! is the pruner's connection source, with no closure to borrow it from.

use std::time::Duration;

use diesel_async::AsyncPgConnection;
use diesel_async::pooled_connection::{AsyncDieselConnectionManager, bb8, deadpool};
use diesel_inbox::Pruner;

const EVERY: Duration = Duration::from_secs(300);
const WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

async fn serve(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(url);
    let deadpool = deadpool::Pool::builder(manager).build()?;
    let pruner = Pruner::spawn(deadpool.clone(), EVERY, WINDOW);
    pruner.shut_down().await;

    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(url);
    let bb8 = bb8::Pool::builder().build(manager).await?;
    let pruner = Pruner::spawn(bb8.clone(), EVERY, WINDOW);
    pruner.shut_down().await;
    Ok(())
}

fn main() {
    let _ = serve;
}
