//! Checking the batch form, `#[idempotent(consumer = "…", batch = msgs, key = |msg|
//! msg.id)]`: the handler takes many messages, and its body runs once, in one
//! transaction, over those that are new. Everything both forms share is checked in the
//! parent module.

use proc_macro2::{TokenStream, TokenTree};
use quote::ToTokens;
use syn::{Expr, FnArg, Ident, ItemFn, Lifetime, Pat, ReturnType, Token, Type};

use crate::diagnostics::{Errors, not_a_parameter, ungroup};

/// What the batch form adds to a handler that passed every check.
pub(crate) struct Batch {
    /// The parameter holding the messages; the body sees, under the same name, the new
    /// ones.
    pub(crate) messages: Ident,
    /// `key = …`: a closure or the path of a function, from one message to its key. A
    /// closure's `move` is taken off, into `capture`.
    pub(crate) key: Expr,
    pub(crate) capture: Option<Token![move]>,
    /// What the body gets of the messages.
    pub(crate) form: Form,
}

/// How the batch parameter's messages reach the body, as its type and the handler's
/// return type say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// Borrows of the new messages, for any lifetime (`Vec<&M>`): a borrowed batch, or
    /// one by value of a type other than the three below.
    Lent,
    /// The new messages themselves (`Vec<M>`), moved out of a batch taken as a `Vec`,
    /// an array or a `Box`, so that the body holds no `&M` across an `.await`, which
    /// would need `M: Sync` for a `Send` future.
    Owned,
    /// Borrows for the batch's own lifetime, which the return type names
    /// (`msgs: &'a [M] -> Result<Vec<&'a str>, E>`): the body's value may then borrow
    /// from its messages.
    Lending,
}

/// Arguments that do not combine with `batch`, and why.
const NOT_WITH_BATCH: &[(&str, &str)] = &[
    (
        "fast_path",
        "`fast_path` does not apply to a batch: its marker insert finds every duplicate of \
         the batch in the same statements, so reading first would only add a round trip",
    ),
    (
        "claim",
        "claim mode does not take batches: each claim is a transaction of its own, before \
         and after an external call per message; claim each message with its own call",
    ),
    (
        "fingerprint",
        "`fingerprint` does not apply to a batch yet: each message's payload would need one \
         of its own; use a handler per message where key reuse must be caught",
    ),
];

/// Checks `batch = <parameter>`, the closure `key` must then be, and the arguments
/// `written` beside it.
pub(crate) fn validate(
    messages: &Expr,
    key: Option<&Expr>,
    written: &[Ident],
    function: &ItemFn,
    errors: &mut Errors,
) -> Option<Batch> {
    for name in written {
        if let Some((_, why)) = NOT_WITH_BATCH.iter().find(|(other, _)| name == other) {
            errors.spanned(name, why);
        }
    }
    let messages = messages_parameter(messages, function, errors);
    let key = key.and_then(|key| match key {
        Expr::Closure(closure) if closure.inputs.len() == 1 && closure.asyncness.is_none() => {
            let mut closure = closure.clone();
            let capture = closure.capture.take();
            Some((Expr::Closure(closure), capture))
        }
        Expr::Path(_) => Some((key.clone(), None)),
        other => {
            errors.spanned(
                other,
                "with `batch`, `key` is a closure from one message to its key, such as \
                 `key = |msg| msg.message_id`, or a function's path, such as \
                 `key = Msg::key`",
            );
            None
        }
    });
    let (key, capture) = key?;
    let (messages, ty) = messages?;
    Some(Batch {
        messages,
        key,
        capture,
        form: form(ty, &function.sig.output),
    })
}

