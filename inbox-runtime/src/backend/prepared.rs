//! Statements written as SQL text, prepared once per connection.
//!
//! diesel never caches a `sql_query`: its text could be built from anything, so every
//! execution prepares it again, a round trip of its own on PostgreSQL and MySQL and a
//! parse on every backend. The inbox's own statements have fixed texts (constants, or
//! constants put together), so [`Prepared`] lets the connection's statement cache keep
//! them, keyed by their text and bind types.

use diesel::QueryResult;
use diesel::backend::Backend;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};

/// A statement of a fixed text, cached by the connection once prepared. Only for
/// statements whose text is one of a few, never built from a caller's value: each text
/// stays prepared for the connection's life.
pub(crate) struct Prepared<Q>(pub(crate) Q);

impl<Q> QueryId for Prepared<Q> {
    type QueryId = ();
    // Keyed by text in the statement cache.
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<Q: Query> Query for Prepared<Q> {
    type SqlType = Q::SqlType;
}

impl<Q, DB> QueryFragment<DB> for Prepared<Q>
where
    Q: QueryFragment<DB>,
    DB: Backend,
{
    fn walk_ast<'b>(&'b self, pass: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.0.walk_ast(pass)
    }

    fn is_safe_to_cache_prepared(&self, _backend: &DB) -> QueryResult<bool> {
        Ok(true)
    }
}
