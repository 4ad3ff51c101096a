//! How a handler's transaction begins with its markers: BEGIN, then the insert, as every
//! backend does by default; or, on a PostgreSQL connection whose type the handler
//! names, both in one round trip (`backend/postgres/pipeline.rs`).
//!
//! Pipelining needs the connection as `&AsyncPgConnection`, which code generic over the
//! connection cannot reach, and Rust has no specialisation to ask for it. The handler's
//! own code knows the type it was written with, so the attribute picks there, by autoref:
//! in `(&&&BeginProbe::of(&conn)).begin()` the most specific impl below that applies
//! wins. A handler generic over its connection begins as the backend does by default.

use std::marker::PhantomData;

use diesel::QueryResult;
use diesel_async::AsyncConnection;

use crate::backend::InboxBackend;
use crate::backend::sealed::{Marker, Sealed as _};

/// How [`begin_transaction`](crate::begin_transaction) and
/// [`begin_batch`](crate::begin_batch) begin the call's transaction: picked by
/// [`BeginProbe`].
pub struct Begin<C> {
    /// The connection that pipelines, reached from the handler's.
    #[cfg(feature = "postgres")]
    pipelined: Option<crate::backend::postgres::pipeline::Shared<C>>,
    connection: PhantomData<fn(&mut C)>,
}

impl<C> Begin<C> {
    /// BEGIN, then the insert.
    pub const fn in_sequence() -> Self {
        Self {
            #[cfg(feature = "postgres")]
            pipelined: None,
            connection: PhantomData,
        }
    }
}

impl<C> Begin<C>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    /// [`Sealed::begin_with_marker`](crate::backend::sealed::Sealed::begin_with_marker),
    /// pipelined where it can be.
    pub(crate) async fn with_marker(self, conn: &mut C, marker: &Marker) -> QueryResult<bool> {
        #[cfg(feature = "postgres")]
        if let Some(shared) = self.pipelined {
            return crate::backend::postgres::pipeline::begin_with_marker(conn, shared, marker)
                .await;
        }
        C::Backend::begin_with_marker(conn, marker).await
    }

    /// [`Sealed::begin_with_markers`](crate::backend::sealed::Sealed::begin_with_markers),
    /// pipelined where it can be.
    pub(crate) async fn with_markers(
        self,
        conn: &mut C,
        consumer: &'static str,
        message_ids: Vec<String>,
    ) -> QueryResult<Vec<bool>> {
        #[cfg(feature = "postgres")]
        if let Some(shared) = self.pipelined {
            return crate::backend::postgres::pipeline::begin_with_markers(
                conn,
                shared,
                consumer,
                message_ids,
            )
            .await;
        }
        C::Backend::begin_with_markers(conn, consumer, message_ids).await
    }
}

/// The handler's connection parameter, `P`, seen by type alone: the receiver of the
/// autoref that picks its [`Begin`].
pub struct BeginProbe<P>(PhantomData<P>);

impl<P> BeginProbe<P> {
    /// The probe for the parameter's type.
    pub const fn of(_connection: &P) -> Self {
        Self(PhantomData)
    }
}

/// A connection of a type that pipelines: `AsyncPgConnection`, or a pool's guard of one.
pub trait BeginPipelined<C> {
    /// BEGIN and the insert in one round trip.
    fn begin(&self) -> Begin<C>;
}

/// Any other connection.
pub trait BeginInSequence {
    /// BEGIN, then the insert.
    fn begin<C>(&self) -> Begin<C> {
        Begin::in_sequence()
    }
}

impl<P> BeginInSequence for BeginProbe<P> {}

#[cfg(feature = "postgres")]
mod pipelines {
    use std::ops::DerefMut;

    use diesel_async::AsyncPgConnection;

    use super::{Begin, BeginPipelined, BeginProbe, PhantomData};

    impl BeginPipelined<AsyncPgConnection> for &&BeginProbe<&mut AsyncPgConnection> {
        fn begin(&self) -> Begin<AsyncPgConnection> {
            Begin {
                pipelined: Some(|conn: &mut AsyncPgConnection| &*conn),
                connection: PhantomData,
            }
        }
    }

    /// deadpool's `Object`, bb8's `PooledConnection` and any other smart pointer.
    impl<T> BeginPipelined<T> for &BeginProbe<&mut T>
    where
        T: DerefMut<Target = AsyncPgConnection>,
    {
        fn begin(&self) -> Begin<T> {
            Begin {
                pipelined: Some(|conn: &mut T| &**conn),
                connection: PhantomData,
            }
        }
    }
}
