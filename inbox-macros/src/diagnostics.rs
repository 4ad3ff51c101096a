//! Reporting mistakes: collecting every error of a build, and placing the spans that
//! rustc reports type errors at.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::{Path, Type};

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
