//! Writing the batch form: the keys of all messages, checked before the transaction,
//! then `begin_batch` in place of `begin_transaction`, and the new messages picked for
//! the body: borrows of a borrowed batch's messages, or an owned batch's own.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Expr, Ident, Pat, Path, ReturnType, Token};

use super::{Hidden, Renamed, connection_argument};
use crate::diagnostics::at;
use crate::validate::batch::{Batch, Form};

/// The body's binding of the new messages, under the batch parameter's name, `mut` if
/// the handler's parameter was: a move into the body's future, so that it holds no
/// borrow of an owned batch, which would need `M: Sync` for a `Send` future.
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
    /// The handler's statements before the transaction: the batch as a slice.
    pub(crate) prepare: TokenStream,
    /// The call of the step that begins the batch's transaction, with the keys of all
    /// messages, checked there.
    pub(crate) call: TokenStream,
    /// The statement that binds the new messages, before the body.
    pub(crate) select: TokenStream,
}

/// The batch form's statements: the call that begins the transaction with
/// `connection` as `begin` says, the keys encoded in its arguments, and the new
/// messages picked for the body.
#[allow(
    clippy::too_many_arguments,
    reason = "the names the handler's other statements share with these"
)]
pub(crate) fn begin(
    batch: &Batch,
    krate: &Path,
    renamed: &Renamed,
    connection: &Ident,
    begin: &TokenStream,
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
    let borrowed = match form {
        Form::Owned => quote!(&#slice),
        Form::Lent | Form::Lending => quote!(#slice),
    };
    // An argument before the connection's, so that a key may use the connection too,
    // through the steps' binding of it, which the argument's reborrow then leaves.
    let keys = renamed
        .through(connection)
        .reach(keys(krate, &borrowed, key, capture.as_ref()));
    let conn = &renamed.connection.visible;
    let call = {
        let connection = connection_argument(krate, conn, connection);
        let krate = at(krate, conn.span());
        quote_spanned!(conn.span()=>
            #krate::__private::begin_batch(#begin, #keys, #connection, &#registration)
        )
    };
    Begin {
        prepare: quote!(let #slice = #messages_slice;),
        call,
        select: quote!(let #new_messages = #steps.select(#slice);),
    }
}

/// The keys of all messages, encoded in a loop over them (`BatchKeys`), each spanned at
/// the key, so that a key without `InboxKey` is reported there. A loop in the handler
/// rather than a closure called through `dyn`, whose shims and debug info each handler
/// would compile.
fn keys(
    krate: &Path,
    slice: &TokenStream,
    key: &Expr,
    capture: Option<&Token![move]>,
) -> TokenStream {
    let keys = format_ident!("__inbox_keys", span = Span::mixed_site());
    let message = format_ident!("__inbox_message", span = Span::mixed_site());
    // What the loop binds each message to, what it writes before itself and before each
    // key, and the key of the message.
    let (pattern, before_loop, bind, key_of_message, span) = match key {
        // The key's expression is inlined and borrowed, as in the single form, so
        // `|msg| msg.message_id` needs no `.clone()`. Not with an explicit return type,
        // where the closure's own value is the key, nor where the body must stay a
        // closure's.
        Expr::Closure(closure)
            if matches!(closure.output, ReturnType::Default)
                && !needs_its_closure(closure.body.to_token_stream()) =>
        {
            let input = &closure.inputs[0];
            let body = &closure.body;
            match input {
                // Bound at its place, so that a parameter of another type than the
                // message is reported there.
                Pat::Type(_) => {
                    let message_here = respanned_ident(&message, input.span());
                    let bind = quote_spanned!(input.span()=> let #input = #message_here;);
                    (
                        quote!(#message),
                        None,
                        Some(bind),
                        quote!(#body),
                        body.span(),
                    )
                }
                _ => (quote!(#input), None, None, quote!(#body), body.span()),
            }
        }
        // Typed by a function of one message first: a closure's parameter then gets its
        // type from the message, and its key may borrow from the message (`-> &str`,
        // `Msg::key` for `fn key(&self) -> &str`). Made once, so that a `move`
        // closure's captures move once.
        key => {
            let function = format_ident!("__inbox_key", span = Span::mixed_site());
            let krate = at(krate, key.span());
            let typed = quote_spanned!(key.span()=>
                let mut #function = #krate::__private::batch_key_fn(#slice, #capture #key);
            );
            let call = quote_spanned!(key.span()=> #function(#message));
            (quote!(#message), Some(typed), None, call, key.span())
        }
    };
    let encode = {
        let krate = at(krate, span);
        quote_spanned!(span=> #krate::InboxKey::encode(&(#key_of_message)))
    };
    quote!({
        #before_loop
        let mut #keys = #krate::__private::BatchKeys::new(#slice);
        while let ::core::option::Option::Some(#pattern) = #keys.next_message() {
            #bind
            #keys.push(#encode);
        }
        #keys.finish()
    })
}

/// `ident`, with its hygiene, placed at `span`.
fn respanned_ident(ident: &Ident, span: Span) -> Ident {
    let mut ident = ident.clone();
    ident.set_span(ident.span().located_at(span));
    ident
}

/// Whether a key's body must stay a closure's: it returns from the closure (`return`,
/// `?`), or inlined it would act on the loop around it (`break`, `continue`) or be
/// accepted where a closure rejects it (`.await`). Any such token, to be safe.
fn needs_its_closure(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|token| match token {
        TokenTree::Ident(ident) => ["return", "break", "continue", "await"]
            .iter()
            .any(|word| ident == word),
        TokenTree::Punct(punct) => punct.as_char() == '?',
        TokenTree::Group(group) => needs_its_closure(group.stream()),
        TokenTree::Literal(_) => false,
    })
}
