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

/// Makes an `async fn` handler apply each (message, consumer) exactly once.
///
/// See `diesel_inbox::idempotent` for the documentation.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let function = match syn::parse::<syn::ItemFn>(item.clone()) {
        Ok(function) => function,
        Err(_) => {
            let error = syn::Error::new(
                proc_macro2::Span::call_site(),
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
        // The function is kept as written so that completion still works on it.
        Err(error) => {
            let mut output = error.into_compile_error();
            function.to_tokens(&mut output);
            output.into()
        }
    }
}
