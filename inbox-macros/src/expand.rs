//! Writing the handler: the body moves into an async closure that
//! `diesel_inbox::__private::run` calls inside the transaction.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, ItemFn, LitStr, ReturnType, parse_quote};

use crate::validate::Handler;

pub(crate) fn expand(handler: Handler, mut function: ItemFn) -> TokenStream {
    let Handler {
        consumer,
        key,
        conn,
        fast_path,
        ok,
        err,
    } = handler;
    let ReturnType::Type(_, result) = &function.sig.output else {
        unreachable!("validation accepted only `-> Result<T, E>`")
    };
    let result = result.clone();
    let body = &function.block;
    // The closure's parameter reuses the connection's name, so the body can only reach
    // the transaction's connection.
    let closure = quote!(async move |#conn| -> #result #body);
    let message_id = format_ident!("__inbox_message_id", span = Span::mixed_site());
    // Evaluated before the body takes the parameters, and spanned at the key so that a
    // key without `InboxKey` is reported there.
    let encode = quote_spanned!(key.span()=> ::diesel_inbox::__private::encode_key(&(#key)));
    // Spanned at the error type, so that an error type without the conversion is
    // reported at the handler's signature.
    let into_error = quote_spanned!(err.span()=>
        <#err as ::diesel_inbox::__private::HandlerError>::from_diesel
    );
    // Evaluated before the body takes the parameters, like the key.
    let fast_path = match fast_path {
        None => quote!(::diesel_inbox::__private::FastPath::Adaptive),
        Some(when) => {
            quote_spanned!(when.span()=> ::diesel_inbox::__private::FastPath::when(#when))
        }
    };
    let claim = consumer_claim(&consumer);
    let handler = function.sig.ident.to_string();
    let registration = format_ident!("__INBOX_HANDLER", span = Span::mixed_site());
    let registered = quote!(::diesel_inbox::RegisteredHandler::new(
        #consumer,
        ::core::concat!(::core::module_path!(), "::", #handler),
    ));
    // Spanned at the connection parameter: what `run` requires of the connection (an
    // async connection, a supported backend) is reported there.
    let run = quote_spanned!(conn.span()=>
        ::diesel_inbox::__private::run(
            #conn,
            &#registration,
            #message_id,
            #fast_path,
            #into_error,
            #closure,
        )
        .await
    );
    function.block = parse_quote!({
        #claim
        // `run` reads the consumer through this static's address: calling the handler
        // then links the object holding its registration, even when a generic handler
        // is instantiated in another crate.
        static #registration: ::diesel_inbox::__private::Handler =
            ::diesel_inbox::__private::Handler::new(#registered);
        ::diesel_inbox::__private::inventory::submit! { #registered }
        let #message_id = #encode;
        #run
    });
    function.sig.output = parse_quote!(
        -> ::core::result::Result<::diesel_inbox::Outcome<#ok>, #err>
    );
    quote!(#function)
}

/// A crate-root macro named after the consumer. A second handler with the same consumer
/// defines the same name again, which `cargo check` reports (E0428) at both consumer
/// literals: shared names would make one handler's markers silently suppress the other.
fn consumer_claim(consumer: &LitStr) -> TokenStream {
    let mut name = String::from("__diesel_inbox_consumer_");
    // Injective: `_` always starts a two-character escape.
    for c in consumer.value().chars() {
        match c {
            '_' => name.push_str("__"),
            '-' => name.push_str("_h"),
            '.' => name.push_str("_d"),
            ':' => name.push_str("_c"),
            '/' => name.push_str("_s"),
            c => name.push(c),
        }
    }
    let name = Ident::new(&name, consumer.span());
    quote_spanned! {consumer.span()=>
        #[doc(hidden)]
        #[allow(non_local_definitions)]
        #[macro_export]
        macro_rules! #name { () => {}; }
    }
}
