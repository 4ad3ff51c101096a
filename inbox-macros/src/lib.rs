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
///     // `mut` for the borrow in the body below. Parameters the body never names are
///     // left as they are, and so is the connection.
///     mut msg: &CreditRequested,
/// ) -> Result<diesel_inbox::Outcome<()>, AppError> {
///     // Claims the consumer name: a second handler named "credit" in the crate fails
///     // with E0428, "the name `diesel_inbox_consumer_used_twice__credit` is defined
///     // multiple times". Separators become `_`, listed after a last `_`:
///     // "kafka/orders:v1" claims `…used_twice__kafka_orders_v1_sc`.
///     #[macro_export]
///     macro_rules! diesel_inbox_consumer_used_twice__credit { () => {}; }
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
///         // Not `move`: the parameters stay the handler's. `conn` here is the
///         // transaction's connection, shadowing the parameter.
///         async |conn| -> Result<(), AppError> {
///             // Borrows each parameter the body names, whole and mutably: the closure
///             // then captures neither a copy of a field nor a shared reference.
///             let _ = &mut msg;
///             {
///                 diesel::update(accounts::table.find(msg.account_id))
///                     .set(accounts::balance.eq(accounts::balance + msg.amount))
///                     .execute(conn)
///                     .await?;
///                 Ok(())
///             }
///         },
///     )
///     .await
/// }
/// ```
///
/// `run` refuses a connection already inside a transaction (but for a test transaction,
/// where it sets a savepoint instead), takes the fast path if it is on, then begins a
/// transaction, inserts the marker (waiting for any transaction
/// that holds the same key), runs the body, checks that the database has not rolled the
/// transaction back underneath it, and commits.
///
/// The body sees its parameters as the plain function would: it can assign to them and
/// their fields, and move them. They stay the handler's, and drop when it returns, after
/// COMMIT or ROLLBACK: an ack handle or a lock guard passed in is released only once the
/// transaction is over. A parameter the body moves is the body's from there on; on a
/// path where the body does not move it after all, it drops when the body returns,
/// before COMMIT. The handler's future is `Send` when the plain function's would be;
/// only a name bound without `mut` inside a struct, slice or reference pattern is
/// captured as the body uses it, so one the body only reads must also be `Sync`.
///
/// A method, or a function whose signature names `Self`, also gets a check at the top
/// of its body that fails to compile in a trait's default method (see below).
///
/// # Errors
///
/// Compile errors, each placed on the offending tokens, for: an attribute on anything
/// but a function, or applied twice (at the second); a function that is not `async`, or
/// is `const`, `unsafe`, `extern` or variadic; a return type that is not `Result<T, E>`;
/// a missing, duplicate or unknown argument (with the closest valid name suggested); a
/// consumer that is not a string literal, is empty, longer than 200 bytes, outside the
/// character set, or already used by another handler of the crate (E0428, naming
/// `diesel_inbox_consumer_used_twice__<consumer>`); `conn` naming no parameter, or no
/// connection parameter found, or several `&mut` candidates; a key whose type does not
/// implement `InboxKey` (at the key); an error type without
/// `From<diesel::result::Error>` (at the error type in the signature); a trait's default
/// method, whose consumer every implementor would share (at the consumer; recognised by
/// its `?Sized` `Self`, so not in a trait that requires `Self: Sized`, nor in a method
/// that neither takes `self` nor names `Self` in its signature); a method already
/// rewritten by `#[async_trait]`, whose boxed future the attribute cannot reach (use an
/// inherent `async fn`, or a native `async fn` in the trait). All argument and signature
/// mistakes are reported in one build, and the function is still emitted, so completion
/// keeps working.
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
    // Reported, and removed so that the handler is rewritten once: a second rewrite
    // would nest its transaction inside the first one's and register a second consumer.
    let repeated = validate::repeated_attribute(&mut function.attrs);
    let handler =
        syn::parse::<args::Arguments>(args).and_then(|args| validate::validate(args, &function));
    match (handler, repeated) {
        (Ok(handler), None) => expand::expand(handler, function).into(),
        (Ok(handler), Some(error)) => {
            let mut output = error.into_compile_error();
            output.extend(expand::expand(handler, function));
            output.into()
        }
        // The function is kept so that completion still works on it, without the
        // qualifiers already reported, which would only add rustc's own errors.
        (Err(mut error), repeated) => {
            if let Some(repeated) = repeated {
                error.combine(repeated);
            }
            function.sig.constness = None;
            function.sig.variadic = None;
            let mut output = error.into_compile_error();
            function.to_tokens(&mut output);
            output.into()
        }
    }
}
