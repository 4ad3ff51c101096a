//! Checking the batch form, `#[idempotent(consumer = "…", batch = msgs, key = |msg|
//! msg.id)]`: the handler takes many messages, and its body runs once, in one
//! transaction, over those that are new. Everything both forms share is checked in the
//! parent module.

use syn::{Expr, FnArg, Ident, ItemFn, Pat, Token};

use crate::diagnostics::{Errors, not_a_parameter};

/// What the batch form adds to a handler that passed every check.
pub(crate) struct Batch {
    /// The parameter holding the messages; the body sees, under the same name, the new
    /// ones.
    pub(crate) messages: Ident,
    /// `key = …`: a closure or the path of a function, from one message to its key. A
    /// closure's `move` is taken off, into `capture`.
    pub(crate) key: Expr,
    pub(crate) capture: Option<Token![move]>,
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
    Some(Batch {
        messages: messages?,
        key,
        capture,
    })
}

/// The parameter `batch = …` names.
fn messages_parameter(value: &Expr, function: &ItemFn, errors: &mut Errors) -> Option<Ident> {
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
            Pat::Ident(pat) if pat.ident == *name => Some(pat.ident.clone()),
            _ => None,
        },
        FnArg::Receiver(_) => None,
    });
    if parameter.is_none() {
        errors.spanned(name, not_a_parameter("batch", name, function));
    }
    parameter
}
