use diesel_async::AsyncPgConnection;

struct MessageId(u64);

struct Msg {
    id: MessageId,
}

#[diesel_inbox::idempotent(consumer = "c", key = msg.id)]
async fn handle(conn: &mut AsyncPgConnection, msg: &Msg) -> Result<(), diesel::result::Error> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {}
