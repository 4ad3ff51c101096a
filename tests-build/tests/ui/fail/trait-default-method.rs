use diesel_async::AsyncPgConnection;
use diesel_inbox::idempotent;

trait Projector {
    fn table(&self) -> &'static str;

    #[idempotent(consumer = "project", key = id)]
    async fn project(&self, conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
        let _ = (conn, self.table());
        Ok(())
    }
}

fn main() {}
