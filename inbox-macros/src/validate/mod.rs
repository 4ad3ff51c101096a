//! Checking the arguments and the handler, collecting every mistake before reporting.

use proc_macro2::{Punct, Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{
    Expr, ExprLit, FnArg, GenericArgument, Ident, ItemFn, Lit, LitInt, LitStr, Pat, Path,
    PathArguments, PathSegment, ReturnType, Type, parse_quote, parse_quote_spanned,
};

use crate::args::{ARGUMENTS, Argument, Arguments};
use crate::diagnostics::{Errors, REWRITTEN_MARK, at, not_a_parameter, ungroup};
use crate::manifest::Dependencies;

pub(crate) mod batch;

/// Longest consumer name, in bytes: the width of the inbox's `consumer` column.
const CONSUMER_MAX_BYTES: usize = 200;

/// A handler that passed every check: what expansion needs.
pub(crate) struct Handler {
    pub(crate) consumer: LitStr,
    pub(crate) key: Expr,
    pub(crate) conn: Ident,
    /// `None` for the default, the adaptive fast path; always `None` in claim mode.
    pub(crate) fast_path: Option<Expr>,
    /// `Some` in claim mode, with its settings as given.
    pub(crate) claim: Option<ClaimSettings>,
    /// The payload the fingerprint is taken from, in either mode.
    pub(crate) fingerprint: Option<Expr>,
    /// `T` and `E` of the handler's `Result<T, E>`.
    pub(crate) ok: Type,
    pub(crate) err: Type,
    /// Where the generated code finds diesel-inbox: `::diesel_inbox` unless `crate = …`.
    pub(crate) krate: Path,
    /// `Some` for the batch form, `batch = <parameter>`.
    pub(crate) batch: Option<batch::Batch>,
}

/// Claim mode's settings (`claim`, then `lease`, `max_attempts` and `takeover`).
pub(crate) struct ClaimSettings {
    /// `None` for the runtime's default lease.
    pub(crate) lease: Option<Expr>,
    pub(crate) max_attempts: Option<LitInt>,
    /// `true` unless `takeover = false`.
    pub(crate) takeover: bool,
}

/// A handler that failed a check: the errors, and the argument expressions that would
/// have used its parameters.
pub(crate) struct Rejected {
    pub(crate) error: syn::Error,
    /// `key`, `fast_path`, `lease` and `fingerprint` as given. The re-emitted function
    /// names them, so that a parameter only they use is not reported unused on top of
    /// the real mistake.
    pub(crate) uses: Vec<Expr>,
}

/// An error at this attribute if the handler is already rewritten, by an
/// `#[idempotent]` above it under any name (`use diesel_inbox::idempotent as once`): a
/// second rewrite would nest its transaction inside the first one's and register a
/// second consumer. Another crate's attribute that happens to be named `idempotent` is
/// none of ours, and is left alone.
pub(crate) fn already_rewritten(function: &ItemFn) -> Option<syn::Error> {
    fn mentions_mark(tokens: TokenStream) -> bool {
        tokens.into_iter().any(|token| match token {
            TokenTree::Ident(ident) => ident == REWRITTEN_MARK,
            TokenTree::Group(group) => mentions_mark(group.stream()),
            _ => false,
        })
    }
    mentions_mark(function.block.to_token_stream()).then(|| {
        syn::Error::new(
            Span::call_site(),
            "`#[idempotent]` is applied twice to this handler, here and in an attribute \
             above: a handler runs in one transaction, under one consumer; remove one",
        )
    })
}

pub(crate) fn validate(args: Arguments, function: &ItemFn) -> Result<Handler, Rejected> {
    let mut errors = Errors::default();
    let mut given: [Option<Argument>; ARGUMENTS.len()] = Default::default();
    // An argument suggested for a misspelt one is not reported missing as well.
    let mut suggested = Vec::new();
    let mut written = Vec::new();
    for argument in args.list {
        let name = argument.name.to_string();
        match ARGUMENTS.iter().position(|known| *known == name) {
            Some(slot) if given[slot].is_some() => {
                errors.spanned(&argument.name, format!("duplicate argument `{name}`"));
            }
            Some(slot) => {
                written.push(argument.name.clone());
                given[slot] = Some(argument);
            }
            None => {
                let closest = closest_argument(&name);
                errors.spanned(&argument.name, unknown_argument(&name, closest));
                suggested.extend(closest);
            }
        }
    }
    let [
        consumer,
        key,
        conn,
        fast_path,
        krate,
        claim,
        lease,
        max_attempts,
        takeover,
        fingerprint,
        batch,
    ] = given;
    // A `claim` written with a value is reported, and still read as claim mode.
    if let Some(claim) = &claim {
        flag(claim, &mut errors);
    }
    let claimed = claim.is_some();
    // A name written without its value is reported as such, not as missing as well.
    let (consumer_named, key_named) = (consumer.is_some(), key.is_some());
    let [
        consumer,
        key,
        conn,
        fast_path,
        krate,
        lease,
        max_attempts,
        takeover,
        fingerprint,
        batch,
    ] = [
        consumer,
        key,
        conn,
        fast_path,
        krate,
        lease,
        max_attempts,
        takeover,
        fingerprint,
        batch,
    ]
    .map(|argument| argument.and_then(|argument| value(argument, &mut errors)));
    let claim = claim_settings(
        claimed,
        ClaimArguments {
            fast_path: fast_path.as_ref(),
            lease: lease.as_ref(),
            max_attempts: max_attempts.as_ref(),
            takeover: takeover.as_ref(),
        },
        &mut errors,
    );
    let messages = batch
        .as_ref()
        .and_then(|messages| match ungroup_expr(messages) {
            Expr::Path(path) => path.path.get_ident().cloned(),
            _ => None,
        });
    let batch = batch
        .map(|messages| batch::validate(&messages, key.as_ref(), &written, function, &mut errors));
    // A batch's key is a closure, which a rejected handler cannot name without types.
    let key_use = key.clone().filter(|_| batch.is_none());
    let uses = || {
        key_use
            .clone()
            .into_iter()
            .chain(fast_path.clone())
            .chain(lease.clone())
            .chain(fingerprint.clone())
            .collect::<Vec<_>>()
    };

    let consumer = match consumer {
        Some(value) => consumer_name(&value, &mut errors),
        None if consumer_named || suggested.contains(&"consumer") => None,
        None => {
            errors.push(syn::Error::new(
                args.span,
                "missing `consumer = \"…\"`: name the consumer this handler is, unique in the crate",
            ));
            None
        }
    };
    if key.is_none() && !key_named && !suggested.contains(&"key") {
        errors.push(syn::Error::new(
            args.span,
            "missing `key = …`: the expression that identifies the message, such as `msg.id`",
        ));
    }
    let conn = conn.and_then(|value| match ungroup_expr(&value) {
        Expr::Path(path) if path.path.get_ident().is_some() => path.path.get_ident().cloned(),
        other => {
            errors.spanned(other, "`conn` takes the name of the connection parameter");
            None
        }
    });

    let dependencies = Dependencies::of_crate();
    let krate = match krate {
        None => Some(default_crate(dependencies.as_ref())),
        Some(value) => crate_path(&value, dependencies.as_ref(), &mut errors),
    };

    let signature = &function.sig;
    if signature.asyncness.is_none() && returns_boxed_future(&signature.output) {
        errors.spanned(
            &signature.ident,
            "`#[idempotent]` cannot rewrite a method that `#[async_trait]` has already turned \
             into a boxed future; put `#[idempotent]` on an inherent `async fn` and call it \
             from the trait method, or use a native `async fn` in the trait",
        );
        return Err(Rejected {
            error: errors.into_error().expect("just recorded"),
            uses: uses(),
        });
    }
    if signature.asyncness.is_none() {
        errors.spanned(
            signature.fn_token,
            "`#[idempotent]` handlers must be `async fn`",
        );
    }
    if let Some(constness) = signature.constness {
        errors.spanned(constness, "`#[idempotent]` handlers cannot be `const`");
    }
    if let Some(unsafety) = signature.unsafety {
        errors.spanned(unsafety, "`#[idempotent]` handlers cannot be `unsafe`");
    }
    if let Some(abi) = &signature.abi {
        errors.spanned(abi, "`#[idempotent]` handlers cannot be `extern`");
    }
    if let Some(variadic) = &signature.variadic {
        errors.spanned(variadic, "`#[idempotent]` handlers cannot be variadic");
    }
    let result = result_types(
        &signature.output,
        // An invalid `crate` is already reported; the alias projections need some path.
        krate.as_ref().unwrap_or(&default_path()),
        &mut errors,
    );
    let conn = connection_parameter(conn, messages.as_ref(), function, &mut errors);
    if let Some(conn) = &conn {
        connection_lifetime_unnamed(conn, function, &mut errors);
        connection_not_opaque(conn, function, &mut errors);
    }

    // The expansion passes the connection to its steps, so a body that never names it (most
    // claim bodies) is not reported for it either.
    let mut uses = uses();
    uses.extend(conn.iter().map(|conn| parse_quote!(#conn)));
    match (
        errors.into_error(),
        consumer,
        key,
        conn,
        result,
        krate,
        batch,
    ) {
        (None, Some(consumer), Some(key), Some(conn), Some((ok, err)), Some(krate), batch) => {
            Ok(Handler {
                consumer,
                key,
                conn,
                fast_path,
                claim,
                fingerprint,
                ok,
                err,
                krate,
                batch: batch.flatten(),
            })
        }
        (Some(error), ..) => Err(Rejected { error, uses }),
        _ => unreachable!("every missing piece records an error"),
    }
}

/// A bare argument, such as `claim`, written with a value.
fn flag(argument: &Argument, errors: &mut Errors) {
    if let Some(value) = &argument.value {
        errors.spanned(
            value,
            format!(
                "`{}` takes no value: write `{}` alone to turn it on",
                argument.name, argument.name
            ),
        );
    }
}

/// The value of a `name = value` argument, or an error at a bare `name`.
fn value(argument: Argument, errors: &mut Errors) -> Option<Expr> {
    if argument.value.is_none() {
        errors.spanned(
            &argument.name,
            format!("`{}` takes a value: `{} = …`", argument.name, argument.name),
        );
    }
    argument.value
}

/// The arguments that belong to one mode only.
#[derive(Clone, Copy)]
struct ClaimArguments<'a> {
    fast_path: Option<&'a Expr>,
    lease: Option<&'a Expr>,
    max_attempts: Option<&'a Expr>,
    takeover: Option<&'a Expr>,
}

/// Claim mode's settings when `claim` is given. Its arguments without `claim`, and
/// `fast_path` with it, are mistakes: each says which mode it belongs to.
fn claim_settings(
    claimed: bool,
    arguments: ClaimArguments<'_>,
    errors: &mut Errors,
) -> Option<ClaimSettings> {
    if !claimed {
        for (name, value) in [
            ("lease", arguments.lease),
            ("max_attempts", arguments.max_attempts),
            ("takeover", arguments.takeover),
        ] {
            if let Some(value) = value {
                errors.spanned(
                    value,
                    format!(
                        "`{name}` applies to claim mode only: add `claim` to the arguments, \
                         or remove `{name}`"
                    ),
                );
            }
        }
        return None;
    }
    if let Some(fast_path) = arguments.fast_path {
        errors.spanned(
            fast_path,
            "`fast_path` applies to transactional handlers: in claim mode the claim's \
             insert finds an existing marker, and reads it, in one step",
        );
    }
    let max_attempts = arguments.max_attempts.and_then(|value| {
        let max = match ungroup_expr(value) {
            Expr::Lit(ExprLit {
                lit: Lit::Int(int), ..
            }) => int.base10_parse::<u32>().ok().filter(|max| *max >= 1),
            _ => None,
        };
        if max.is_none() {
            errors.spanned(
                value,
                "`max_attempts` takes an integer literal from 1 to 4294967295, such as \
                 `max_attempts = 5`",
            );
        }
        // Unsuffixed, at the literal: `3u8` means three, and `ClaimPolicy` takes a `u32`.
        max.map(|max| LitInt::new(&max.to_string(), value.span()))
    });
    let takeover = match arguments.takeover.map(ungroup_expr) {
        None => true,
        Some(Expr::Lit(ExprLit {
            lit: Lit::Bool(takeover),
            ..
        })) => takeover.value,
        Some(other) => {
            errors.spanned(
                other,
                "`takeover` takes `true` or `false`: `takeover = false` quarantines a claim \
                 whose lease ended instead of running its body again",
            );
            true
        }
    };
    Some(ClaimSettings {
        lease: arguments.lease.cloned(),
        max_attempts,
        takeover,
    })
}

/// The consumer must be a string literal that fits the column and the documented
/// character set: ASCII letters, digits and `_ - . : /`.
fn consumer_name(value: &Expr, errors: &mut Errors) -> Option<LitStr> {
    let Expr::Lit(ExprLit {
        lit: Lit::Str(lit), ..
    }) = ungroup_expr(value)
    else {
        errors.spanned(
            value,
            "`consumer` must be a string literal, such as `consumer = \"credit\"`",
        );
        return None;
    };
    let name = lit.value();
    if name.is_empty() {
        errors.spanned(lit, "the consumer name must not be empty");
    } else if name.len() > CONSUMER_MAX_BYTES {
        errors.spanned(
            lit,
            format!(
                "the consumer name is {} bytes; the inbox's `consumer` column holds at most {CONSUMER_MAX_BYTES}",
                name.len()
            ),
        );
    } else if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "_-.:/".contains(*c)))
    {
        errors.spanned(
            lit,
            format!(
                "the consumer name contains {bad:?}; use ASCII letters, digits and `_ - . : /`"
            ),
        );
    } else {
        return Some(lit.clone());
    }
    None
}

/// Where diesel-inbox is without `crate = …`.
fn default_path() -> Path {
    parse_quote!(::diesel_inbox)
}

/// `::diesel_inbox`, or the name Cargo.toml gives the dependency where it renames it
/// (`inbox = { package = "diesel-inbox" }`), which needs no `crate = …` then.
fn default_crate(dependencies: Option<&Dependencies>) -> Path {
    // A name that is no identifier (a manifest the reader misread) keeps the default.
    let renamed = dependencies
        .and_then(Dependencies::diesel_inbox)
        .filter(|name| *name != "diesel_inbox")
        .and_then(|name| syn::parse_str::<Ident>(name).ok());
    match renamed {
        Some(name) => parse_quote!(::#name),
        None => default_path(),
    }
}

/// `crate = path`, or serde's and tokio's string form `crate = "path"`: where a renamed
/// dependency (`::inbox`) or a facade's re-export (`my_facade::inbox`) puts diesel-inbox.
fn crate_path(
    value: &Expr,
    dependencies: Option<&Dependencies>,
    errors: &mut Errors,
) -> Option<Path> {
    let message = "`crate` takes the path diesel-inbox is reachable at, such as \
                   `crate = ::inbox` for a renamed dependency or `crate = my_facade::inbox` \
                   for a re-export";
    let path = match ungroup_expr(value) {
        Expr::Path(path) if path.qself.is_none() && path.attrs.is_empty() => path.path.clone(),
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => match lit.parse::<Path>() {
            Ok(path) => path,
            Err(_) => {
                errors.spanned(lit, message);
                return None;
            }
        },
        other => {
            errors.spanned(other, message);
            return None;
        }
    };
    misspelt_dependency(&path, dependencies?, errors);
    Some(path)
}

/// `crate = ::inboxx` for the dependency `inbox`: reported once, at the name, rather
/// than at every path of the expansion. Only a name close to diesel-inbox's own is
/// taken for a typo: `::name` may also be an `extern crate … as name` of the crate's.
fn misspelt_dependency(path: &Path, dependencies: &Dependencies, errors: &mut Errors) {
    let (Some(_), Some(first), Some(dependency)) = (
        path.leading_colon,
        path.segments.first(),
        dependencies.diesel_inbox(),
    ) else {
        return;
    };
    let written = first.ident.to_string();
    if !dependencies.contains(&written) && edit_distance(&written, dependency) <= 2 {
        errors.spanned(
            &first.ident,
            format!(
                "no dependency named `{written}`: diesel-inbox is `{dependency}` in Cargo.toml; \
                 write `crate = ::{dependency}`"
            ),
        );
    }
}

/// The valid argument a misspelt one most likely meant, if any is close.
fn closest_argument(name: &str) -> Option<&'static str> {
    ARGUMENTS
        .into_iter()
        .min_by_key(|candidate| edit_distance(name, candidate))
        .filter(|candidate| edit_distance(name, candidate) <= candidate.len().div_ceil(2))
}

fn unknown_argument(name: &str, closest: Option<&str>) -> String {
    let valid = ARGUMENTS.map(|a| format!("`{a}`")).join(", ");
    match closest {
        Some(closest) => format!(
            "unknown argument `{name}`; did you mean `{closest}`? (expected one of {valid})"
        ),
        None => format!("unknown argument `{name}`; expected one of {valid}"),
    }
}

/// Levenshtein distance, for "did you mean" suggestions.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

/// `Pin<Box<dyn Future<…>>>`, the shape `#[async_trait]` gives its methods.
fn returns_boxed_future(output: &ReturnType) -> bool {
    let ReturnType::Type(_, ty) = output else {
        return false;
    };
    matches!(ungroup(ty), Type::Path(path)
        if path.path.segments.last().is_some_and(|last| last.ident == "Pin"))
}

/// `T` and `E` of the return type: as written in `Result<T, E>`, else, for an alias
/// named like one (`diesel::QueryResult<T>`, `anyhow::Result<T>`, `io::Result<T>`),
/// through the runtime's `HandlerResult`, which reports an alias that is no `Result` at
/// the return type. Other paths, such as `Option<T>`, are rejected here, where the
/// message can be precise.
fn result_types(output: &ReturnType, krate: &Path, errors: &mut Errors) -> Option<(Type, Type)> {
    let message = "`#[idempotent]` handlers return `Result<T, E>` with \
                   `E: From<diesel::result::Error>`, or an alias of it whose name ends in \
                   `Result`, such as `diesel::QueryResult<T>`";
    let ReturnType::Type(_, ty) = output else {
        errors.push(syn::Error::new(output.span(), message));
        return None;
    };
    let last = match ungroup(ty) {
        Type::Path(path) if path.qself.is_none() => path.path.segments.last(),
        _ => None,
    };
    let Some(last) = last.filter(|last| last.ident.to_string().ends_with("Result")) else {
        errors.spanned(ty, message);
        return None;
    };
    if let Some(written) = written_result(last) {
        return Some(written);
    }
    if let Some(opaque) = find_impl(ty.to_token_stream()) {
        errors.spanned(
            opaque,
            "`impl Trait` cannot be read through a `Result` alias; spell the return type \
             out, such as `Result<impl Display, anyhow::Error>`",
        );
        return None;
    }
    let krate = at(krate, ty.span());
    let project = |item: &str| -> Type {
        let item = Ident::new(item, ty.span());
        parse_quote_spanned!(ty.span()=> <#ty as #krate::__private::HandlerResult>::#item)
    };
    Some((project("Ok"), project("Err")))
}

/// The first `impl` keyword in `tokens`: the projection `<Alias<impl Trait> as …>::Ok`
/// would be an `impl Trait` in a path, which rustc rejects without a word about why.
fn find_impl(tokens: TokenStream) -> Option<Ident> {
    tokens.into_iter().find_map(|token| match token {
        TokenTree::Ident(ident) if ident == "impl" => Some(ident),
        TokenTree::Group(group) => find_impl(group.stream()),
        _ => None,
    })
}

/// `T` and `E` of `Result<T, E>` as written.
fn written_result(last: &PathSegment) -> Option<(Type, Type)> {
    let PathArguments::AngleBracketed(generics) = &last.arguments else {
        return None;
    };
    let mut types = generics.args.iter().filter_map(|arg| match arg {
        GenericArgument::Type(ty) => Some(ty.clone()),
        _ => None,
    });
    match (
        last.ident == "Result",
        types.next(),
        types.next(),
        types.next(),
    ) {
        (true, Some(ok), Some(err), None) => Some((ok, err)),
        _ => None,
    }
}

/// The parameter named by `conn = …`, else the one named `conn`, else the only `&mut`
/// parameter. A `&mut` parameter under `#[cfg]` exists only in some builds, so it is not
/// a candidate next to one that exists in all of them.
fn connection_parameter(
    named: Option<Ident>,
    messages: Option<&Ident>,
    function: &ItemFn,
    errors: &mut Errors,
) -> Option<Ident> {
    let typed = || {
        function.sig.inputs.iter().filter_map(|input| match input {
            FnArg::Typed(typed) => match typed.pat.as_ref() {
                Pat::Ident(pat) => Some((&pat.ident, typed)),
                _ => None,
            },
            FnArg::Receiver(_) => None,
        })
    };
    if let Some(named) = named {
        // The signature's own identifier: `conn = $c` from a `macro_rules!` caller
        // carries the caller's hygiene, while the body names the parameter as the
        // signature does.
        if let Some((ident, _)) = typed().find(|(ident, _)| **ident == named) {
            return Some(ident.clone());
        }
        errors.spanned(&named, not_a_parameter("conn", &named, function));
        return None;
    }
    if let Some((ident, _)) = typed().find(|(ident, _)| *ident == "conn") {
        return Some(ident.clone());
    }
    let mutable: Vec<(&Ident, bool)> = typed()
        // The batch's messages may be a `&mut [M]`: never the connection.
        .filter(|(ident, _)| messages != Some(*ident))
        .filter(|(_, typed)| {
            matches!(ungroup(&typed.ty), Type::Reference(reference) if reference.mutability.is_some())
        })
        .map(|(ident, typed)| {
            let cfg = typed.attrs.iter().any(|attr| attr.path().is_ident("cfg"));
            (ident, cfg)
        })
        .collect();
    let unconditional: Vec<&Ident> = mutable
        .iter()
        .filter(|(_, cfg)| !cfg)
        .map(|(ident, _)| *ident)
        .collect();
    let candidates = if unconditional.is_empty() {
        mutable.iter().map(|(ident, _)| *ident).collect()
    } else {
        unconditional
    };
    match candidates.as_slice() {
        [] => {
            errors.spanned(
                &function.sig.inputs,
                "no connection parameter: name it `conn`, or pass `conn = <parameter>`",
            );
            None
        }
        // One name, under a `#[cfg]` each: the connection of each build.
        [first, rest @ ..] if rest.iter().all(|ident| ident == first) => Some((*first).clone()),
        several => {
            let names = several
                .iter()
                .map(|i| format!("`{i}`"))
                .collect::<Vec<_>>()
                .join(", ");
            errors.spanned(
                &function.sig.inputs,
                format!("several `&mut` parameters ({names}) could be the connection; pick one with `conn = <parameter>`"),
            );
            None
        }
    }
}

/// The body runs on the transaction's reborrow of the connection, which is shorter than
/// the lifetime the parameter declares: a body naming that lifetime for the connection
/// fails with "lifetime may not live long enough" at tokens the user did not write.
fn connection_lifetime_unnamed(conn: &Ident, function: &ItemFn, errors: &mut Errors) {
    let lifetime = function.sig.inputs.iter().find_map(|input| match input {
        FnArg::Typed(typed) => match (typed.pat.as_ref(), ungroup(&typed.ty)) {
            (Pat::Ident(pat), Type::Reference(reference)) if pat.ident == *conn => {
                reference.lifetime.clone()
            }
            _ => None,
        },
        FnArg::Receiver(_) => None,
    });
    let Some(lifetime) = lifetime.filter(|l| l.ident != "_" && l.ident != "static") else {
        return;
    };
    if let Some(named) = find_lifetime(function.block.to_token_stream(), &lifetime.ident) {
        errors.spanned(
            named,
            format!(
                "the body cannot name `{lifetime}`: it runs on the transaction's borrow of \
                 `{conn}`, which is shorter than `{lifetime}`; write `'_` or leave the \
                 lifetime out"
            ),
        );
    }
}

/// A connection taken by value is reported at its type, which the expansion names; an
/// `impl Trait` there cannot be named, so it is reported here.
fn connection_not_opaque(conn: &Ident, function: &ItemFn, errors: &mut Errors) {
    let by_value = function.sig.inputs.iter().find_map(|input| match input {
        FnArg::Typed(typed) => match (typed.pat.as_ref(), ungroup(&typed.ty)) {
            (Pat::Ident(pat), Type::Reference(reference))
                if pat.ident == *conn && reference.mutability.is_some() =>
            {
                None
            }
            (Pat::Ident(pat), ty) if pat.ident == *conn => Some(ty),
            _ => None,
        },
        FnArg::Receiver(_) => None,
    });
    if let Some(ty) = by_value.filter(|ty| find_impl(ty.to_token_stream()).is_some()) {
        errors.spanned(
            ty,
            "the connection parameter of an `#[idempotent]` handler must be a `&mut` borrow: \
             write `&mut impl …`",
        );
    }
}

/// The first `'name` in `tokens`, as its two tokens.
fn find_lifetime(tokens: TokenStream, name: &Ident) -> Option<TokenStream> {
    let mut previous: Option<Punct> = None;
    for token in tokens {
        match token {
            TokenTree::Ident(ident) if ident == *name => {
                if let Some(quote) = previous.take() {
                    return Some(TokenStream::from_iter([
                        TokenTree::Punct(quote),
                        TokenTree::Ident(ident),
                    ]));
                }
            }
            TokenTree::Punct(punct) if punct.as_char() == '\'' => previous = Some(punct),
            TokenTree::Group(group) => {
                if let Some(found) = find_lifetime(group.stream(), name) {
                    return Some(found);
                }
                previous = None;
            }
            _ => previous = None,
        }
    }
    None
}

/// `expr` without the invisible groups that `macro_rules!` fragments (`$c:literal`,
/// `$c:expr`) arrive in.
fn ungroup_expr(mut expr: &Expr) -> &Expr {
    while let Expr::Group(group) = expr {
        expr = &group.expr;
    }
    expr
}

#[cfg(test)]
mod tests {
    use super::edit_distance;

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("consumer", "consumer"), 0);
        assert_eq!(edit_distance("consumr", "consumer"), 1);
        assert_eq!(edit_distance("kye", "key"), 2);
        assert_eq!(edit_distance("", "conn"), 4);
    }
}
