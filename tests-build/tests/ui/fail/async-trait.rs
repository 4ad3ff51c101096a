use diesel_async::AsyncPgConnection;

#[async_trait::async_trait]
trait Handler {
    async fn handle(&self, conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error>;
}

struct Credit;

#[async_trait::async_trait]
impl Handler for Credit {
    #[diesel_inbox::idempotent(consumer = "c", key = id)]
    async fn handle(&self, conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
        let _ = (conn, id);
        Ok(())
    }
}

fn main() {}
