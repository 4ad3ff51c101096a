//! Methods of unsized types, told from a trait's default method by their visibility:
//! in `impl dyn Trait`, and on a struct whose last field is a slice.
#![deny(warnings)]

use diesel::result::Error;
use diesel_async::AsyncPgConnection;
use diesel_inbox::idempotent;

trait Service {
    fn name(&self) -> &str;
}

impl dyn Service {
    #[idempotent(consumer = "dyn_service", key = id)]
    pub async fn handle(&self, conn: &mut AsyncPgConnection, id: u64) -> Result<String, Error> {
        let _ = conn;
        Ok(format!("{}: {id}", self.name()))
    }
}

impl dyn Service + Send {
    #[idempotent(consumer = "dyn_send_service", key = id)]
    pub(crate) async fn handle_sent(
        &self,
        conn: &mut AsyncPgConnection,
        id: u64,
    ) -> Result<usize, Error> {
        let _ = conn;
        Ok(self.name().len())
    }
}

struct Packet {
    id: u64,
    data: [u8],
}

impl Packet {
    #[idempotent(consumer = "packet", key = self.id)]
    pub(self) async fn store(&self, conn: &mut AsyncPgConnection) -> Result<usize, Error> {
        let _ = conn;
        Ok(self.data.len())
    }

    #[idempotent(consumer = "packet_mut", key = self.id)]
    pub(crate) async fn clear(&mut self, conn: &mut AsyncPgConnection) -> Result<(), Error> {
        let _ = conn;
        self.data.fill(0);
        Ok(())
    }
}

fn main() {
    let _ = (
        <dyn Service>::handle,
        <dyn Service + Send>::handle_sent,
        Packet::store,
        Packet::clear,
    );
}