/// The form the body gets the messages of a batch parameter of type `ty` in. Only the
/// type as written is seen: a type alias of a `Vec` is lent, as any other by-value type.
fn form(ty: &Type, output: &ReturnType) -> Form {
    match ungroup(ty) {
        Type::Reference(reference) => match (&reference.lifetime, output) {
            (Some(lifetime), ReturnType::Type(_, result))
                if names_lifetime(result.to_token_stream(), lifetime) =>
            {
                Form::Lending
            }
            _ => Form::Lent,
        },
        Type::Array(_) => Form::Owned,
        Type::Path(path)
            if path.qself.is_none()
                && path
                    .path
                    .segments
                    .last()
                    .is_some_and(|last| last.ident == "Vec" || last.ident == "Box") =>
        {
            Form::Owned
        }
        _ => Form::Lent,
    }
}

/// Whether `tokens` name `lifetime` (a lifetime is a `'` joined to an identifier).
fn names_lifetime(tokens: TokenStream, lifetime: &Lifetime) -> bool {
    let mut quote = false;
    tokens.into_iter().any(|token| {
        let named = match &token {
            TokenTree::Ident(ident) => quote && *ident == lifetime.ident,
            TokenTree::Group(group) => names_lifetime(group.stream(), lifetime),
            TokenTree::Punct(_) | TokenTree::Literal(_) => false,
        };
        quote = matches!(&token, TokenTree::Punct(punct) if punct.as_char() == '\'');
        named
    })
}

/// The parameter `batch = …` names, and its type.
fn messages_parameter<'f>(
    value: &Expr,
    function: &'f ItemFn,
    errors: &mut Errors,
) -> Option<(Ident, &'f Type)> {
    let message = "`batch` takes the name of the parameter holding the messages, \
                   such as `batch = msgs` for `msgs: &[CreditRequested]`";
    let Expr::Path(path) = value else {
        errors.spanned(value, message);
        return None;
    };
    let Some(name) = path.path.get_ident() else {
        errors.spanned(value, message);
        return None;
    };
    // The parameter's own name, placed in the signature: what is wrong with its type is
    // reported there.
    let parameter = function.sig.inputs.iter().find_map(|input| match input {
        FnArg::Typed(typed) => match typed.pat.as_ref() {
            Pat::Ident(pat) if pat.ident == *name => Some((pat.ident.clone(), typed.ty.as_ref())),
            _ => None,
        },
        FnArg::Receiver(_) => None,
    });
    if parameter.is_none() {
        errors.spanned(name, not_a_parameter("batch", name, function));
    }
    parameter
}

#[cfg(test)]
mod tests {
    use super::{Form, form};

    fn form_of(parameter: &str, output: &str) -> Form {
        form(
            &syn::parse_str(parameter).unwrap(),
            &syn::parse_str(output).unwrap(),
        )
    }

    #[test]
    fn owned_batches_are_the_vec_array_and_box() {
        for owned in [
            "Vec<M>",
            "std::vec::Vec<M>",
            "[M; 3]",
            "Box<[M]>",
            "Box<Vec<M>>",
        ] {
            assert_eq!(form_of(owned, "-> Result<(), E>"), Form::Owned, "{owned}");
        }
        for lent in [
            "&[M]",
            "&Vec<M>",
            "&mut [M]",
            "Arc<[M]>",
            "Batch",
            "<T as B>::Vec",
        ] {
            assert_eq!(form_of(lent, "-> Result<(), E>"), Form::Lent, "{lent}");
        }
    }

    #[test]
    fn a_batch_is_lending_when_the_return_type_names_its_lifetime() {
        let output = "-> Result<Vec<&'a str>, E>";
        assert_eq!(form_of("&'a [M]", output), Form::Lending);
        assert_eq!(form_of("&'a mut Vec<M>", output), Form::Lending);
        assert_eq!(form_of("&'b [M]", output), Form::Lent);
        assert_eq!(form_of("&'ab [M]", output), Form::Lent);
        assert_eq!(form_of("&'a [M]", "-> Result<Vec<a>, E>"), Form::Lent);
        assert_eq!(form_of("Vec<&'a M>", output), Form::Owned);
    }
}
