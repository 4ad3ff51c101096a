//! The `#[idempotent]` attribute of [diesel-inbox](https://docs.rs/diesel-inbox).
//!
//! Use it through `diesel_inbox::idempotent`; it is documented there. The attribute only
//! checks and rewires the handler: the transaction itself is the runtime function
//! `diesel_inbox::__private::run`.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]

mod args;
mod expand;
mod validate;

use proc_macro::TokenStream;
use quote::ToTokens;

/// Makes an `async fn` message handler apply each (message, consumer) exactly once.
///
/// The handler's body runs in one database transaction together with the insert of a
/// marker row (`message_id`, `consumer`) into the inbox table. The handler, declared as
/// returning `Result<T, E>`, then returns `Result<diesel_inbox::Outcome<T>, E>`:
///
/// - `Ok(Outcome::Processed(value))`: the body's writes and the marker committed;
/// - `Ok(Outcome::Duplicate)`: this message was already processed by this consumer, and
///   the body did not run;
/// - `Err(e)`: nothing was committed; `diesel_inbox::classify` tells a transient error
///   from a permanent one.
///
/// # Arguments
///
/// - `consumer = "…"` (required): the handler's name in the inbox. A string literal of
///   ASCII letters, digits and `_ - . : /`, 1 to 200 bytes, used by no other handler of
///   the crate (checked by `cargo check`) or of the program (checked at start-up by
///   `diesel_inbox::check_consumers`).
/// - `key = <expr>` (required): identifies the message, for example `msg.message_id` or
///   `(msg.topic.as_str(), msg.partition, msg.offset)`. Evaluated before the body; its
///   type implements `diesel_inbox::InboxKey`.
/// - `conn = <parameter>`: the connection parameter. By default the parameter named
///   `conn`, else the only `&mut` parameter.
/// - `fast_path = <bool expression>`: whether to look for a committed marker before
///   opening a transaction, so that a redelivery costs one indexed read instead of a
///   transaction while a new message pays that read for nothing. Evaluated before the
///   body, so `fast_path = delivery.redelivered` reads only for deliveries the broker
///   flags as redelivered. By default the handler reads first while a quarter or more of
///   its recent deliveries were duplicates: never during a stream of new messages,
///   always during a replay. Correctness never depends on it.
///
/// # Examples
///
/// ```ignore
/// #[diesel_inbox::idempotent(consumer = "credit", key = msg.message_id)]
/// async fn credit(conn: &mut AsyncPgConnection, msg: &CreditRequested) -> Result<(), AppError> {
///     diesel::update(accounts::table.find(msg.account_id))
///         .set(accounts::balance.eq(accounts::balance + msg.amount))
///         .execute(conn)
///         .await?;
///     Ok(())
/// }
/// ```
///
/// # Expansion
///
/// The example above becomes, in effect:
///
/// ```ignore
/// async fn credit(
///     conn: &mut AsyncPgConnection,
///     msg: &CreditRequested,
/// ) -> Result<diesel_inbox::Outcome<()>, AppError> {
///     // Claims the consumer name: a second handler named "credit" fails with E0428.
///     #[macro_export]
///     macro_rules! __diesel_inbox_consumer_credit { () => {}; }
///
///     // Lists the handler for `diesel_inbox::check_consumers`, which finds consumer
///     // names shared across crates at start-up.
///     // Also holds the recent outcomes the adaptive fast path goes by.
///     static HANDLER: diesel_inbox::__private::Handler = diesel_inbox::__private::Handler::new(
///         diesel_inbox::RegisteredHandler::new("credit", "my_service::credit"),
///     );
///     diesel_inbox::__private::inventory::submit! { /* the same registration */ }
///
///     let message_id = diesel_inbox::__private::encode_key(&(msg.message_id));
///     diesel_inbox::__private::run(
///         conn,
///         &HANDLER,
///         message_id,
///         diesel_inbox::__private::FastPath::Adaptive,
///         // How the inbox's own database errors become the handler's error type.
///         <AppError as diesel_inbox::__private::HandlerError>::from_diesel,
///         // `conn` here is the transaction's connection, shadowing the parameter.
///         async move |conn| -> Result<(), AppError> {
///             diesel::update(accounts::table.find(msg.account_id))
///                 .set(accounts::balance.eq(accounts::balance + msg.amount))
///                 .execute(conn)
///                 .await?;
///             Ok(())
///         },
///     )
///     .await
/// }
/// ```
///
/// `run` refuses a connection already inside a transaction, takes the fast path if it
/// is on, then begins a transaction, inserts the marker (waiting for any transaction
/// that holds the same key), runs the body, checks that the database has not rolled the
/// transaction back underneath it, and commits.
///
/// # Errors
///
/// Compile errors, each placed on the offending tokens, for: an attribute on anything
/// but a function; a function that is not `async`, or is `const`, `unsafe`, `extern` or
/// variadic; a return type that is not `Result<T, E>`; a missing, duplicate or unknown
/// argument (with the closest valid name suggested); a consumer that is not a string
/// literal, is empty, longer than 200 bytes, outside the character set, or already used
/// by another handler of the crate; `conn` naming no parameter, or no connection
/// parameter found, or several `&mut` candidates; a key whose type does not implement
/// `InboxKey` (at the key); an error type without `From<diesel::result::Error>` (at the
/// error type in the signature); a method already rewritten by `#[async_trait]`, whose
/// boxed future the attribute cannot reach (use an inherent `async fn`, or a native
/// `async fn` in the trait). All argument and signature mistakes are reported in one
/// build, and the function is still emitted, so completion keeps working.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut function = match syn::parse::<syn::ItemFn>(item.clone()) {
        Ok(function) => function,
        Err(_) => {
            let error = syn::Error::new_spanned(
                proc_macro2::TokenStream::from(item.clone()),
                "`#[idempotent]` goes on an `async fn` handler",
            );
            let mut output = error.into_compile_error();
            output.extend(proc_macro2::TokenStream::from(item));
            return output.into();
        }
    };
    let handler =
        syn::parse::<args::Arguments>(args).and_then(|args| validate::validate(args, &function));
    match handler {
        Ok(handler) => expand::expand(handler, function).into(),
        // The function is kept so that completion still works on it, without the
        // qualifiers already reported, which would only add rustc's own errors.
        Err(error) => {
            function.sig.constness = None;
            function.sig.variadic = None;
            let mut output = error.into_compile_error();
            function.to_tokens(&mut output);
            output.into()
        }
    }
}
