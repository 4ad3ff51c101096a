//! Parsing the attribute's arguments: `consumer = "…", key = <expr>, conn = <ident>,
//! fast_path = <bool expr>, crate = <path>`, for claim mode `claim`,
//! `lease = <Duration expr>`, `max_attempts = <integer>`, `takeover = <bool>`, in both
//! modes `fingerprint = <bytes or text expr>`, and for the batch form `batch = <ident>`.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, Ident, Token};

/// Every argument the attribute accepts, in the order the docs list them.
pub(crate) const ARGUMENTS: [&str; 11] = [
    "consumer",
    "key",
    "conn",
    "fast_path",
    "crate",
    "claim",
    "lease",
    "max_attempts",
    "takeover",
    "fingerprint",
    "batch",
];

/// One `name = value` pair, or a bare `name`, not yet checked.
pub(crate) struct Argument {
    pub(crate) name: Ident,
    pub(crate) value: Option<Expr>,
}

impl Parse for Argument {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let name = input.call(Ident::parse_any)?;
        let value = if input.peek(Token![=]) {
            input.parse::<Token![=]>()?;
            Some(input.parse()?)
        } else {
            None
        };
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
