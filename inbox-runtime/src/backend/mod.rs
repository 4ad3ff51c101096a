//! What each database needs done differently.
//!
//! The transaction in [`run`](crate::run) is the same everywhere; only the marker insert
//! (how a duplicate shows itself), error recognition and schema creation differ, and each
//! backend module holds its own.

/// The `sealed::Backend` methods whose statements are the same on several backends, for
/// each backend's impl to include by name.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
macro_rules! shared_statements {
    ($($statement:ident),+) => {
        $(shared_statements!(@ $statement);)+
    };
    // `INSERT … ON CONFLICT (message_id, consumer) DO NOTHING`: a duplicate waits for the
    // transaction holding the key, then inserts nothing, without raising an error.
    (@ insert_marker) => {
        fn insert_marker<'c, C>(
            conn: &'c mut C,
            marker: &$crate::backend::sealed::Marker,
        ) -> impl ::std::future::Future<Output = ::diesel::QueryResult<bool>> + Send + use<'c, C>
        where
            C: ::diesel_async::AsyncConnection<Backend = Self>,
        {
            use $crate::schema::inbox;

            let insert = $crate::backend::queries::plain_insert(marker.message_id.clone(), marker.consumer)
                .on_conflict((inbox::message_id, inbox::consumer))
                .do_nothing();
            async move { Ok(::diesel_async::RunQueryDsl::execute(insert, conn).await? == 1) }
        }
    };
    (@ already_processed) => {
        fn already_processed<'c, C>(
            conn: &'c mut C,
            marker: &$crate::backend::sealed::Marker,
        ) -> impl ::std::future::Future<Output = ::diesel::QueryResult<bool>> + Send + use<'c, C>
        where
            C: ::diesel_async::AsyncConnection<Backend = Self>,
        {
            $crate::backend::queries::shared::already_processed(conn, marker)
        }
    };
}

pub(crate) mod mysql;
pub(crate) mod pg;
pub(crate) mod sqlite;

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod queries;

/// A database backend that `#[idempotent]` handlers can run on.
///
/// Implemented for `Pg`, `Mysql` and `Sqlite` when the matching cargo feature is on. A
/// handler generic over its connection `C` needs the bound
/// `C::Backend: diesel_inbox::InboxBackend`.
#[diagnostic::on_unimplemented(
    message = "diesel-inbox does not support the backend `{Self}`",
    note = "enable the matching feature of diesel-inbox (`postgres`, `mysql` or `sqlite`), \
            or add the bound `C::Backend: diesel_inbox::InboxBackend` to a generic handler"
)]
pub trait InboxBackend: diesel::backend::Backend + sealed::Backend {}

impl<DB: diesel::backend::Backend + sealed::Backend> InboxBackend for DB {}

pub(crate) mod sealed {
    use std::future::Future;

    use diesel::QueryResult;
    use diesel_async::AsyncConnection;

    /// The (message, consumer) pair a call is about.
    ///
    /// Statements bind copies of it rather than borrowing it: a borrow held across an
    /// `.await` inside the transaction closure makes rustc unable to prove the handler's
    /// future `Send` for concrete connection types (rust-lang/rust#100013), and handlers
    /// must be spawnable.
    #[derive(Debug)]
    pub struct Marker {
        pub message_id: String,
        pub consumer: &'static str,
    }

    pub trait Backend: diesel::backend::Backend + Sized {
        /// Whether the marker row is already committed.
        fn already_processed<'c, C>(
            conn: &'c mut C,
            marker: &Marker,
        ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, Self, C>
        where
            C: AsyncConnection<Backend = Self>;

        /// Inserts the marker row; `Ok(false)` when the row was already there (committed
        /// by another transaction, which this call waited for).
        fn insert_marker<'c, C>(
            conn: &'c mut C,
            marker: &Marker,
        ) -> impl Future<Output = QueryResult<bool>> + Send + use<'c, Self, C>
        where
            C: AsyncConnection<Backend = Self>;

        /// Stamps `processed_at`; returns how many rows matched (1 unless the
        /// transaction was rolled back underneath the handler).
        fn mark_processed<'c, C>(
            conn: &'c mut C,
            marker: &Marker,
        ) -> impl Future<Output = QueryResult<usize>> + Send + use<'c, Self, C>
        where
            C: AsyncConnection<Backend = Self>;

        /// Creates the inbox table and its unique index where they are missing.
        fn migrate<C>(conn: &mut C) -> impl Future<Output = QueryResult<()>> + Send
        where
            C: AsyncConnection<Backend = Self>;
    }
}
