//! The parser of `#[idem::contract(..)]`, shared by the macro and the `idem` command.
//!
//! parse → model → check: the arguments are read into one set-once slot per property,
//! recording every error and going on (only broken syntax between properties stops it);
//! then the missing properties are reported together; then, if all nine values are
//! valid, the model is built and [`crate::check()`](fn@crate::check) runs. Every error carries the span of
//! the tokens to blame, so the macro and the command report the same problems at the same
//! places.
//!
//! ```
//! use idem_contract::parse::parse;
//! use quote::quote;
//!
//! let args = quote!(key_scope = client, ttl = "10s", deadline = "30s", retryble = [503]);
//! let item: syn::Item = syn::parse_quote!(async fn create_order() {});
//! let parsed = parse(args, proc_macro2::Span::call_site(), Some(&item));
//! let messages: Vec<String> = parsed.errors.iter().map(ToString::to_string).collect();
//! assert!(messages[0].contains("did you mean `retryable`"));
//! assert!(messages[1].starts_with("the contract is missing 5 properties"));
//! assert!(parsed.contract.is_none());
//! ```

mod item;
mod slot;
mod value;

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::parse::{ParseStream, Parser};
use syn::{Ident, Token};

pub use item::{Handler, is_attempt, is_body, is_journal, is_passed_in};
use slot::Slots;
use value::Value;

use crate::{Contract, Fingerprint, KeySource, Location, Property, Recovery, check};

/// A field of the request body as written in the attribute: `amount`, `customer.id`.
#[derive(Clone, Debug)]
pub struct FieldRef {
    /// The identifiers, outermost first, with the user's spans.
    pub segments: Vec<Ident>,
}

impl ToTokens for FieldRef {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        let segments = &self.segments;
        tokens.extend(quote::quote!(#(#segments).*));
    }
}

/// The result of reading one attribute: the contract if it is complete and valid, what
/// the compiler must check itself, and every error.
#[derive(Debug)]
pub struct Parsed {
    /// The contract; `Some` exactly when `errors` is empty.
    pub contract: Option<Contract>,
    /// The handler, when the attribute is on an async function.
    pub handler: Option<Handler>,
    /// The fingerprint fields, for the compiler's check against the body type.
    pub fingerprint_fields: Vec<FieldRef>,
    /// The significant query parameters, for the compiler's check against the
    /// `Query<T>` type.
    pub fingerprint_query: Vec<FieldRef>,
    /// The body field that carries the key, for the compiler's check.
    pub key_field: Option<FieldRef>,
    /// The status lookup handler's path, for the compiler's check.
    pub status_lookup: Option<syn::Path>,
    /// The reconcile function's path, for the compiler's check.
    pub recovery: Option<syn::Path>,
    /// Every problem, in a stable order: the item, the arguments in order, the missing
    /// properties, then the rules of [`crate::check()`](fn@crate::check).
    pub errors: Vec<syn::Error>,
}

/// Collects errors; nothing stops at the first one.
#[derive(Default)]
pub(crate) struct Ctxt {
    errors: Vec<syn::Error>,
}

impl Ctxt {
    fn error(&mut self, span: Span, message: impl std::fmt::Display) {
        self.errors.push(syn::Error::new(span, message));
    }

    fn error_spanned(&mut self, tokens: &impl ToTokens, message: impl std::fmt::Display) {
        self.errors.push(syn::Error::new_spanned(tokens, message));
    }

