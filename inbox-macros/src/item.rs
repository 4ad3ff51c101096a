//! Reading the handler: its signature parsed, its body kept as the tokens it came in.
//!
//! The attribute reads nothing of the body but the names it mentions, and writes it back
//! unchanged inside the expansion. Parsed, every statement would be parsed and printed
//! again for each handler, most of what the attribute costs a build; kept as tokens, a
//! body that does not parse is reported by rustc, at its own mistake.

use proc_macro2::TokenStream;
use syn::parse::ParseStream;
use syn::{Attribute, Block, Item, ItemFn, Signature, Stmt, Visibility, braced};

/// An `fn` item whose body is one verbatim statement: the body's tokens.
pub(crate) fn parse_function(input: ParseStream<'_>) -> syn::Result<ItemFn> {
    let mut attrs = input.call(Attribute::parse_outer)?;
    let vis: Visibility = input.parse()?;
    let sig: Signature = input.parse()?;
    let content;
    let brace_token = braced!(content in input);
    attrs.extend(content.call(Attribute::parse_inner)?);
    let body: TokenStream = content.parse()?;
    Ok(ItemFn {
        attrs,
        vis,
        sig,
        block: Box::new(verbatim_block(brace_token, body)),
    })
}

/// A block of `tokens`, which are printed as they are.
pub(crate) fn verbatim_block(brace_token: syn::token::Brace, tokens: TokenStream) -> Block {
    Block {
        brace_token,
        stmts: vec![Stmt::Item(Item::Verbatim(tokens))],
    }
}
