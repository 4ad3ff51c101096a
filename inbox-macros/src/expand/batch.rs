//! Writing the batch form: the keys of all messages, checked before the transaction,
//! then `begin_batch` in place of `begin_transaction`, and the new messages picked for
//! the body: borrows of a borrowed batch's messages, or an owned batch's own.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Expr, Ident, Path, ReturnType, Token};

use super::{Hidden, Renamed, connection_argument};
use crate::diagnostics::at;
use crate::validate::batch::{Batch, Form};

/// The body's binding of the new messages, under the batch parameter's name, `mut` if
/// the handler's parameter was.
pub(crate) fn body_binding(
    batch: Option<&Batch>,
    mutability: Option<Token![mut]>,
    new_messages: &Ident,
) -> Option<TokenStream> {
    batch.map(|batch| {
        let messages = &batch.messages;
        quote!(let #mutability #messages = #new_messages;)
    })
}

/// What the batch form writes around the body.
pub(crate) struct Begin {
    /// The handler's statements before the transaction: the keys of all messages,
    /// checked there.
    pub(crate) prepare: TokenStream,
    /// The call of the step that begins the batch's transaction.
    pub(crate) call: TokenStream,
    /// The statement that binds the new messages, before the body.
    pub(crate) select: TokenStream,
}

/// The batch form's statements: the keys, the call that begins the transaction with
/// `connection` as `begin` says, and the new messages picked for the body.
#[allow(
    clippy::too_many_arguments,
    reason = "the names the handler's other statements share with these"
)]
pub(crate) fn begin(
    batch: &Batch,
    krate: &Path,
    renamed: &Renamed,
    connection: &Ident,
    begin: &Ident,
    registration: &Ident,
    new_messages: &Ident,
    steps: &Ident,
) -> Begin {
    let Batch {
        messages,
        key,
        capture,
        form,
    } = batch;
    // Spanned at the parameter in the signature, so that one that is no batch is
    // reported there, once: through a binding of the name as written, in a block of its
    // own, since the signature's binding has the expansion's hygiene (see `Hidden`).
    let slice = format_ident!("__inbox_messages", span = Span::mixed_site());
    // A batch the body owns is moved into a `Vec` first, and its keys read from there;
    // one it borrows for the batch's lifetime is reborrowed for all of it.
    let messages_slice = {
        let krate = at(krate, messages.span());
        let hidden = Hidden::of(messages).hidden;
        let (binding, conversion) = match form {
            Form::Lent => (quote!(&#hidden), "batch_messages"),
            Form::Owned => (quote!(#hidden), "owned_batch"),
            Form::Lending => (quote!(&*#hidden), "batch_messages"),
        };
        let conversion = Ident::new(conversion, messages.span());
        quote_spanned!(messages.span()=> {
            let #messages = #binding;
            #krate::__private::#conversion(#messages)
        })
    };
    let message_ids = format_ident!("__inbox_message_ids", span = Span::mixed_site());
    let borrowed = match form {
        Form::Owned => quote!(&#slice),
        Form::Lent | Form::Lending => quote!(#slice),
    };
    let (keys, key_of) = keys(krate, &borrowed, key, capture.as_ref());
    let keys = renamed.reach(keys);
    let conn = &renamed.connection.visible;
    let call = {
        let connection = connection_argument(krate, conn, connection);
        let krate = at(krate, conn.span());
        quote_spanned!(conn.span()=>
            #krate::__private::begin_batch(
                #connection,
                #begin,
                &#registration,
                #slice.len(),
                #message_ids,
            )
        )
    };
    Begin {
        prepare: quote! {
            #key_of
            let #slice = #messages_slice;
            let #message_ids = #keys;
        },
        call,
        select: quote!(let #new_messages = #steps.select(#slice);),
    }
}

/// `batch_keys(messages, |msg| encode(&(key)))`, spanned at the key, so that a key
/// without `InboxKey` is reported there; and the function it calls, if any. A `move`
/// closure's captures move once, into the closure over all messages.
fn keys(
    krate: &Path,
    slice: &TokenStream,
    key: &Expr,
    capture: Option<&Token![move]>,
) -> (TokenStream, Option<TokenStream>) {
    match key {
        // The key's expression is inlined and borrowed, as in the single form, so
        // `|msg| msg.message_id` needs no `.clone()`. Not with an explicit return type or
        // a `return` (here any `return` token, to be safe), where the closure's own
        // value is the key.
        Expr::Closure(closure)
            if matches!(closure.output, ReturnType::Default)
                && !mentions_return(closure.body.to_token_stream()) =>
        {
            let input = &closure.inputs[0];
            let body = &closure.body;
            let krate = at(krate, body.span());
            let keys = quote_spanned!(body.span()=>
                #krate::__private::batch_keys(#slice, &mut #capture |#input| {
                    #krate::InboxKey::encode(&(#body))
                })
            );
            (keys, None)
        }
        // Applied through a function rather than called directly: a closure's parameter
        // then gets its type from the message, and its key may borrow from the message
        // (`-> &str`, `Msg::key` for `fn key(&self) -> &str`).
        key => {
            let message = format_ident!("__inbox_message", span = Span::mixed_site());
            let key_of = format_ident!("__inbox_key_of", span = Span::mixed_site());
            let krate = at(krate, key.span());
            let keys = quote_spanned!(key.span()=>
                #krate::__private::batch_keys(#slice, &mut #capture |#message| {
                    #krate::InboxKey::encode(&#key_of(#message, #key))
                })
            );
            let key_of = quote! {
                fn #key_of<'m, M, K>(
                    message: &'m M,
                    key: impl ::core::ops::FnOnce(&'m M) -> K,
                ) -> K {
                    key(message)
                }
            };
            (keys, Some(key_of))
        }
    }
}

fn mentions_return(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|token| match token {
        TokenTree::Ident(ident) => ident == "return",
        TokenTree::Group(group) => mentions_return(group.stream()),
        _ => false,
    })
}
