//! What the attribute is on: an async handler function, and the types the contract's
//! checks need from its arguments.

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{FnArg, GenericArgument, Ident, Item, PatType, PathArguments, Type};

use super::Ctxt;

/// The handler function the contract is on.
#[derive(Clone, Debug)]
pub struct Handler {
    /// The function's name; also the operation's name.
    pub ident: Ident,
    /// `T` of the first argument typed `Json<T>` or `Form<T>`: the body type that
    /// fingerprint fields and a body key are checked against.
    pub body: Option<Type>,
    /// `T` of the first argument typed `State<T>`: what a reconcile function receives.
    pub state: Option<Type>,
    /// `T` of the first argument typed `Query<T>`: the type that significant query
    /// parameters are checked against.
    pub query: Option<Type>,
    /// When no argument is written `Json<T>` or `Form<T>`: the last argument, when it may be
    /// one of them under another name (`use axum::Json as J;` and `J<CreateOrder>`). The
    /// compiler then finds the body type through the extractor (the macro's
    /// `RequestBody` trait) and says so when the extractor is not a body.
    pub body_extractor: Option<Type>,
    /// The type of the argument that takes the step journal (`idem::Journal`), if any:
    /// where a contract without `recovery = resume` is reported.
    pub journal: Option<Type>,
}

/// Whether `ty` is `idem::Attempt` (written `Attempt`, `idem::Attempt` or through a
/// renamed crate): the argument the macro passes in rather than axum extracts.
pub fn is_attempt(ty: &Type) -> bool {
    last_segment_is(ty, "Attempt")
}

/// Whether `ty` is `idem::Journal` (written `Journal`, `idem::Journal` or through a
/// renamed crate): the step journal, which the macro passes in rather than axum extracts.
pub fn is_journal(ty: &Type) -> bool {
    last_segment_is(ty, "Journal")
}

/// Whether the macro passes `ty` in rather than axum extracts it: the
/// [`is_attempt`] and the [`is_journal`].
pub fn is_passed_in(ty: &Type) -> bool {
    is_attempt(ty) || is_journal(ty)
}

/// Whether `ty` is a path without a qualified self whose last segment is `name`, with no
/// generic arguments.
fn last_segment_is(ty: &Type, name: &str) -> bool {
    let Type::Path(path) = ty else {
        return false;
    };
    path.qself.is_none()
        && path
            .path
            .segments
            .last()
            .is_some_and(|last| last.ident == name && last.arguments.is_none())
}

/// Whether `ty` is written as a request body extractor the attribute knows, `Json<T>` or
/// `Form<T>` (under any path): the argument axum must read last.
pub fn is_body(ty: &Type) -> bool {
    wrapped(ty, "Json")
        .or_else(|| wrapped(ty, "Form"))
        .is_some()
}

/// Extractors that are never the request body, by the names axum and idem give them.
const NOT_A_BODY: &[&str] = &[
    "State",
    "Path",
    "Query",
    "Extension",
    "Lookup",
    "Tx",
    "SqliteTx",
    "PgTx",
    "Attempt",
    "HeaderMap",
    "Method",
    "Uri",
    "Version",
    "OriginalUri",
    "MatchedPath",
    "RawQuery",
    "RawPathParams",
    "ConnectInfo",
    "Option",
    "Result",
];

/// The last argument of a handler that has no argument named `Json<T>` or `Form<T>`, when
/// it is a path type with one generic argument that is not a known non-body extractor.
fn body_extractor<'a>(types: impl DoubleEndedIterator<Item = &'a Type>) -> Option<Type> {
    let mut types = types;
    let ty = types.rfind(|ty| !is_passed_in(ty))?;
    let Type::Path(path) = ty else { return None };
    let last = path.path.segments.last()?;
    if NOT_A_BODY.iter().any(|name| last.ident == name) {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    matches!(
        args.args.iter().collect::<Vec<_>>().as_slice(),
        [GenericArgument::Type(_)]
    )
    .then(|| ty.clone())
}

/// The single generic argument of a type whose last path segment is `name`:
/// `Json<T>`, `axum::Json<T>`, `axum::extract::State<T>`.
fn wrapped<'a>(ty: &'a Type, name: &str) -> Option<&'a Type> {
    let Type::Path(path) = ty else { return None };
    let last = path.path.segments.last()?;
    if last.ident != name {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.iter().collect::<Vec<_>>().as_slice() {
        [GenericArgument::Type(inner)] => Some(inner),
        _ => None,
    }
}

