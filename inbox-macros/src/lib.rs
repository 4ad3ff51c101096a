//! The `#[idempotent]` attribute of [diesel-inbox](https://docs.rs/diesel-inbox).
//!
//! Use it through `diesel_inbox::idempotent`; it is documented there. The attribute only
//! checks and rewires the handler: the steps before and after its body, the transaction
//! itself, are the runtime's (`diesel_inbox::__private::begin_transaction` and its
//! kin).

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]

mod args;
mod diagnostics;
mod expand;
mod item;
mod manifest;
mod validate;

use proc_macro::TokenStream;
use quote::ToTokens;

/// Makes an `async fn` message handler apply each (message, consumer) exactly once.
///
/// The handler's body runs in one database transaction together with the insert of a
/// marker row (`message_id`, `consumer`) into the inbox table. The handler, declared as
/// returning `Result<T, E>` or an alias of it whose name ends in `Result` (such as
/// `diesel::QueryResult<T>` or `anyhow::Result<T>`), then returns
/// `Result<diesel_inbox::Outcome<T>, E>`:
///
/// - `Ok(Outcome::Processed(value))`: the body's writes and the marker committed;
/// - `Ok(Outcome::Duplicate)`: this message was already processed by this consumer, and
///   the body did not run;
/// - `Err(e)`: nothing was committed; `diesel_inbox::classify` tells a transient error
///   from a permanent one.
///
/// In claim mode (`claim`, below) the same variants mean the body ran and its claim was
/// completed, or an earlier delivery's was, and a third,
/// `Ok(Outcome::InProgress { lease_remaining })`, that another delivery holds a live
/// claim: redeliver later.
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
/// - `conn = <parameter>`: the connection parameter, a `&mut` borrow. By default the
///   parameter named `conn`, else the only `&mut` parameter but the batch (one under
///   `#[cfg]` counts only if every `&mut` parameter is under one). The body cannot name the lifetime of
///   its borrow (`&'c mut`): it runs on a shorter borrow, the transaction's.
/// - `fast_path = <bool expression>`: whether to look for a committed marker before
///   opening a transaction, so that a redelivery costs one indexed read instead of a
///   transaction while a new message pays that read for nothing. Evaluated after the key
///   and before the transaction, so it may use the connection
///   (`fast_path = is_redelivery(conn, id).await`), and `fast_path = delivery.redelivered`
///   reads only for deliveries the broker flags as redelivered. By default the handler
///   reads first while a quarter or more of its recent deliveries were duplicates: never
///   during a stream of new messages, always during a replay. Correctness never depends
///   on it.
/// - `fingerprint = <expr>`: the payload, as bytes or text (`AsRef<[u8]>`, taken by
///   reference), whose SHA-256 is stored with the marker. A later delivery with the same
///   key and another payload is an error, `diesel_inbox::FingerprintMismatch`, classified
///   `Permanent`: the producer reused a message id, and acknowledging that as a
///   duplicate would lose a message. A marker stored without a fingerprint matches any.
///   Evaluated before the transaction.
/// - `claim`: claim mode, for a body whose effect is outside the database (an e-mail,
///   a payment, an HTTP call): the marker commits as a claim with a lease before the
///   body runs, and is completed when it returns `Ok`. The body reads
///   `diesel_inbox::Claim::current()`. [The claim-mode guide](https://docs.rs/diesel-inbox/latest/diesel_inbox/guide/claim_mode/index.html)
///   explains the protocol and `Outcome::InProgress`.
/// - `lease = <expr>` (claim mode): a `std::time::Duration`, how long a claim holds before
///   another delivery may take it over, measured on the database's clock; by default
///   `diesel_inbox::claims::DEFAULT_LEASE`, five minutes. Make it longer than the body's
///   longest run, retries and timeouts included.
/// - `max_attempts = <integer>` (claim mode): after that many starts of the body, a
///   delivery is refused with `ClaimError::AttemptsExhausted`, classified `Permanent`,
///   and the claim waits in `diesel_inbox::claims::list_stale` for a person.
/// - `takeover = false` (claim mode): a claim whose lease ended, which may have made its
///   call, is never run again: deliveries get `ClaimError::Quarantined`, classified
///   `Permanent`, until a person settles it. A claim released by a failed body still
///   runs again.
/// - `batch = <parameter>`: the batch form. The parameter holds many messages (`&[M]`,
///   `Vec<M>`, `&Vec<M>`, `&mut [M]` or an array), and `key` is then a closure from one
///   message to its key, `key = |msg| msg.message_id` (the key is borrowed, as in the
///   single form), or a function's path, `key = Msg::key`. A closure may be `move`, type
///   its parameter, declare its return type or `return` early, as any closure; with a
///   declared return type or a `return`, its value is the key, as a function's is.
///   The body sees, under the parameter's name, a `Vec<&M>` of the messages new to this
///   consumer (a `mut` parameter gives a `mut` one), and the handler returns
///   `Result<diesel_inbox::BatchOutcome<T>, E>`. A batch taken by value as a `Vec<M>`,
///   an array or a `Box<[M]>` gives the body a `Vec<M>` of the new messages, moved out
///   of it, so that the handler's future is `Send` when `M` is, as a plain `async fn`'s
///   is (a `Vec<&M>` held across an `.await` needs `M: Sync`); the duplicates drop
///   before the body runs. The form goes by the type as written: a type alias of a
///   `Vec`, or another type by value, such as `Arc<[M]>`, is lent as `Vec<&M>`. When the
///   return type names the lifetime of a borrowed batch (`msgs: &'a [M]` returning
///   `Result<Vec<&'a str>, E>`), the body's `Vec<&'a M>` is borrowed for that lifetime,
///   so that its value may borrow from the messages.
///   `fast_path`, `claim` and `fingerprint` do not combine with `batch`. Expands to a
///   call of `diesel_inbox::__private::begin_batch` in place of `begin_transaction`.
///   [The batches guide](https://docs.rs/diesel-inbox/latest/diesel_inbox/guide/batches/index.html) says what runs when.
/// - `crate = <path>`: where the generated code finds diesel-inbox, by default
///   `::diesel_inbox`, or the name Cargo.toml gives a renamed dependency
///   (`inbox = { package = "diesel-inbox", … }` gives `::inbox`). For a crate that
///   re-exports diesel-inbox, write the path of the re-export, such as
///   `crate = my_facade::inbox`. serde's and tokio's string form, `crate = "::inbox"`,
///   is accepted too. Every path of the expansion goes through it. A `crate = ::name`
///   one or two letters off the dependency's name is reported once, at the name, with
///   the path to write.
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
/// The example above becomes, in effect (each `diesel_inbox` is the `crate = …` path):
///
/// ```ignore
/// async fn credit(
///     // The same name, with the expansion's hygiene: only the expansion reaches this
///     // binding, and the body's `conn` below shadows none of the user's (which
///     // `clippy::shadow_unrelated` would report). So does a batch parameter.
///     conn: &mut AsyncPgConnection,
///     // `mut` for the borrow in the body below. Parameters the body never names are
///     // left as they are, and so is the connection.
///     mut msg: &CreditRequested,
/// ) -> (Result<diesel_inbox::Outcome<()>, AppError>) {
///     // Claims the consumer name: a second handler named "credit" in the crate fails
///     // with E0428, "the name `diesel_inbox_consumer_used_twice__credit` is defined
///     // multiple times". Separators become `_`, listed after a last `_`:
///     // "kafka/orders:v1" claims `…used_twice__kafka_orders_v1_sc`. In a module of its
///     // own, which `non_local_definitions` does not look into, so that no `allow` is
///     // needed.
///     mod __inbox_consumer_claim {
///         #[macro_export]
///         macro_rules! diesel_inbox_consumer_used_twice__credit { () => {}; }
///     }
///
///     // Lists the handler for `diesel_inbox::check_consumers`, which finds consumer
///     // names shared across crates at start-up.
///     // Also holds the recent outcomes the adaptive fast path goes by.
///     static HANDLER: diesel_inbox::__private::Handler = diesel_inbox::__private::Handler::new(
///         // A method adds its place: "my_service::credit (method at src/lib.rs:12)".
///         diesel_inbox::RegisteredHandler::new("credit", "my_service::credit"),
///     );
///     // A constructor that adds `HANDLER` to the list before `main`, as `inventory`
///     // registers its items, without an `allow` of its own.
///     diesel_inbox::__private::register_handler!(HANDLER);
///     // How the transaction begins, picked by autoref on the connection parameter's
///     // type before the borrow below: `&mut AsyncPgConnection` (or a pool's guard of
///     // one) pipelines BEGIN with the marker insert, any other type (a generic `C`
///     // included) sends them in turn. Not in claim mode, whose body runs in no
///     // transaction.
///     let begin = {
///         use diesel_inbox::__private::{BeginInSequence as _, BeginPipelined as _};
///         (&&&diesel_inbox::__private::BeginProbe::of(&conn)).begin()
///     };
///
///     // How the inbox's own database errors become the handler's error type, and
///     // (picked by autoref, for a `std::error::Error`) how a database error the body
///     // raised is read back out of one for the span's `error.type`.
///     let error_type = diesel_inbox::__private::HandlerErrorType {
///         from_diesel: <AppError as diesel_inbox::__private::HandlerError>::from_diesel,
///         database_class: (&&DatabaseClassOf::<AppError>::new()).reader(),
///     };
///     // The key, the fast-path choice and the fingerprint are evaluated first, so all
///     // may use `conn`: one that names it is evaluated in a block that starts with
///     // `let conn = &mut *conn;`.
///     let message_id = diesel_inbox::InboxKey::encode(&(msg.message_id));
///     let mode = diesel_inbox::__private::FastPath::Adaptive;
///     // `fingerprint = payload`: `Some(diesel_inbox::__private::Fingerprint::of(&(payload)))`.
///     let fingerprint = None;
///     // Takes the `&mut` borrow. A parameter not written `&mut` is named by its type,
///     // `<Object<AsyncPgConnection> as ConnectionParameter<'_>>::borrow(conn)`, so that
///     // a connection taken by value is reported at that type.
///     let connection = diesel_inbox::__private::ConnectionParameter::borrow(conn);
///     // The step before the body: the marker inserted in a new transaction, or the
///     // delivery stopped as a duplicate or by a database error. Boxed and generic over
///     // the connection alone, so compiled once per connection type; its bounds on the
///     // connection are reported at the parameter. In claim mode, `claim_delivery`,
///     // without `begin`, with `mode` the claim's settings:
///     // `{ let lease: Duration = …; ClaimPolicy::new(Some(lease), Some(max), takeover) }`.
///     let mut steps = match diesel_inbox::__private::begin_transaction(
///         begin,
///         diesel_inbox::__private::ConnectionParameter::borrow(&mut *connection),
///         &HANDLER,
///         message_id,
///         mode,
///         fingerprint,
///     )
///     .await
///     {
///         Ok(steps) => steps,
///         Err(stopped) => return stopped.finish(&error_type),
///     };
///     // The body, an async block of the handler's own, run in the delivery's span and
///     // scope. Not `move`: the parameters stay the handler's. It is placed at the
///     // declared return type, where rustc's "this function returns a `Result`" then
///     // points.
///     let result = steps
///         .body(async {
///             // The transaction's connection, under the parameter's name; a `mut`
///             // written on the parameter moves here, to the binding the body can
///             // reassign. In claim mode it is the connection itself, outside any
///             // transaction, followed by `let _ = &conn;`: most claim bodies never use
///             // it.
///             let conn = &mut *connection;
///             // Never taken: makes rustc check the body against the declared return
///             // type, so that coercions such as `Ok(Box::new(x))` for a boxed trait
///             // object apply as in a plain `async fn`. An `impl Trait` in the return
///             // type is `_` here. For an alias such as `diesel::QueryResult<()>`, `T`
///             // and `E` here and in the signature are
///             // `<diesel::QueryResult<()> as diesel_inbox::__private::HandlerResult>::Ok`
///             // and `::Err`.
///             if false {
///                 return diesel_inbox::__private::fake_return::<Result<(), AppError>>();
///             }
///             // Borrows each parameter the body names, whole and mutably: the block
///             // then captures neither a copy of a field nor a shared reference. A
///             // `&mut` parameter is renamed apart in the signature, as `conn` is, and
///             // moved in instead: `let msg = msg;`.
///             let _ = &mut msg;
///             {
///                 diesel::update(accounts::table.find(msg.account_id))
///                     .set(accounts::balance.eq(accounts::balance + msg.amount))
///                     .execute(conn)
///                     .await?;
///                 Ok(())
///             }
///         })
///         .await;
///     // The step after the body, boxed like the first: COMMIT when the body returned
///     // `Ok`, ROLLBACK otherwise; then the handler's result, reported. One future,
///     // generic over the body's value and error alone, so one await.
///     steps.close(connection, result, error_type).await
/// }
/// ```
///
/// The rewritten return type runs over the declared one's tokens, and the body's braces
/// stand where the user's do, so that rustc's suggestions around them, such as
/// `async_fn_in_trait`'s `fn … -> impl Future<Output = …> + Send { async { … } }` for a
/// default method of a public trait with `Self: Sized`, read as for the plain
/// `async fn`. The parentheses, which rustc drops, stand at the attribute, and so does
/// the place after them where rustc suggests bounds: the trait default check below is
/// not answered with "consider `where Self: Sized`". The batch form binds
/// `batch_messages(&msgs)` (`owned_batch(msgs)` for a batch the body owns), placed at
/// the parameter in the signature, once, passes its keys to `begin_batch`, and binds
/// the body's `msgs` to `steps.select(…)`, the new messages.
///
/// `begin_transaction` refuses a connection already inside a transaction (but for a
/// test transaction, where it sets a savepoint instead), takes the fast path if it is
/// on, then begins a transaction and inserts the marker (waiting for any transaction
/// that holds the same key); `close` checks that the database has not rolled the
/// transaction back underneath the body, and commits.
///
/// The body sees its parameters as the plain function would: it can assign to them and
/// their fields, and move them. They stay the handler's, and drop when it returns, after
/// COMMIT or ROLLBACK: an ack handle or a lock guard passed in is released only once the
/// transaction is over. A parameter the body moves is the body's from there on; on a
/// path where the body does not move it after all, it drops when the body returns,
/// before COMMIT. A `&mut` borrow moves into the body, as into a plain `async fn`'s
/// future, so the body can return a borrow through it for its whole lifetime
/// (`msg: &'a mut Msg` to `Result<&'a mut u64, E>`). The handler's future is `Send`
/// when the plain function's would be;
/// only a name bound without `mut` inside a struct, slice or reference pattern is
/// captured as the body uses it, so one the body only reads must also be `Sync`.
///
/// A method, or a function whose signature names `Self`, also gets a check at the top
/// of its body that fails to compile in a trait's default method (see below), unless
/// it has a visibility (`pub`, `pub(crate)`, `pub(self)`), which a trait's method
/// cannot have: a method of an unsized type (in `impl dyn Trait`, or of a struct whose
/// last field is a slice) is told apart by it.
///
/// # Errors
///
/// Compile errors, each placed on the offending tokens, for: an attribute on anything
/// but a function, on a trait's method declaration (which has no body to run), or
/// applied twice, under any names (at the second; another crate's attribute that is
/// also named `idempotent` is left alone); a function that is not `async`, or is `const`,
/// `unsafe`, `extern` or variadic; a return type that is not `Result<T, E>` nor an alias
/// named `…Result`, or such an alias that is no `Result` (as rustc's "handlers return a
/// `Result`, not …") or has an `impl Trait` inside; a missing,
/// duplicate or unknown argument (with the closest valid name suggested); `claim` with a
/// value, or another argument without one; `lease`, `max_attempts` or `takeover`
/// without `claim`, and `fast_path` with it; a `max_attempts` that is not an integer
/// literal of at least 1, a `takeover` that is not `true` or `false`, a `lease` that is
/// not a `Duration` (at the lease); a `crate` that
/// is not a path, or that misspells the dependency's name (read from Cargo.toml); a consumer that is not a string literal, is empty, longer than 200
/// bytes, outside the character set, or already used by another handler of the crate
/// (E0428, naming `diesel_inbox_consumer_used_twice__<consumer>`); `batch` naming no
/// parameter, or a parameter that is no slice, `Vec` or array (at the parameter), a
/// batch `key` that is neither a one-parameter closure nor a path, or `fast_path` beside
/// `batch`; `conn` naming no parameter (with the parameter's name when only a leading
/// `_` differs, as for `batch`), or no connection parameter found, or several `&mut` candidates; a
/// connection taken by value (at its type, where rustc suggests the `&mut`, or at an
/// `impl Trait` taken by value); a body naming the connection's
/// lifetime; a key whose type does not implement `InboxKey` (at the key); an error type
/// without `From<diesel::result::Error>` (at the error type in the signature); a trait's
/// default method, whose consumer every implementor would share (at `self`, or else at
/// the method's name; recognised by its `?Sized` `Self`, so not in a trait that requires
/// `Self: Sized`, nor in a method that neither takes `self` nor names `Self` in its
/// signature), and so a method without a visibility of an unsized type; a method
/// already rewritten by `#[async_trait]`, whose boxed future the attribute cannot reach
/// (use an inherent `async fn`, or a native `async fn` in the trait). All argument and
/// signature mistakes are reported in one build, and the function is still emitted, so
/// completion keeps working, without "unused variable" warnings for parameters only the
/// arguments use.
///
/// The body is the body of an async block, so rustc says "async block" where it would
/// say "async function", as in "the `?` operator can only be used on `Result`s, not
/// `Option`s, in an async block that returns `Result`"; the error is at the `?`, names
/// the declared `Result<T, E>`, and "this function returns a `Result`" points at the
/// declared return type. (Only an `async fn` of its own would change the wording, and
/// the body could not reach the handler's parameters from one.)
///
/// # Lints
///
/// Neither the expansion nor a macro it calls writes an `allow`, so a crate's `forbid` of
/// any lint holds for handlers too: `#![forbid(warnings)]` and
/// `#![forbid(non_local_definitions)]` draw nothing from them, and
/// `#![forbid(unsafe_code)]` does not reach the registration's `link_section`, which is
/// the expansion's.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut function = match syn::parse::Parser::parse(item::parse_function, item.clone()) {
        Ok(function) => function,
        Err(_) => {
            let error = match syn::parse::<syn::TraitItemFn>(item.clone()) {
                // A declaration has no body to run in the transaction, and a default
                // body would give every implementor the same consumer.
                Ok(declaration) if declaration.default.is_none() => syn::Error::new_spanned(
                    &declaration.sig,
                    "`#[idempotent]` needs the handler's body: put it on each implementor's \
                     `async fn`, each with a consumer of its own, not on the trait's \
                     declaration",
                ),
                _ => syn::Error::new_spanned(
                    proc_macro2::TokenStream::from(item.clone()),
                    "`#[idempotent]` goes on an `async fn` handler",
                ),
            };
            let mut output = error.into_compile_error();
            output.extend(proc_macro2::TokenStream::from(item));
            return output.into();
        }
    };
    if let Some(error) = validate::already_rewritten(&function) {
        let mut output = error.into_compile_error();
        function.to_tokens(&mut output);
        return output.into();
    }
    let handler = match syn::parse::<args::Arguments>(args) {
        Ok(args) => validate::validate(args, &function),
        Err(error) => Err(validate::Rejected {
            error,
            uses: Vec::new(),
        }),
    };
    match handler {
        Ok(handler) => expand::expand(handler, function).into(),
        // The function is kept so that completion still works on it, without the
        // qualifiers already reported, which would only add rustc's own errors.
        Err(validate::Rejected { error, uses }) => {
            function.sig.constness = None;
            function.sig.variadic = None;
            if !uses.is_empty() {
                function
                    .block
                    .stmts
                    .insert(0, syn::parse_quote!(if false { let _ = (#(&(#uses),)*); }));
            }
            let mut output = error.into_compile_error();
            function.to_tokens(&mut output);
            output.into()
        }
    }
}
