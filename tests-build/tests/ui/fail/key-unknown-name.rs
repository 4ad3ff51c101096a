use diesel_async::AsyncPgConnection;

struct Msg {
    id: u64,
}

#[diesel_inbox::idempotent(consumer = "c", key = message.id)]
async fn handle(conn: &mut AsyncPgConnection, msg: &Msg) -> Result<(), diesel::result::Error> {
    let _ = (conn, msg.id);
    Ok(())
}

fn main() {}