    fn syn_error(&mut self, error: syn::Error) {
        self.errors.push(error);
    }
}

/// Reads the arguments of `#[idem::contract(..)]` on `item`.
///
/// `args` are the tokens inside the parentheses; `attr_span` is where the attribute is
/// (missing properties are reported there); `item` is what the attribute is on, if it
/// parsed as an item.
pub fn parse(args: TokenStream, attr_span: Span, item: Option<&syn::Item>) -> Parsed {
    let mut cx = Ctxt::default();
    let handler = item.and_then(|item| item::handler(&mut cx, item));
    let mut parsed = Parsed {
        contract: None,
        handler,
        fingerprint_fields: Vec::new(),
        fingerprint_query: Vec::new(),
        key_field: None,
        status_lookup: None,
        recovery: None,
        errors: Vec::new(),
    };
    let mut slots = Slots::default();
    let mut extras = Extras::default();
    let mut suggested = Vec::new();

    let entries = match split(args) {
        Ok(entries) => entries,
        Err(e) => {
            cx.syn_error(e);
            parsed.errors = cx.errors;
            return parsed;
        }
    };
    for (key, value) in entries {
        let name = syn::ext::IdentExt::unraw(&key).to_string();
        let Some(property) = Property::from_key(&name) else {
            if let Some((owner, write)) = Property::ALL.into_iter().find_map(|p| {
                p.options()
                    .iter()
                    .find(|(option, _)| *option == name)
                    .map(|(_, write)| (p, write))
            }) {
                cx.error_spanned(
                    &key,
                    format!("`{name}` is an option of `{owner}`, not a property: write `{write}`"),
                );
                continue;
            }
            let keys: Vec<&str> = Property::ALL.iter().map(|p| p.key()).collect();
            let suggestion = suggest(&name, &keys);
            if let Some(s) = suggestion {
                suggested.push(s);
            }
            let did_you_mean = suggestion
                .map(|s| format!("did you mean `{s}`? "))
                .unwrap_or_default();
            cx.error_spanned(
                &key,
                format!(
                    "unknown contract property `{name}`: {did_you_mean}the nine properties are {}",
                    backticked(&keys, "and")
                ),
            );
            continue;
        };
        if value.is_empty() {
            cx.error_spanned(
                &key,
                format!("`{property}` has no value: write `{}`", property.example()),
            );
            slots[property].set(&mut cx, property, key, None);
            continue;
        }
        let v = Value::parse(property, &mut cx, &value, &mut parsed, &mut extras);
        slots[property].set(&mut cx, property, key, v.map(|v| (v, value)));
    }

    report_missing(&mut cx, &slots, attr_span, &suggested);
    check_body_needed(&mut cx, &slots, &parsed);
    check_journal(&mut cx, &slots, &parsed);
    // The rules run even when some properties are missing or refused: each violation that
    // reads only valid values is reported, so one compile shows every problem.
    let (contract, complete) = build(&slots, &parsed);
    for violation in check(&contract) {
        let readable = violation.involves.iter().all(|p| slots[*p].get().is_some());
        if !readable || (violation.at == Location::Operation && parsed.handler.is_none()) {
            continue;
        }
        let tokens = locate(&slots, &extras, &parsed, violation.at);
        cx.errors
            .push(syn::Error::new_spanned(tokens, violation.message));
    }
    parsed.errors = cx.errors;
    if parsed.errors.is_empty() && complete {
        parsed.contract = Some(contract);
    }
    parsed
}

/// Tokens kept for errors that point inside a value.
#[derive(Default)]
struct Extras {
    per_attempt: Option<TokenStream>,
    retryable: Vec<TokenStream>,
}

/// Splits `key = value, key = value,` into pairs. Only broken syntax between properties
/// (a missing `=` or `,`) stops here; values are read later, one by one.
fn split(args: TokenStream) -> syn::Result<Vec<(Ident, TokenStream)>> {
    let parser = |input: ParseStream| {
        let mut entries = Vec::new();
        while !input.is_empty() {
            let key: Ident = input.call(syn::ext::IdentExt::parse_any).map_err(|e| {
                syn::Error::new(
                    e.span(),
                    "expected a contract property such as `ttl = \"24h\"`",
                )
            })?;
            if !input.peek(Token![=]) {
                let name = syn::ext::IdentExt::unraw(&key).to_string();
                let example = Property::from_key(&name)
                    .map(Property::example)
                    .unwrap_or("ttl = \"24h\"");
                return Err(syn::Error::new(
                    key.span(),
                    format!("expected `=` after `{name}`: write `{example}`"),
                ));
            }
            input.parse::<Token![=]>()?;
            let mut value = TokenStream::new();
            while !input.is_empty() && !input.peek(Token![,]) {
                value.extend([input.parse::<TokenTree>()?]);
            }
            entries.push((key, value));
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
        Ok(entries)
    };
    parser.parse2(args)
}

/// One error for all missing properties, at the attribute, each with what it answers. A
/// property that an unknown key was taken for ("did you mean `retryable`?") is not listed
/// again: that error already says what to write.
fn report_missing(cx: &mut Ctxt, slots: &Slots, attr_span: Span, suggested: &[&str]) {
    let missing: Vec<Property> = Property::ALL
        .into_iter()
        .filter(|p| slots[*p].is_empty())
        .collect();
    let listed: Vec<Property> = missing
        .iter()
        .copied()
        .filter(|p| !suggested.contains(&p.key()))
        .collect();
    if listed.is_empty() {
        return;
    }
    let mut message = if missing.len() == Property::ALL.len() {
        "a contract declares all nine properties, and this one has none; add them:".to_owned()
    } else if listed.len() == 1 {
        "the contract is missing 1 property:".to_owned()
    } else {
        format!("the contract is missing {} properties:", listed.len())
    };
    for p in &listed {
        message.push_str(&format!(
            "\n  `{}`: {} (such as `{}`)",
            p.key(),
            p.answers(),
            p.example()
        ));
    }
    cx.error(attr_span, message);
}

/// The step journal and `recovery = resume` go together: a handler that takes the
/// journal is resumed after a crash (its steps replayed or re-sent under the same
/// downstream keys), and resuming is safe only for a handler whose foreign calls go
/// through it.
fn check_journal(cx: &mut Ctxt, slots: &Slots, parsed: &Parsed) {
    let Some(handler) = &parsed.handler else {
        return;
    };
    let name = &handler.ident;
    let recovery = slots[Property::Recovery].get();
    let resume = matches!(recovery, Some((Value::Recovery(Recovery::Resume), _)));
    match (&handler.journal, recovery) {
        (Some(journal), Some((Value::Recovery(_), _))) if !resume => cx.error_spanned(
            journal,
            format!("`{name}` takes the step journal, so it is resumed after a crash: declare `recovery = resume` (a reconcile function or a runbook would decide for the journal's steps without it)"),
        ),
        (None, Some((_, tokens))) if resume => cx.error_spanned(
            tokens,
            format!("`recovery = resume` runs `{name}` again after a crash, which is safe only for calls made through the step journal: take `mut journal: idem::Journal` as an argument and run each call to another system through `journal.step(..)`"),
        ),
        _ => {}
    }
}

/// Fingerprint fields and a body key are members of the body, so the handler must take
/// one (`Json<T>` or `Form<T>`): that is the type the compiler checks them against.
fn check_body_needed(cx: &mut Ctxt, slots: &Slots, parsed: &Parsed) {
    let Some(handler) = &parsed.handler else {
        return;
    };
    let name = &handler.ident;
    if handler.query.is_none()
        && let Some(first) = parsed.fingerprint_query.first()
    {
        cx.error_spanned(
            first,
            format!("`query = [..]` names significant query parameters, but `{name}` takes no `Query<T>` argument (written with that name): add one, so that the compiler checks the names against `T`"),
        );
    }
    if handler.body.is_some() || handler.body_extractor.is_some() {
        return;
    }
    if let Some((Value::Fingerprint(Fingerprint::Fields(_)), tokens)) =
        slots[Property::Fingerprint].get()
    {
        cx.error_spanned(
            tokens,
            format!("fingerprint fields are members of the request body, but `{name}` takes no `Json<T>` or `Form<T>` argument: add one as its last argument, or write `fingerprint = body`"),
        );
    }
    if let Some((Value::KeyScope(scope), tokens)) = slots[Property::KeyScope].get()
        && matches!(scope.source, KeySource::Body { .. })
    {
        cx.error_spanned(
            tokens,
            format!("`body = ..` reads the key from the request body, but `{name}` takes no `Json<T>` or `Form<T>` argument: add one as its last argument, or read the key from a header"),
        );
    }
}

/// The model, and whether it is complete: every property has a valid value and the
/// attribute is on a handler. What is missing is taken from [`Contract::PLACEHOLDER`].
fn build(slots: &Slots, parsed: &Parsed) -> (Contract, bool) {
    let mut contract = Contract::PLACEHOLDER;
    let mut complete = true;
    for property in Property::ALL {
        match slots[property].get() {
            Some((value, _)) => value.clone().apply(&mut contract),
            None => complete = false,
        }
    }
    match &parsed.handler {
        Some(h) => contract.operation = syn::ext::IdentExt::unraw(&h.ident).to_string().into(),
        None => complete = false,
    }
    contract.fingerprint_query = parsed
        .fingerprint_query
        .iter()
        .map(FieldRef::path)
        .collect::<Vec<_>>()
        .into();
    (contract, complete)
}

/// The tokens a violation points at: the narrowest ones known.
fn locate(slots: &Slots, extras: &Extras, parsed: &Parsed, at: Location) -> TokenStream {
    let property_tokens = |p: Property| -> TokenStream {
        slots[p]
            .get()
            .map(|(_, tokens)| tokens.clone())
            .unwrap_or_default()
    };
    match at {
        Location::Property(p) => property_tokens(p),
        Location::Retryable(i) => extras
            .retryable
            .get(i)
            .cloned()
            .unwrap_or_else(|| property_tokens(Property::Retryable)),
        Location::FingerprintField(i) => parsed
            .fingerprint_fields
            .get(i)
            .map(ToTokens::to_token_stream)
            .unwrap_or_else(|| property_tokens(Property::Fingerprint)),
        Location::PerAttempt => extras
            .per_attempt
            .clone()
            .unwrap_or_else(|| property_tokens(Property::Deadline)),
        Location::Operation => parsed
            .handler
            .as_ref()
            .map(|h| h.ident.to_token_stream())
            .unwrap_or_default(),
    }
}

/// The closest of `candidates` to `word`, for "did you mean": a small edit distance, or a
/// common other name for a property.
pub(crate) fn suggest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    const OTHER_NAMES: [(&str, &str); 14] = [
        ("key", "key_scope"),
        ("idempotency_key", "key_scope"),
        ("scope", "key_scope"),
        ("fields", "fingerprint"),
        ("fingerprint_fields", "fingerprint"),
        ("expiry", "ttl"),
        ("expires", "ttl"),
        ("timeout", "deadline"),
        ("attempts", "max_attempts"),
        ("retries", "max_attempts"),
        ("retry_on", "retryable"),
        ("on_conflict", "concurrency"),
        ("lookup", "status_lookup"),
        ("reconcile", "recovery"),
    ];
    if let Some((_, to)) = OTHER_NAMES.iter().find(|(from, _)| *from == word)
        && let Some(c) = candidates.iter().find(|c| *c == to)
    {
        return Some(c);
    }
    candidates
        .iter()
        .map(|c| (strsim::damerau_levenshtein(word, c), *c))
        .filter(|(distance, c)| *distance <= 2.max(c.len() / 4))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, c)| c)
}

/// `` `a`, `b` and `c` ``
pub(crate) fn backticked(words: &[&str], last: &str) -> String {
    match words {
        [] => String::new(),
        [one] => format!("`{one}`"),
        [init @ .., tail] => {
            let init: Vec<String> = init.iter().map(|w| format!("`{w}`")).collect();
            format!("{} {last} `{tail}`", init.join(", "))
        }
    }
}
