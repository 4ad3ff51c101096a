use std::rc::Rc;

use diesel_async::AsyncPgConnection;

#[diesel_inbox::idempotent(consumer = "c", key = id)]
async fn handle(conn: &mut AsyncPgConnection, id: u64) -> Result<(), diesel::result::Error> {
    let shared = Rc::new(id);
    let _ = &mut *conn;
    std::future::ready(()).await;
    let _ = shared;
    Ok(())
}

fn spawn(mut conn: AsyncPgConnection) {
    tokio::spawn(async move { handle(&mut conn, 1).await });
}

fn main() {
    let _ = spawn;
}
