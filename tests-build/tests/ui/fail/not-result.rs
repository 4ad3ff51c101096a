use diesel_async::AsyncPgConnection;

#[diesel_inbox::idempotent(consumer = "c", key = id)]
async fn handle(conn: &mut AsyncPgConnection, id: u64) -> Option<()> {
    let _ = (conn, id);
    None
}

fn main() {}
