use diesel_async::AsyncPgConnection;

struct Msg {
    id: u64,
}

// rustc's advice for an unused batch is `_msgs`; `batch` must then follow it.
#[diesel_inbox::idempotent(consumer = "c", batch = msgs, key = |msg| msg.id)]
async fn handle(conn: &mut AsyncPgConnection, _msgs: &[Msg]) -> Result<(), diesel::result::Error> {
    let _ = conn;
    Ok(())
}

fn main() {}
