use diesel_async::AsyncPgConnection;

const TAKEOVER: bool = false;

#[diesel_inbox::idempotent(consumer = "c", key = id, claim, takeover = TAKEOVER)]
async fn handle(conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    let _ = (conn, id);
    Ok(())
}

#[diesel_inbox::idempotent(consumer = "d", key = id, takeover = false)]
async fn without_claim(conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    let _ = (conn, id);
    Ok(())
}

fn main() {}
