use diesel_async::AsyncPgConnection;

struct Msg {
    id: u64,
    raw: Vec<u8>,
}

#[diesel_inbox::idempotent(consumer = "c", batch = msgs, key = |msg| msg.id, fingerprint = &msgs[0].raw)]
async fn handle(conn: &mut AsyncPgConnection, msgs: &[Msg]) -> Result<(), diesel::result::Error> {
    let _ = (conn, msgs);
    Ok(())
}

fn main() {}