/// Checks that `item` is an async function without a receiver (a contract on anything else
/// is refused), and reads its argument types.
pub(super) fn handler(cx: &mut Ctxt, item: &Item) -> Option<Handler> {
    let func = match item {
        Item::Fn(func) => func,
        other => {
            let (tokens, what) = describe(other);
            cx.error_spanned(
                &tokens,
                format!(
                    "`#[idem::contract]` goes on an async axum handler function, not on {what}"
                ),
            );
            return None;
        }
    };
    let sig = &func.sig;
    let ident = sig.ident.clone();
    let mut ok = true;
    if sig.asyncness.is_none() {
        cx.error_spanned(
            &sig.fn_token,
            format!("`#[idem::contract]` goes on an async axum handler, and `{ident}` is not `async`: write `async fn {ident}`"),
        );
        ok = false;
    }
    for input in &sig.inputs {
        if let FnArg::Receiver(receiver) = input {
            cx.error_spanned(
                receiver,
                "a contracted handler is a free function that axum calls with extractors; it cannot take `self`",
            );
            ok = false;
        }
    }
    check_body_last(cx, sig);
    let types = sig.inputs.iter().filter_map(|input| match input {
        FnArg::Typed(pat) => Some(&*pat.ty),
        FnArg::Receiver(_) => None,
    });
    let mut body = None;
    let mut state = None;
    let mut query = None;
    for ty in types.clone() {
        if query.is_none() {
            query = wrapped(ty, "Query").cloned();
        }
        if body.is_none() {
            body = wrapped(ty, "Json").or_else(|| wrapped(ty, "Form")).cloned();
        }
        if state.is_none() {
            state = wrapped(ty, "State").cloned();
        }
    }
    let journal = types.clone().find(|ty| is_journal(ty)).cloned();
    let body_extractor = if body.is_none() {
        body_extractor(types)
    } else {
        None
    };
    ok.then_some(Handler {
        ident,
        body,
        state,
        query,
        body_extractor,
        journal,
    })
}

/// The request body extractor comes last: axum reads the body with the last argument and
/// every other one from the request's head, and says only that the function is not a
/// `Handler`. One error at each argument after the body (`idem::Attempt` may come
/// anywhere: the macro passes it in). A second body is left to axum.
fn check_body_last(cx: &mut Ctxt, sig: &syn::Signature) {
    let args: Vec<&PatType> = sig
        .inputs
        .iter()
        .filter_map(|input| match input {
            FnArg::Typed(pat) => Some(pat),
            FnArg::Receiver(_) => None,
        })
        .collect();
    let Some(at) = args.iter().position(|arg| is_body(&arg.ty)) else {
        return;
    };
    let body = written(&args[at].pat);
    for arg in &args[at + 1..] {
        if is_passed_in(&arg.ty) || is_body(&arg.ty) {
            continue;
        }
        cx.error_spanned(
            arg,
            format!(
                "the request body extractor must be the last argument: move `{}` before `{body}`",
                written(arg)
            ),
        );
    }
}

/// `tokens` as a person writes them, `tx: idem::PgTx` and `Json(body)`, rather than with
/// a space between every two tokens as `TokenStream`'s `Display` puts them.
fn written(tokens: &impl ToTokens) -> String {
    let mut out = String::new();
    write_tokens(&mut out, tokens.to_token_stream());
    out.trim_end().to_owned()
}

/// Appends `tokens` to `out`: a space between two words and after `,` or a lone `:`,
/// around `=` and `+`, and none elsewhere.
fn write_tokens(out: &mut String, tokens: TokenStream) {
    let mut after_word = false;
    for token in tokens {
        let word = matches!(token, TokenTree::Ident(_) | TokenTree::Literal(_));
        match token {
            TokenTree::Ident(_) | TokenTree::Literal(_) => {
                if after_word {
                    out.push(' ');
                }
                out.push_str(&token.to_string());
            }
            TokenTree::Group(group) => {
                let (open, close) = match group.delimiter() {
                    Delimiter::Parenthesis => ("(", ")"),
                    Delimiter::Bracket => ("[", "]"),
                    Delimiter::Brace => ("{ ", " }"),
                    Delimiter::None => ("", ""),
                };
                out.push_str(open);
                write_tokens(out, group.stream());
                out.truncate(out.trim_end().len());
                out.push_str(close);
            }
            TokenTree::Punct(punct) => match punct.as_char() {
                ',' | ';' => out.extend([punct.as_char(), ' ']),
                ':' if punct.spacing() == Spacing::Joint || out.ends_with(':') => out.push(':'),
                ':' => out.push_str(": "),
                c @ ('=' | '+') => out.extend([' ', c, ' ']),
                c => out.push(c),
            },
        }
        after_word = word;
    }
}

/// The tokens to blame and a name for an item that is not a function.
fn describe(item: &Item) -> (proc_macro2::TokenStream, &'static str) {
    match item {
        Item::Struct(i) => (i.struct_token.into_token_stream(), "a struct"),
        Item::Enum(i) => (i.enum_token.into_token_stream(), "an enum"),
        Item::Union(i) => (i.union_token.into_token_stream(), "a union"),
        Item::Trait(i) => (i.trait_token.into_token_stream(), "a trait"),
        Item::Impl(i) => (i.impl_token.into_token_stream(), "an impl block"),
        Item::Mod(i) => (i.mod_token.into_token_stream(), "a module"),
        Item::Const(i) => (i.const_token.into_token_stream(), "a constant"),
        Item::Static(i) => (i.static_token.into_token_stream(), "a static"),
        Item::Type(i) => (i.type_token.into_token_stream(), "a type alias"),
        Item::Use(i) => (i.use_token.into_token_stream(), "a `use` declaration"),
        other => (quote::quote_spanned!(other.span()=> item), "this item"),
    }
}
