//! Parsing the attribute's arguments: `consumer = "…", key = <expr>, conn = <ident>,
//! fast_path = <bool expr>, crate = <path>, batch = <ident>`.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, Ident, Token};

/// Every argument the attribute accepts, in the order the docs list them.
pub(crate) const ARGUMENTS: [&str; 6] = ["consumer", "key", "conn", "fast_path", "crate", "batch"];

/// One `name = value` pair, not yet checked.
pub(crate) struct Argument {
    pub(crate) name: Ident,
    pub(crate) value: Expr,
}

impl Parse for Argument {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let name = input.call(Ident::parse_any)?;
        input.parse::<Token![=]>()?;
        let value = input.parse()?;
        Ok(Self { name, value })
    }
}

/// The raw argument list, as written.
pub(crate) struct Arguments {
    pub(crate) list: Punctuated<Argument, Token![,]>,
    pub(crate) span: Span,
}

impl Parse for Arguments {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let span = input.span();
        let list = Punctuated::parse_terminated(input)?;
        Ok(Self { list, span })
    }
}
