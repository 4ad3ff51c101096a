use diesel_async::AsyncPgConnection;

trait Project {
    #[diesel_inbox::idempotent(consumer = "c", key = id)]
    async fn project(&self, conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error>;
}

fn main() {}
