use diesel_async::AsyncPgConnection;

struct Msg {
    id: u64,
}

struct Other {
    id: u64,
}

#[diesel_inbox::idempotent(consumer = "c", batch = msgs, key = |msg: &Other| msg.id)]
async fn handle(conn: &mut AsyncPgConnection, msgs: &[Msg]) -> Result<(), diesel::result::Error> {
    let _ = (conn, msgs);
    Ok(())
}

fn main() {}
