use diesel_async::AsyncPgConnection;

struct Packet {
    id: u64,
    data: [u8],
}

impl Packet {
    #[diesel_inbox::idempotent(consumer = "packet", key = self.id)]
    async fn store(&self, conn: &mut AsyncPgConnection) -> Result<usize, diesel::result::Error> {
        let _ = conn;
        Ok(self.data.len())
    }
}

fn main() {}
