//! Reporting mistakes: collecting every error of a build, and placing the spans that
//! rustc reports type errors at.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::{FnArg, Ident, ItemFn, Pat, Path, Type};

/// The module every rewritten handler's body starts with: a second `#[idempotent]`
/// recognises the first's work by it, whatever name either was imported under.
pub(crate) const REWRITTEN_MARK: &str = "__inbox_consumer_claim";

/// Collects errors so that one build reports all of them.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    pub(crate) fn spanned(
        &mut self,
        tokens: impl quote::ToTokens,
        message: impl std::fmt::Display,
    ) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// The errors collected, combined into one; `None` when there were none.
    pub(crate) fn into_error(self) -> Option<syn::Error> {
        self.0
    }
}

/// `krate` placed at `span`: tokens interpolated into `quote_spanned!` keep their own
/// spans, and an error in a call is reported where the path of the called function is.
pub(crate) fn at(krate: &Path, span: Span) -> TokenStream {
    quote!(#krate)
        .into_iter()
        .map(|mut token| {
            token.set_span(span);
            token
        })
        .collect()
}

/// `ty` without the invisible groups that `macro_rules!` fragments (`$t:ty`) and
/// macro-generated signatures arrive in.
pub(crate) fn ungroup(mut ty: &Type) -> &Type {
    while let Type::Group(group) = ty {
        ty = &group.elem;
    }
    ty
}

/// "`name` is not a parameter", for `argument = name`. rustc's "unused variable" advice
/// renames a parameter to `_name`, which the argument must then follow: the message
/// says so when only the underscore differs.
pub(crate) fn not_a_parameter(argument: &str, name: &Ident, function: &ItemFn) -> String {
    let bare = |ident: &str| ident.trim_start_matches('_').to_owned();
    let wanted = bare(&name.to_string());
    let renamed = function.sig.inputs.iter().find_map(|input| match input {
        FnArg::Typed(typed) => match typed.pat.as_ref() {
            Pat::Ident(pat) if bare(&pat.ident.to_string()) == wanted => Some(&pat.ident),
            _ => None,
        },
        FnArg::Receiver(_) => None,
    });
    match renamed {
        Some(parameter) => format!(
            "`{name}` is not a parameter of this handler; the parameter is `{parameter}`: \
             write `{argument} = {parameter}`"
        ),
        None => format!("`{name}` is not a parameter of this handler"),
    }
}
