//! Handlers stamped out by `macro_rules!`: literal, expression and type fragments arrive
//! in invisible groups.
#![deny(warnings)]

use diesel_async::AsyncPgConnection;
use diesel_inbox::{Outcome, idempotent};

macro_rules! handler {
    ($name:ident, $consumer:literal, $db:ty, $ret:ty) => {
        #[idempotent(consumer = $consumer, key = id)]
        async fn $name(db: $db, id: u64) -> $ret {
            let _ = db;
            Ok(id)
        }
    };
}

handler!(literal, "stamped-literal", &mut AsyncPgConnection, Result<u64, diesel::result::Error>);

macro_rules! expression_handler {
    ($name:ident, $consumer:expr, $primary:ident, $conn:expr, $id:ident, $key:expr) => {
        #[idempotent(consumer = $consumer, key = $key, conn = $conn)]
        async fn $name(
            $primary: &mut AsyncPgConnection,
            _replica: &mut AsyncPgConnection,
            $id: u64,
        ) -> Result<(), diesel::result::Error> {
            let _ = ($primary, $id);
            Ok(())
        }
    };
}

expression_handler!(expression, "stamped-expression", primary, primary, id, id);

async fn callers(pg: &mut AsyncPgConnection, other: &mut AsyncPgConnection) {
    let _: Result<Outcome<u64>, diesel::result::Error> = literal(pg, 1).await;
    let _: Result<Outcome<()>, diesel::result::Error> = expression(pg, other, 1).await;
}

fn main() {
    let _ = callers;
}
