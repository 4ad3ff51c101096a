use diesel_async::AsyncPgConnection;

#[diesel_inbox::idempotent(consumer = "credit-v2", key = id)]
async fn credit(conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    let _ = (conn, id);
    Ok(())
}

mod refunds {
    use diesel_async::AsyncPgConnection;

    #[diesel_inbox::idempotent(consumer = "credit-v2", key = id)]
    async fn refund(conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
        let _ = (conn, id);
        Ok(())
    }
}

fn main() {}
