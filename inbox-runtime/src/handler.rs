//! An `#[idempotent]` handler as the runtime sees it: its registration, the traits its
//! signature is checked through, and its place in the program-wide list of handlers.

use diesel::result::Error;

use crate::fast_path::DuplicateShare;

/// One `#[idempotent]` handler, registered when the program is linked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegisteredHandler {
    /// The handler's consumer name.
    pub consumer: &'static str,
    /// The handler's path, such as `billing::credit`. A method's type is out of the
    /// attribute's sight, so a method also says where it is:
    /// `billing::credit (method at src/billing.rs:12)`.
    pub handler: &'static str,
}

impl RegisteredHandler {
    #[doc(hidden)]
    pub const fn new(consumer: &'static str, handler: &'static str) -> Self {
        Self { consumer, handler }
    }
}

/// One `#[idempotent]` handler as the modes see it: its registration, and the recent
/// outcomes its adaptive fast path goes by.
#[doc(hidden)]
#[derive(Debug)]
pub struct Handler {
    pub(crate) registration: RegisteredHandler,
    pub(crate) recent_duplicates: DuplicateShare,
}

impl Handler {
    #[doc(hidden)]
    pub const fn new(registration: RegisteredHandler) -> Self {
        Self {
            registration,
            recent_duplicates: DuplicateShare::new(),
        }
    }
}

/// A handler in the program-wide list that [`registered_handlers`] reads.
#[doc(hidden)]
#[derive(Debug)]
pub struct Registration(&'static Handler);

impl Registration {
    #[doc(hidden)]
    pub const fn new(handler: &'static Handler) -> Self {
        Self(handler)
    }
}

inventory::collect!(Registration);

/// Lists a `Handler` static in [`registered_handlers`], before `main`, through
/// `inventory`. Its expansion carries `#[allow(non_upper_case_globals)]`, which a crate
/// under `#![forbid(warnings)]` reports as the future-incompatibility warning
/// `forbidden_lint_groups` (an error only under `#![forbid(future_incompatible)]`).
#[doc(hidden)]
#[macro_export]
macro_rules! register_handler {
    ($handler:ident) => {
        $crate::inventory::submit!($crate::Registration::new(&$handler));
    };
}

/// Every `#[idempotent]` handler in the program, in no particular order.
pub fn registered_handlers() -> impl Iterator<Item = &'static RegisteredHandler> {
    inventory::iter::<Registration>
        .into_iter()
        .map(|registration| &registration.0.registration)
}

/// The error type of an `#[idempotent]` handler: one that database errors convert into.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the error type of an `#[idempotent]` handler",
    label = "this error type has no `From<diesel::result::Error>`",
    note = "the inbox's own database errors are returned through it: implement \
            `From<diesel::result::Error>` for `{Self}` (with thiserror, a `#[from]` variant)"
)]
pub trait HandlerError: Sized {
    /// Wraps a database error.
    fn from_diesel(error: Error) -> Self;
}

impl<E: From<Error>> HandlerError for E {
    fn from_diesel(error: Error) -> Self {
        Self::from(error)
    }
}

/// Never called: the `#[idempotent]` expansion writes `if false { return
/// fake_return::<R>(); }` at the top of the body's block, so that rustc checks the
/// body against the handler's declared return type `R` and coerces inside it
/// (`Ok(Box::new(x))` for `Result<Box<dyn Trait>, E>`), as it does for a plain
/// `async fn`. A call returning `R`, unlike a diverging `loop {}`, adds no unreachable
/// code to warn about.
#[doc(hidden)]
pub fn fake_return<R>() -> R {
    unreachable!("`fake_return` is only named in a branch that never runs")
}

/// The connection parameter of an `#[idempotent]` handler, as its steps take it: a
/// `&mut` borrow. Through this trait, rather than the steps' own `&mut C`, a connection
/// taken by value is reported at the handler's parameter with what to write instead.
#[diagnostic::on_unimplemented(
    message = "the connection parameter of an `#[idempotent]` handler must be a `&mut` \
               borrow, not `{Self}`",
    label = "taken by value",
    note = "the transaction runs on a borrow of the connection, which the caller keeps: \
            take `conn: &mut {Self}` and pass `&mut conn`"
)]
pub trait ConnectionParameter<'c> {
    /// The connection the transaction runs on.
    type Connection: ?Sized;

    /// The borrow the steps take.
    fn borrow(self) -> &'c mut Self::Connection;
}

impl<'c, C: ?Sized> ConnectionParameter<'c> for &'c mut C {
    type Connection = C;

    fn borrow(self) -> &'c mut C {
        self
    }
}

/// The return type of an `#[idempotent]` handler, as written: `Result<T, E>` or an alias
/// of it, such as `diesel::QueryResult<T>` or `anyhow::Result<T>`. The attribute reads
/// `T` and `E` of an alias through this trait, since it sees only the alias's tokens.
#[diagnostic::on_unimplemented(
    message = "`#[idempotent]` handlers return a `Result`, not `{Self}`",
    label = "not a `Result`",
    note = "the handler returns `Result<Outcome<T>, E>` for a declared `Result<T, E>`, with \
            `E: From<diesel::result::Error>`"
)]
pub trait HandlerResult {
    /// `T` of `Result<T, E>`.
    type Ok;
    /// `E` of `Result<T, E>`.
    type Err;
}

impl<T, E> HandlerResult for Result<T, E> {
    type Ok = T;
    type Err = E;
}
