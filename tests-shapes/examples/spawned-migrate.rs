//! `migrate` can run in `tokio::spawn`, as start-up work often does, on every backend and
//! on pooled connections.
#![deny(warnings)]

use diesel::sqlite::SqliteConnection;
use diesel_async::pooled_connection::{AsyncDieselConnectionManager, bb8, deadpool};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, AsyncMysqlConnection, AsyncPgConnection};

type Sqlite = SyncConnectionWrapper<SqliteConnection>;

fn spawn_all(url: String) {
    let pg_url = url.clone();
    tokio::spawn(async move {
        let mut conn = AsyncPgConnection::establish(&pg_url).await?;
        diesel_inbox::migrate(&mut conn).await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    });
    let mysql_url = url.clone();
    tokio::spawn(async move {
        let mut conn = AsyncMysqlConnection::establish(&mysql_url).await?;
        diesel_inbox::migrate(&mut conn).await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    });
    let sqlite_url = url.clone();
    tokio::spawn(async move {
        let mut conn = Sqlite::establish(&sqlite_url).await?;
        diesel_inbox::migrate(&mut conn).await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    });
    let deadpool_url = url.clone();
    tokio::spawn(async move {
        let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(deadpool_url);
        let pool = deadpool::Pool::builder(manager).build()?;
        let mut conn = pool.get().await?;
        diesel_inbox::migrate(&mut conn).await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    });
    tokio::spawn(async move {
        let manager = AsyncDieselConnectionManager::<AsyncMysqlConnection>::new(url);
        let pool = bb8::Pool::builder().build(manager).await?;
        let mut conn = pool.get().await?;
        diesel_inbox::migrate(&mut *conn).await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    });
}

fn main() {
    let _ = spawn_all;
}
