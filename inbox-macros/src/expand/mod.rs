//! Writing the handler: the body moves into an async block of the handler's own, which
//! the handler awaits between the runtime's steps that begin and end the delivery,
//! while the parameters stay the handler's.

use std::collections::HashSet;

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::token::Brace;
use syn::visit_mut::{self, VisitMut};
use syn::{
    FnArg, Ident, ItemFn, LitStr, Pat, ReturnType, Signature, Token, Type, Visibility, parse_quote,
    parse_quote_spanned,
};

use crate::diagnostics::{REWRITTEN_MARK, at, ungroup};
use crate::item::verbatim_block;
use crate::validate::{ClaimSettings, Handler};

mod batch;

pub(crate) fn expand(handler: Handler, mut function: ItemFn) -> TokenStream {
    let Handler {
        consumer,
        key,
        conn,
        fast_path,
        claim,
        fingerprint,
        ok,
        err,
        krate,
        batch,
    } = handler;
    let ReturnType::Type(_, result) = &function.sig.output else {
        unreachable!("validation accepted only a return type")
    };
    let result_span = result.span();
    let result_ends = first_and_last_span(result);
    let messages = batch.as_ref().map(|batch| &batch.messages);
    let (borrows, moved) = borrow_parameters(&mut function.sig, &conn, messages, &function.block);
    let conn_mut = take_mut(&mut function.sig, &conn);
    let messages_mut = messages.and_then(|messages| take_mut(&mut function.sig, messages));
    let body = &function.block;
    // `Result<T, E>` whatever the handler's spelling: the close step requires a `Result`,
    // and an alias that is none is then reported once, at the return type.
    let body_result =
        body_result(&parse_quote_spanned!(result_span=> ::core::result::Result<#ok, #err>));
    let fake_return = fake_return(&at(&krate, result_span), &body_result);
    // A claim-mode body runs outside the transaction it is named for, and most make
    // their external call without touching the connection.
    // Named rather than `allow(unused_variables)`, which `forbid(warnings)` would
    // reject.
    let unused_connection = claim.is_some().then(|| quote!(let _ = &#conn;));
    // The steps' binding of the connection: the parameter itself, renamed apart, when it
    // is a `&mut` borrow, else a borrow taken of it.
    let connection = Hidden::of(&conn);
    let borrow = connection_borrow(&krate, &connection, connection_type(&function.sig, &conn));
    let connection_value = match &borrow {
        None => connection.hidden.clone(),
        Some(_) => format_ident!("__inbox_connection", span = Span::mixed_site()),
    };
    let borrow = borrow.map(|borrow| quote!(let #connection_value = #borrow;));
    let new_messages = format_ident!("__inbox_new_messages", span = Span::mixed_site());
    let messages = batch::body_binding(batch.as_ref(), messages_mut, &new_messages);
    // Not `move`: the parameters stay in the handler's frame, so the body's writes land
    // in them and they drop when the handler returns, after COMMIT or ROLLBACK, as in a
    // plain `async fn`. The body's connection binding reuses the parameter's name, so the
    // body can only reach the transaction's connection.
    // Spanned at the declared return type: rustc's "this function returns a `Result`",
    // beside an error in the body such as `?` on an `Option`, then points there.
    let body_future = quote_spanned!(result_span=>
        async {
            let #conn_mut #conn = &mut *#connection_value;
            #messages
            #fake_return #unused_connection #(#borrows)* #body
        }
    );
    let message_id = format_ident!("__inbox_message_id", span = Span::mixed_site());
    // Evaluated before the transaction, and spanned at the key so that a key without
    // `InboxKey` is reported there, as a bound of the public trait itself.
    let encode = {
        let krate = at(&krate, key.span());
        quote_spanned!(key.span()=> #krate::InboxKey::encode(&(#key)))
    };
    // The conversion is spanned at the error type, so that an error type without it is
    // reported at the handler's signature. The database-class reader is picked by autoref
    // (a `std::error::Error` has its chain searched) and spanned at the attribute, so
    // that lints about the `&&` do not reach the user's code.
    let error_type = {
        let at_err = at(&krate, err.span());
        let from_diesel =
            quote_spanned!(err.span()=> <#err as #at_err::__private::HandlerError>::from_diesel);
        quote!(#krate::__private::HandlerErrorType {
            from_diesel: #from_diesel,
            database_class: {
                use #krate::__private::{OpaqueError as _, ReadsErrorChain as _};
                (&&#krate::__private::DatabaseClassOf::<#err>::new()).reader()
            },
        })
    };
    // Evaluated before the transaction, like the key, and before the steps borrow the
    // connection, so that it can use the connection too. In claim mode the same place
    // holds the claim's settings.
    let mode_value = format_ident!("__inbox_mode", span = Span::mixed_site());
    let claim_mode = claim.is_some();
    let mode = match &claim {
        None => match fast_path {
            None => quote!(#krate::__private::FastPath::Adaptive),
            Some(when) => {
                let krate = at(&krate, when.span());
                quote_spanned!(when.span()=> #krate::__private::FastPath::when(#when))
            }
        },
        Some(settings) => claim_policy(&krate, settings),
    };
    // Taken before the transaction from a borrow of the payload, so that the payload
    // stays the handler's.
    let fingerprint_value = format_ident!("__inbox_fingerprint", span = Span::mixed_site());
    let fingerprint = match fingerprint {
        None => quote!(::core::option::Option::None),
        Some(payload) => {
            let krate = at(&krate, payload.span());
            quote_spanned!(payload.span()=>
                ::core::option::Option::Some(#krate::__private::Fingerprint::of(&(#payload)))
            )
        }
    };
    let claim = consumer_claim(&consumer);
    let method = has_self(&function.sig);
    // A trait's method has no visibility: one that has is an `impl`'s, whatever its
    // `Self`, such as `impl dyn Trait` or a struct ending in a slice, which are unsized.
    let in_impl = !matches!(function.vis, Visibility::Inherited);
    let not_in_trait_default = (method && !in_impl).then(|| not_in_trait_default(&function.sig));
    let handler = function.sig.ident.to_string();
    // A method's type is out of the attribute's sight (and `Self` out of a static's), so
    // its place tells it from a namesake on another type of the module.
    let place = method.then(|| {
        let line = quote_spanned!(function.sig.ident.span()=> ::core::line!());
        quote!(" (method at ", ::core::file!(), ":", #line, ")")
    });
    let registration = format_ident!("__INBOX_HANDLER", span = Span::mixed_site());
    let registered = quote!(#krate::RegisteredHandler::new(
        #consumer,
        ::core::concat!(::core::module_path!(), "::", #handler, #place),
    ));
    // Spanned at the connection parameter: what the steps require of the connection (an
    // async connection, a supported backend) is reported there.
    connection.rename_in(&mut function.sig);
    let begin = begin(&krate, &connection_value);
    let renamed = Renamed { connection, moved };
    let (encode, mode, fingerprint) = (
        renamed.reach(encode),
        renamed.reach(mode),
        renamed.reach(fingerprint),
    );
    let steps = format_ident!("__inbox_steps", span = Span::mixed_site());
    let error_type_value = format_ident!("__inbox_error_type", span = Span::mixed_site());
    let (prepare, begin_call, select) = if let Some(batch) = &batch {
        Hidden::of(&batch.messages).rename_in(&mut function.sig);
        let batch::Begin {
            prepare,
            call,
            select,
        } = batch::begin(
            batch,
            &krate,
            &renamed,
            &connection_value,
            &begin,
            &registration,
            &new_messages,
            &steps,
        );
        (prepare, call, Some(select))
    } else {
        let prepare = quote! {
            let #message_id = #encode;
            let #mode_value = #mode;
            let #fingerprint_value = #fingerprint;
        };
        let connection = connection_argument(&krate, &conn, &connection_value);
        let krate = at(&krate, conn.span());
        let call = if claim_mode {
            quote_spanned!(conn.span()=>
                #krate::__private::claim_delivery(
                    #connection,
                    &#registration,
                    #message_id,
                    #mode_value,
                    #fingerprint_value,
                )
            )
        } else {
            quote_spanned!(conn.span()=>
                #krate::__private::begin_transaction(
                    #begin,
                    #connection,
                    &#registration,
                    #message_id,
                    #mode_value,
                    #fingerprint_value,
                )
            )
        };
        (prepare, call, None)
    };
    let result_value = format_ident!("__inbox_result", span = Span::mixed_site());
    let run = quote! {
        let #error_type_value = #error_type;
        #prepare
        #borrow
        let mut #steps = match #begin_call.await {
            ::core::result::Result::Ok(steps) => steps,
            ::core::result::Result::Err(stopped) => return stopped.finish(&#error_type_value),
        };
        #select
        let #result_value = #steps.body(#body_future).await;
        #steps.close(#connection_value, #result_value, #error_type_value).await
    };
    let braces = function.block.brace_token.span.join();
    let statements = quote! {
        #claim
        #not_in_trait_default
        // The steps read the consumer through this static's address: calling the handler
        // then links the object holding its registration, even when a generic handler
        // is instantiated in another crate.
        static #registration: #krate::__private::Handler =
            #krate::__private::Handler::new(#registered);
        #krate::__private::register_handler!(#registration);
        #run
    };
    // The body's braces stand where the user's do, so that a suggestion that wraps the
    // body (`async_fn_in_trait`'s `async { … }`) wraps the user's. Their syntax context
    // stays the expansion's: a function from the user's tokens to the user's would pass
    // with clippy for hand-written code, linted at the attribute (pedantic
    // `missing_errors_doc`), where it leaves a macro's output alone.
    let braces = Brace(Span::call_site().located_at(braces));
    *function.block = verbatim_block(braces, statements);
    let outcome = match batch {
        None => quote!(#krate::Outcome<#ok>),
        Some(_) => quote!(#krate::BatchOutcome<#ok>),
    };
    function.sig.output = rewritten_return(result_ends, &outcome, &err);
    quote!(#function)
}

/// A parameter the body sees under its own name through a binding of the body's block
/// (the connection, the batch, a `&mut` borrow moved in): in the signature it is
/// renamed apart, with the expansion's hygiene, at its own place. The block's binding
/// then shadows none of the user's, which `clippy::shadow_unrelated` would report, and
/// rustdoc still shows the name as written.
#[derive(Clone)]
pub(crate) struct Hidden {
    /// The name as written, which the user's expressions use; placed where the
    /// parameter is.
    pub(crate) visible: Ident,
    /// The signature's binding, which only the expansion can name.
    pub(crate) hidden: Ident,
}

impl Hidden {
    pub(crate) fn of(parameter: &Ident) -> Self {
        let mut hidden = parameter.clone();
        hidden.set_span(Span::mixed_site().located_at(parameter.span()));
        Self {
            visible: parameter.clone(),
            hidden,
        }
    }

    /// Renames the parameter apart in the signature (each, if `#[cfg]` gives several).
    fn rename_in(&self, sig: &mut Signature) {
        for input in &mut sig.inputs {
            if let FnArg::Typed(typed) = input {
                match typed.pat.as_mut() {
                    Pat::Ident(pat) if pat.ident == self.visible => pat.ident = self.hidden.clone(),
                    _ => {}
                }
            }
        }
    }

    /// `expression`, evaluated where the signature's binding is visible under its name
    /// as written, if it mentions that name: `key`, `fast_path` and `fingerprint` may
    /// use the connection. In a block of its own, so that the binding it makes does not
    /// shadow the signature's. The binding is a `&mut` borrow, reborrowed here.
    /// `names` are the ones the expression as written mentions.
    fn reach(&self, expression: TokenStream, names: &HashSet<String>) -> TokenStream {
        if !names.contains(&self.visible.to_string()) {
            return expression;
        }
        let Self { visible, hidden } = self;
        quote!({
            let #visible = &mut *#hidden;
            #expression
        })
    }
}

/// The parameters renamed apart that expressions evaluated before the body (`key`,
/// `fast_path`, `fingerprint`, `lease`) may name: the connection, and the `&mut`
/// borrows the body takes.
pub(crate) struct Renamed {
    pub(crate) connection: Hidden,
    moved: Vec<Hidden>,
}

impl Renamed {
    /// These parameters, the connection reached through `binding`, the steps' binding
    /// of it, which takes the signature's.
    pub(crate) fn through(&self, binding: &Ident) -> Self {
        Self {
            connection: Hidden {
                visible: self.connection.visible.clone(),
                hidden: binding.clone(),
            },
            moved: self.moved.clone(),
        }
    }

    /// `expression`, where each of these parameters it names is visible under its name
    /// as written.
    pub(crate) fn reach(&self, expression: TokenStream) -> TokenStream {
        let names = mentioned_names(expression.clone());
        self.moved
            .iter()
            .chain([&self.connection])
            .fold(expression, |expression, parameter| {
                parameter.reach(expression, &names)
            })
    }
}

/// The connection as the first argument of a step that puts bounds on it: a reborrow of
/// the expansion's binding, spanned at the parameter. rustc reports an unmet bound at the
/// argument it blames, and at the attribute instead when the argument's tokens are not
/// all in the call's hygiene, as a bare binding of the expansion's is not.
pub(crate) fn connection_argument(krate: &syn::Path, conn: &Ident, binding: &Ident) -> TokenStream {
    let krate = at(krate, conn.span());
    quote_spanned!(conn.span()=>
        #krate::__private::ConnectionParameter::borrow(&mut *#binding)
    )
}

/// `-> (Result<Outcome<T>, E>)`: the parentheses at the expansion's place, the type
/// inside them from the declared type's first token to its last. rustc drops the
/// parentheses, and a suggestion around the return type, such as
/// `async_fn_in_trait`'s `impl Future<Output = …> + Send`, then wraps the declared type.
/// A `where` clause would follow the parentheses: were it at the user's tokens, rustc
/// would answer the trait default check below with "consider `where Self: Sized`",
/// which defeats it; at the expansion's place it suggests no bound.
fn rewritten_return((first, last): (Span, Span), outcome: &TokenStream, err: &Type) -> ReturnType {
    let result = respanned(quote!(::core::result::Result), first);
    let close = quote_spanned!(last=> >);
    parse_quote!(-> (#result<#outcome, #err #close))
}

/// `ClaimPolicy::new(lease, max_attempts, takeover)`, the lease bound as a `Duration` at
/// its expression, so that one of another type is reported there as such.
fn claim_policy(krate: &syn::Path, settings: &ClaimSettings) -> TokenStream {
    let lease = match &settings.lease {
        None => quote!(::core::option::Option::None),
        Some(lease) => {
            let bound = format_ident!("__inbox_lease", span = Span::mixed_site());
            // The type at the lease, but with the expansion's hygiene: with the lease's,
            // `clippy::absolute_paths` would take the expansion's path for the user's.
            let duration = quote_spanned!(
                Span::call_site().located_at(lease.span())=> ::core::time::Duration
            );
            let binding = quote_spanned!(lease.span()=>
                let #bound: #duration = #lease;
            );
            quote!({ #binding ::core::option::Option::Some(#bound) })
        }
    };
    let max_attempts = match &settings.max_attempts {
        None => quote!(::core::option::Option::None),
        Some(max) => quote!(::core::option::Option::Some(#max)),
    };
    let takeover = settings.takeover;
    quote!(#krate::__private::ClaimPolicy::new(#lease, #max_attempts, #takeover))
}

/// The type of the connection parameter, as written.
fn connection_type<'a>(sig: &'a Signature, conn: &Ident) -> Option<&'a Type> {
    sig.inputs.iter().find_map(|input| match input {
        FnArg::Typed(typed) => match typed.pat.as_ref() {
            Pat::Ident(pat) if pat.ident == *conn => Some(typed.ty.as_ref()),
            _ => None,
        },
        FnArg::Receiver(_) => None,
    })
}

/// How the first step begins the transaction, picked by autoref on the type of the
/// steps' binding of the connection, the parameter's own: a PostgreSQL connection named
/// as such pipelines BEGIN with the marker insert. The step's first argument, evaluated
/// before the steps borrow the connection, and spanned in the expansion, where no lint
/// about the `&&&` reaches the user's code.
fn begin(krate: &syn::Path, connection: &Ident) -> TokenStream {
    quote!({
        use #krate::__private::{BeginInSequence as _, BeginPipelined as _};
        (&&&#krate::__private::BeginProbe::of(&#connection)).begin()
    })
}

/// The `&mut` borrow the steps take of a parameter not written as `&mut` (one that is
/// needs none). Named by its type, spanned there: a connection taken by value is then
/// reported at that type, where rustc's "consider mutably borrowing" suggestion puts the
/// `&mut` the signature needs (passed as an argument, it would be reported at the
/// binding, with `mut &mut conn`).
fn connection_borrow(
    krate: &syn::Path,
    connection: &Hidden,
    ty: Option<&Type>,
) -> Option<TokenStream> {
    let hidden = &connection.hidden;
    match ty.map(ungroup) {
        Some(Type::Reference(reference)) if reference.mutability.is_some() => None,
        Some(ty) => {
            // Every token at one place, so that the bound's two checks (the path's and
            // the call's) report one error there, not two of different extents.
            let span = ty.span();
            let ty = respanned(quote!(#ty), span);
            let krate = at(krate, span);
            Some(quote_spanned!(span=>
                <#ty as #krate::__private::ConnectionParameter<'_>>::borrow(#hidden)
            ))
        }
        None => unreachable!("validation found the connection parameter"),
    }
}

/// The spans of the first and the last token of `ty`, which rustc's span of the type
/// runs between (`Spanned::span` gives only the first's on stable).
fn first_and_last_span(ty: &Type) -> (Span, Span) {
    let mut spans = quote!(#ty).into_iter().map(|token| token.span());
    let first = spans.next().unwrap_or_else(Span::call_site);
    (first, spans.last().unwrap_or(first))
}

/// `tokens`, each of them, in groups too, placed at `span`.
fn respanned(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|token| match token {
            TokenTree::Group(group) => {
                let mut inner =
                    proc_macro2::Group::new(group.delimiter(), respanned(group.stream(), span));
                inner.set_span(span);
                TokenTree::Group(inner)
            }
            mut token => {
                token.set_span(span);
                token
            }
        })
        .collect()
}

/// Moves a `mut` from the connection or batch parameter to the body's binding of that
/// name, which is the binding the body reassigns or mutates; left on the handler's
/// parameter, it would be unused there and rustc would suggest `mut mut conn`.
fn take_mut(sig: &mut Signature, parameter: &Ident) -> Option<Token![mut]> {
    sig.inputs.iter_mut().find_map(|input| match input {
        FnArg::Typed(typed) => match typed.pat.as_mut() {
            Pat::Ident(pat) if pat.ident == *parameter => pat.mutability.take(),
            _ => None,
        },
        FnArg::Receiver(_) => None,
    })
}

/// The `Result<T, E>` the body's future returns: each `impl Trait` in it becomes `_`,
/// which the body's future may leave to inference (an `impl Trait` there is an error
/// about code the user never wrote), while the handler's signature keeps the opaque type.
fn body_result(result: &Type) -> Type {
    struct Infer;
    impl VisitMut for Infer {
        fn visit_type_mut(&mut self, ty: &mut Type) {
            if let Type::ImplTrait(opaque) = ty {
                *ty = Type::Infer(syn::TypeInfer {
                    underscore_token: Token![_](opaque.impl_token.span),
                });
            } else {
                visit_mut::visit_type_mut(self, ty);
            }
        }
    }
    let mut result = result.clone();
    Infer.visit_type_mut(&mut result);
    result
}

/// A return of the declared type ahead of the body, never taken: tracing-attributes'
/// "fake return edge". An async block has no declared return type, so without it `Ok(Box::new(id))` for a
/// `Result<Box<dyn Display>, E>` is not coerced and fails as "mismatched types"; with
/// it the body is checked against the declared type, as a plain `async fn`'s body is,
/// and a wrong type is reported at the user's expression. Unlike tracing's
/// `loop {}`, a call returning the type needs no `allow(unreachable_code)`, which a
/// user's `forbid` would reject.
fn fake_return(krate: &TokenStream, result: &Type) -> TokenStream {
    quote_spanned!(result.span()=>
        if false {
            return #krate::__private::fake_return::<#result>();
        }
    )
}

/// A crate-root macro named after the consumer. A second handler with the same consumer
/// defines the same name again, which `cargo check` reports (E0428) at both consumer
/// literals: shared names would make one handler's markers silently suppress the other.
/// That error's one line names only the macro, so the name says what happened and
/// shows the consumer: `diesel_inbox_consumer_used_twice__kafka_orders_v1_sc` for
/// `"kafka/orders:v1"`.
fn consumer_claim(consumer: &LitStr) -> TokenStream {
    let name = Ident::new(
        &format!(
            "diesel_inbox_consumer_used_twice__{}",
            encode_consumer(&consumer.value())
        ),
        consumer.span(),
    );
    // In a module of its own: `non_local_definitions` checks the items of a function's
    // body, but not those of a module inside it, so the claim needs no `allow`, which a
    // user's `forbid` would reject (E0453).
    let module = Ident::new(REWRITTEN_MARK, Span::mixed_site());
    quote_spanned! {consumer.span()=>
        mod #module {
            #[doc(hidden)]
            #[macro_export]
            macro_rules! #name { () => {}; }
        }
    }
}

/// The consumer as identifier characters, injectively and readably: each separator
/// becomes `_`, and a suffix after a last `_` says which separator each was, in order
/// (`h`yphen, `u`nderscore, `d`ot, `c`olon, `s`lash). The name has as many `_` as the
/// suffix has letters, so the suffix is whatever follows the last `_`.
fn encode_consumer(consumer: &str) -> String {
    let mut readable = String::with_capacity(consumer.len());
    let mut separators = String::new();
    for c in consumer.chars() {
        let letter = match c {
            '-' => 'h',
            '_' => 'u',
            '.' => 'd',
            ':' => 'c',
            '/' => 's',
            c => {
                readable.push(c);
                continue;
            }
        };
        readable.push('_');
        separators.push(letter);
    }
    if !separators.is_empty() {
        readable.push('_');
        readable.push_str(&separators);
    }
    readable
}

/// Makes the body borrow each parameter it mentions, whole and mutably, instead of
/// letting the body's async block pick what to capture: since edition 2021 it captures
/// disjoint fields, so `d.acked = true` would assign a field of a copy, and a parameter only read
/// would be captured by shared reference, making the handler's future require `Sync`
/// where a plain `async fn` needs only `Send`. Parameters the body does not mention
/// are not captured, so they keep their "unused variable" warnings.
///
/// Adds the `mut` that a mutable borrow needs to each such binding whose binding mode
/// is known to be by value: the whole parameter, or a name inside a tuple pattern of a
/// tuple type. Others are borrowed only if already `mut` (a `ref` binding is a reference
/// already). Returns one `let _ = &mut name;` per binding, under the parameter's `cfg`,
/// and for a `&self` or `&mut self` receiver a borrow of `*self` of the same kind; a
/// `&mut` parameter is moved in instead, and returned among the renamed.
fn borrow_parameters(
    sig: &mut Signature,
    conn: &Ident,
    messages: Option<&Ident>,
    body: &syn::Block,
) -> (Vec<TokenStream>, Vec<Hidden>) {
    let mentioned = mentioned_names(quote!(#body));
    let mut borrows = Vec::new();
    let mut moved = Vec::new();
    for input in &mut sig.inputs {
        match input {
            FnArg::Receiver(receiver) => {
                if !mentioned.contains("self") {
                    continue;
                }
                let self_token = receiver.self_token;
                borrows.push(match (&receiver.reference, receiver.mutability) {
                    (Some(_), Some(_)) => quote!(let _ = &mut *#self_token;),
                    (Some(_), None) => quote!(let _ = &*#self_token;),
                    (None, _) => {
                        receiver.mutability = Some(<Token![mut]>::default());
                        quote!(let _ = &mut #self_token;)
                    }
                });
            }
            FnArg::Typed(typed) => {
                // The body's own bindings of these, shadowing them.
                if matches!(typed.pat.as_ref(), Pat::Ident(pat)
                    if pat.ident == *conn || messages == Some(&pat.ident))
                {
                    continue;
                }
                let cfg = typed
                    .attrs
                    .iter()
                    .filter(|attr| attr.path().is_ident("cfg"));
                let cfg = quote!(#(#cfg)*);
                // A `&mut` borrow moves into the body, as into a plain `async fn`'s
                // future: the body can then return a borrow through it for its whole
                // lifetime (`-> Result<&'a mut u64, E>`), which a borrow of the
                // handler's binding cannot give. Renamed apart in the signature, like
                // the connection, so that the body's binding shadows nothing.
                let mutable_borrow = matches!(
                    ungroup(&typed.ty),
                    Type::Reference(reference) if reference.mutability.is_some()
                );
                let pat = match typed.pat.as_mut() {
                    Pat::Ident(pat) if mutable_borrow => Some(pat),
                    _ => None,
                };
                if let Some(pat) = pat.filter(|pat| {
                    pat.by_ref.is_none()
                        && pat.subpat.is_none()
                        && mentioned.contains(&pat.ident.to_string())
                }) {
                    let parameter = Hidden::of(&pat.ident);
                    let mutability = pat.mutability.take();
                    pat.ident = parameter.hidden.clone();
                    let Hidden { visible, hidden } = &parameter;
                    borrows.push(quote!(#cfg let #mutability #visible = #hidden;));
                    moved.push(parameter);
                    continue;
                }
                let mut names = Vec::new();
                bindings(&mut typed.pat, Some(&typed.ty), &mentioned, &mut names);
                borrows.extend(
                    names
                        .into_iter()
                        .map(|name| quote!(#cfg let _ = &mut #name;)),
                );
            }
        }
    }
    (borrows, moved)
}

/// The by-value bindings of `pat` that can be borrowed mutably, adding `mut` where the
/// binding mode is known to be by value: `ty` is the type `pat` matches, when known.
fn bindings(pat: &mut Pat, ty: Option<&Type>, mentioned: &HashSet<String>, out: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(binding) => {
            if binding.by_ref.is_some() || !mentioned.contains(&binding.ident.to_string()) {
                return;
            }
            if binding.mutability.is_none() {
                // Only a binding matched by value can be made `mut`; under a
                // reference's default binding mode `mut` would be an error.
                if ty.is_none() {
                    return;
                }
                binding.mutability = Some(<Token![mut]>::default());
            }
            out.push(binding.ident.clone());
        }
        Pat::Tuple(tuple) => {
            let mut types = match ty.map(ungroup) {
                Some(Type::Tuple(types)) if types.elems.len() == tuple.elems.len() => {
                    Some(types.elems.iter())
                }
                _ => None,
            };
            for elem in &mut tuple.elems {
                let ty = types.as_mut().and_then(Iterator::next);
                bindings(elem, ty, mentioned, out);
            }
        }
        Pat::Paren(paren) => bindings(&mut paren.pat, ty, mentioned, out),
        Pat::Reference(reference) => bindings(&mut reference.pat, None, mentioned, out),
        Pat::Slice(slice) => {
            for elem in &mut slice.elems {
                bindings(elem, None, mentioned, out);
            }
        }
        Pat::Struct(fields) => {
            for field in &mut fields.fields {
                bindings(&mut field.pat, None, mentioned, out);
            }
        }
        Pat::TupleStruct(fields) => {
            for elem in &mut fields.elems {
                bindings(elem, None, mentioned, out);
            }
        }
        _ => {}
    }
}

/// Every identifier in `tokens`, and every word of its literals, where inline format
/// arguments (`"{id}"`) name variables.
fn mentioned_names(tokens: TokenStream) -> HashSet<String> {
    let mut names = HashSet::new();
    let mut stack = vec![tokens];
    while let Some(tokens) = stack.pop() {
        for token in tokens {
            match token {
                TokenTree::Ident(ident) => {
                    names.insert(ident.to_string());
                }
                TokenTree::Group(group) => stack.push(group.stream()),
                TokenTree::Literal(literal) => names.extend(
                    literal
                        .to_string()
                        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .map(str::to_owned),
                ),
                TokenTree::Punct(_) => {}
            }
        }
    }
    names
}

/// Whether the handler is a method or its signature names `Self`: only then can its
/// body name `Self` (a free function has none).
fn has_self(sig: &Signature) -> bool {
    fn names_self(tokens: TokenStream) -> bool {
        tokens.into_iter().any(|token| match token {
            TokenTree::Ident(ident) => ident == "Self",
            TokenTree::Group(group) => names_self(group.stream()),
            _ => false,
        })
    }
    sig.receiver().is_some() || names_self(quote!(#sig))
}

/// Fails to compile in a trait's default method, whose consumer every implementor would
/// share: one implementor's markers would then make the others' deliveries `Duplicate`.
/// The attribute sees only the function, so the check goes by what differs in its body:
/// a trait's `Self` is not `Sized` unless the trait requires it, while the type of an
/// `impl` block usually is. A method of an unsized type is told apart by a visibility,
/// which the caller checks. Reported at `self`, or else at the method's name.
fn not_in_trait_default(sig: &Signature) -> TokenStream {
    let span = sig
        .receiver()
        .map_or(sig.ident.span(), |receiver| receiver.self_token.span);
    // `do_not_recommend`: for an unsized type of an `impl`, the error is then this one,
    // which says what to do, rather than rustc's "the size … cannot be known".
    quote_spanned! {span=>
        {
            #[diagnostic::on_unimplemented(
                message = "`#[idempotent]` cannot go on a trait's default method",
                label = "every implementor would share this consumer and its markers",
                note = "put `#[idempotent]` on each implementor's method, with a consumer of its own; \
                        the methods can share their body through a helper",
                note = "a method of an unsized type (in `impl dyn Trait`, or of a struct ending in a \
                        slice) is told from a trait's by its visibility, which a trait's method cannot \
                        have: write `pub(self)` for a private one"
            )]
            trait __InboxNotInTraitDefault {}
            #[diagnostic::do_not_recommend]
            impl<T> __InboxNotInTraitDefault for T {}
            struct __InboxNotInTraitDefaultCheck<T: ?::core::marker::Sized + __InboxNotInTraitDefault>(
                ::core::marker::PhantomData<T>,
            );
            let _: __InboxNotInTraitDefaultCheck<Self>;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{encode_consumer, expand};
    use crate::validate::validate;

    /// A renamed dependency has no `::diesel_inbox` to fall back on: every path the
    /// expansion writes must go through `crate = …`.
    #[test]
    fn crate_path_replaces_every_path() {
        let args = syn::parse_str("consumer = \"c\", key = id, crate = ::inbox").unwrap();
        let function = syn::parse_quote! {
            async fn handle(&self, conn: &mut C, id: u64) -> Result<u64, E> { Ok(id) }
        };
        let handler =
            validate(args, &function).unwrap_or_else(|rejected| panic!("{}", rejected.error));
        let expanded = expand(handler, function).to_string();
        let unrouted = expanded
            .replace("diesel_inbox_consumer_used_twice__", "")
            .matches("diesel_inbox")
            .count();
        assert_eq!(unrouted, 0, "{expanded}");
        assert!(
            expanded.contains(":: inbox :: __private :: begin_transaction"),
            "{expanded}"
        );
    }

    #[test]
    fn consumers_encode_readably() {
        assert_eq!(encode_consumer("credit"), "credit");
        assert_eq!(encode_consumer("shared-name"), "shared_name_h");
        assert_eq!(encode_consumer("kafka/orders:v1"), "kafka_orders_v1_sc");
    }

    #[test]
    fn consumers_encode_injectively() {
        let names = [
            "a-b", "a_b", "a.b", "a:b", "a/b", "a_-b", "a-_b", "a__h", "a-", "a_h",
        ];
        let mut encoded: Vec<String> = names.iter().map(|name| encode_consumer(name)).collect();
        encoded.sort();
        encoded.dedup();
        assert_eq!(encoded.len(), names.len());
    }
}
