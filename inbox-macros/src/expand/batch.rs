//! Writing the batch form: the keys of all messages, checked before the transaction,
//! then `run_batch` in place of `run`.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, Path};

use crate::diagnostics::at;
use crate::validate::batch::Batch;

/// The closure's parameter after the connection: the new messages, under the batch
/// parameter's name.
pub(crate) fn closure_parameter(batch: Option<&Batch>) -> Option<TokenStream> {
    batch.map(|batch| {
        let messages = &batch.messages;
        quote!(, #messages)
    })
}

/// The handler's statements from the keys on: the keys of all messages, checked before
/// the transaction, then the call of `run_batch`, which returns the handler's result.
pub(crate) fn expand_run(
    batch: &Batch,
    krate: &Path,
    conn: &Ident,
    borrow: &TokenStream,
    registration: &Ident,
    error_type: &TokenStream,
    closure: &TokenStream,
) -> TokenStream {
    let Batch {
        messages,
        key_input,
        key_body,
    } = batch;
    // Spanned at the parameter in the signature, so that one that is no batch is
    // reported there, once.
    let slice = format_ident!("__inbox_messages", span = Span::mixed_site());
    let messages_slice = {
        let krate = at(krate, messages.span());
        quote_spanned!(messages.span()=> #krate::__private::batch_messages(&#messages))
    };
    let message_ids = format_ident!("__inbox_message_ids", span = Span::mixed_site());
    // Spanned at the key, so that a key without `InboxKey` is reported there. The key is
    // borrowed, as in the single form, so `|msg| msg.message_id` needs no `.clone()`.
    let keys = {
        let krate = at(krate, key_body.span());
        quote_spanned!(key_body.span()=>
            #krate::__private::batch_keys(#slice, |#key_input| {
                #krate::InboxKey::encode(&(#key_body))
            })
        )
    };
    let run = {
        let krate = at(krate, conn.span());
        quote_spanned!(conn.span()=>
            #krate::__private::outside_any_claim(#krate::__private::run_batch(
                #borrow,
                &#registration,
                #slice,
                #message_ids,
                #error_type,
                #closure,
            ))
            .await
        )
    };
    quote! {
        let #slice = #messages_slice;
        let #message_ids = #keys;
        #run
    }
}
