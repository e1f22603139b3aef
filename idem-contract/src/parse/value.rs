//! Parsers for the value of each property. Each one records its errors and goes on; only
//! a value that parsed completely is returned.

use std::borrow::Cow;

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::parse::{ParseStream, Parser};
use syn::{Ident, LitInt, LitStr, Token, bracketed, parenthesized};

use super::{Ctxt, Extras, FieldRef, Parsed};
use crate::{
    Concurrency, Contract, DEFAULT_CONFLICT_RETRY_AFTER, Deadline, Duration, DurationError,
    FieldPath, Fingerprint, KeyFormat, KeyScope, KeySource, Namespace, Property, Recovery,
    Retryable, StatusCode, StatusLookup, TransportFailure, duration::ACCEPTED_FORMS,
};

/// The valid value of one property, of its type in the model.
#[derive(Clone)]
pub(super) enum Value {
    KeyScope(KeyScope),
    Fingerprint(Fingerprint),
    Ttl(Duration),
    Deadline(Deadline),
    MaxAttempts(u32),
    Retryable(Vec<Retryable>),
    Concurrency(Concurrency),
    StatusLookup(StatusLookup),
    Recovery(Recovery),
}

impl Value {
    /// Reads the value of `property`, the one place that knows how each property parses.
    /// What a value names for the compiler's checks goes into `parsed`, and the tokens
    /// that errors point at inside it into `extras`.
    pub(super) fn parse(
        property: Property,
        cx: &mut Ctxt,
        tokens: &TokenStream,
        parsed: &mut Parsed,
        extras: &mut Extras,
    ) -> Option<Value> {
        Some(match property {
            Property::KeyScope => {
                let (scope, field) = key_scope(cx, tokens)?;
                parsed.key_field = field;
                Value::KeyScope(scope)
            }
            Property::Fingerprint => {
                let (fingerprint, fields, query) = fingerprint(cx, tokens)?;
                parsed.fingerprint_fields = fields;
                parsed.fingerprint_query = query;
                Value::Fingerprint(fingerprint)
            }
            Property::Ttl => Value::Ttl(ttl(cx, tokens)?),
            Property::Deadline => {
                let (deadline, per_attempt) = deadline(cx, tokens)?;
                extras.per_attempt = per_attempt;
                Value::Deadline(deadline)
            }
            Property::MaxAttempts => Value::MaxAttempts(max_attempts(cx, tokens)?),
            Property::Retryable => {
                let (list, items) = retryable(cx, tokens)?;
                extras.retryable = items;
                Value::Retryable(list)
            }
            Property::Concurrency => Value::Concurrency(concurrency(cx, tokens)?),
            Property::StatusLookup => {
                let (lookup, path) = status_lookup(cx, tokens)?;
                parsed.status_lookup = Some(path);
                Value::StatusLookup(lookup)
            }
            Property::Recovery => {
                let (recovery, path) = recovery(cx, tokens)?;
                parsed.recovery = path;
                Value::Recovery(recovery)
            }
        })
    }

    /// Puts the value into its field of `contract`.
    pub(super) fn apply(self, contract: &mut Contract) {
        match self {
            Value::KeyScope(v) => contract.key_scope = v,
            Value::Fingerprint(v) => contract.fingerprint = v,
            Value::Ttl(v) => contract.ttl = v,
            Value::Deadline(v) => contract.deadline = v,
            Value::MaxAttempts(v) => contract.max_attempts = v,
            Value::Retryable(v) => contract.retryable = v.into(),
            Value::Concurrency(v) => contract.concurrency = v,
            Value::StatusLookup(v) => contract.status_lookup = v,
            Value::Recovery(v) => contract.recovery = v,
        }
    }
}

/// Runs `parser` over the whole value; a syntax error is recorded at its own span.
fn run<T>(
    cx: &mut Ctxt,
    value: &TokenStream,
    parser: impl FnOnce(ParseStream) -> syn::Result<T>,
) -> Option<T> {
    match parser.parse2(value.clone()) {
        Ok(v) => Some(v),
        Err(e) => {
            cx.syn_error(e);
            None
        }
    }
}

fn expect_end(input: ParseStream, property: Property) -> syn::Result<()> {
    if input.is_empty() {
        Ok(())
    } else {
        Err(input.error(format!(
            "unexpected tokens after the value of `{property}`; separate properties with `,`"
        )))
    }
}

/// A quoted duration. The message names the property and the accepted forms.
fn duration_lit(input: ParseStream, what: &str) -> syn::Result<(Duration, LitStr)> {
    let lit: LitStr = input.parse().map_err(|e| {
        syn::Error::new(
            e.span(),
            format!("{what} is a duration in quotes, such as `\"30s\"`: a whole number and a unit (`ms`, `s`, `m`, `h` or `d`)"),
        )
    })?;
    let duration = lit.value().parse::<Duration>().map_err(|err| {
        let message = match err {
            DurationError::Zero => format!("{what} cannot be zero: write {ACCEPTED_FORMS}"),
            other => other.to_string(),
        };
        syn::Error::new(lit.span(), message)
    })?;
    Ok((duration, lit))
}

/// `ttl = "24h"`
fn ttl(cx: &mut Ctxt, value: &TokenStream) -> Option<Duration> {
    run(cx, value, |input| {
        let (d, _) = duration_lit(input, "`ttl`")?;
        expect_end(input, Property::Ttl)?;
        Ok(d)
    })
}

/// `deadline = "30s"` or `deadline = ("30s", per_attempt = "5s")`; also returns the
/// tokens of the per-attempt timeout, for errors.
fn deadline(cx: &mut Ctxt, value: &TokenStream) -> Option<(Deadline, Option<TokenStream>)> {
    run(cx, value, |input| {
        let parsed = if input.peek(syn::token::Paren) {
            let inner;
            parenthesized!(inner in input);
            let (total, _) = duration_lit(&inner, "`deadline`")?;
            let mut per_attempt = None;
            if !inner.is_empty() {
                inner.parse::<Token![,]>()?;
                let key: Ident = inner.parse()?;
                if key != "per_attempt" {
                    return Err(syn::Error::new(
                        key.span(),
                        format!(
                            "unknown deadline option `{key}`: write `deadline = (\"30s\", per_attempt = \"5s\")`"
                        ),
                    ));
                }
                inner.parse::<Token![=]>()?;
                let (d, lit) = duration_lit(&inner, "`per_attempt`")?;
                per_attempt = Some((d, lit.into_token_stream()));
                let _ = inner.parse::<Option<Token![,]>>()?;
                expect_end(&inner, Property::Deadline)?;
            }
            (
                Deadline {
                    total,
                    per_attempt: per_attempt.as_ref().map(|(d, _)| *d),
                },
                per_attempt.map(|(_, t)| t),
            )
        } else {
            let (total, _) = duration_lit(input, "`deadline`")?;
            (
                Deadline {
                    total,
                    per_attempt: None,
                },
                None,
            )
        };
        expect_end(input, Property::Deadline)?;
        Ok(parsed)
    })
}

/// `max_attempts = 4`
fn max_attempts(cx: &mut Ctxt, value: &TokenStream) -> Option<u32> {
    run(cx, value, |input| {
        let hint = "`max_attempts` takes a whole number of attempts, the first included, such as `max_attempts = 4`";
        let lit: LitInt = input.parse().map_err(|e| syn::Error::new(e.span(), hint))?;
        let n = lit
            .base10_parse::<u32>()
            .map_err(|_| syn::Error::new(lit.span(), hint))?;
        expect_end(input, Property::MaxAttempts)?;
        Ok(n)
    })
}

/// `retryable = [429, 503, timeout]`; also returns the tokens of each entry, for errors.
fn retryable(cx: &mut Ctxt, value: &TokenStream) -> Option<(Vec<Retryable>, Vec<TokenStream>)> {
    let items = run(cx, value, |input| {
        let hint = "`retryable` is a list of statuses and transport failures, such as `retryable = [429, 503, timeout]`";
        if !input.peek(syn::token::Bracket) {
            return Err(input.error(hint));
        }
        let inner;
        bracketed!(inner in input);
        let items = inner.parse_terminated(
            |i: ParseStream| i.parse::<proc_macro2::TokenTree>(),
            Token![,],
        )?;
        expect_end(input, Property::Retryable)?;
        Ok(items.into_iter().collect::<Vec<_>>())
    })?;
    // An entry that does not parse is reported and left out; the others are kept, so the
    // rules still run on them and one compile shows every problem of the list.
    let mut out = Vec::new();
    let mut spans = Vec::new();
    for tt in items {
        let tokens = tt.to_token_stream();
        let entry = match syn::parse2::<syn::Lit>(tokens.clone()) {
            Ok(syn::Lit::Int(lit)) => match lit.base10_parse::<u16>() {
                Ok(code) => Some(Retryable::Status(StatusCode(code))),
                Err(_) => {
                    cx.error_spanned(
                        &lit,
                        format!("`{lit}` is not an HTTP status code: statuses run from 100 to 599"),
                    );
                    None
                }
            },
            _ => match syn::parse2::<Ident>(tokens.clone()) {
                Ok(ident) => match TransportFailure::from_name(&ident.to_string()) {
                    Some(t) => Some(Retryable::Transport(t)),
                    None => {
                        let names: Vec<_> =
                            TransportFailure::ALL.iter().map(|t| t.name()).collect();
                        let suggestion = super::suggest(&ident.to_string(), &names)
                            .map(|s| format!("did you mean `{s}`? "))
                            .unwrap_or_default();
                        cx.error_spanned(
                            &ident,
                            format!(
                                "unknown transport failure `{ident}`: {suggestion}`retryable` takes status codes and {}",
                                super::backticked(&names, "or")
                            ),
                        );
                        None
                    }
                },
                Err(_) => {
                    cx.error_spanned(&tokens, "expected a status code such as `503` or a transport failure such as `timeout`");
                    None
                }
            },
        };
        if let Some(entry) = entry {
            out.push(entry);
            spans.push(tokens);
        }
    }
    Some((out, spans))
}

fn field_path(input: ParseStream) -> syn::Result<FieldRef> {
    let mut segments = vec![input.parse::<Ident>()?];
    while input.peek(Token![.]) {
        input.parse::<Token![.]>()?;
        segments.push(input.parse::<Ident>()?);
    }
    Ok(FieldRef { segments })
}

/// The fingerprint as written: the body's part, its fields, and the query parameters.
type FingerprintValue = (Fingerprint, Vec<FieldRef>, Vec<FieldRef>);

/// `fingerprint = [customer_id, items]`, `fingerprint = body`, or either with the
/// significant query parameters: `fingerprint = ([amount], query = [expand])`; also
/// returns the fields' and the parameters' identifiers, for the compiler's check and for
/// errors.
fn fingerprint(cx: &mut Ctxt, value: &TokenStream) -> Option<FingerprintValue> {
    run(cx, value, |input| {
        if input.peek(syn::token::Paren) {
            let inner;
            parenthesized!(inner in input);
            let (body, fields) = fingerprint_body(&inner)?;
            inner.parse::<Token![,]>().map_err(|e| {
                syn::Error::new(e.span(), "after the body's part, write the significant query parameters: `fingerprint = ([amount], query = [expand])`")
            })?;
            let key: Ident = inner.parse()?;
            if key != "query" {
                return Err(syn::Error::new(
                    key.span(),
                    format!(
                        "unknown fingerprint option `{key}`: write `fingerprint = ([amount], query = [expand])`"
                    ),
                ));
            }
            inner.parse::<Token![=]>()?;
            let list;
            bracketed!(list in inner);
            let query: Vec<FieldRef> = list
                .parse_terminated(field_path, Token![,])?
                .into_iter()
                .collect();
            if let Some(nested) = query.iter().find(|q| q.segments.len() > 1) {
                return Err(syn::Error::new_spanned(
                    nested,
                    "query parameters are flat: name the parameter itself, such as `query = [expand]`",
                ));
            }
            if query.is_empty() {
                return Err(syn::Error::new(
                    list.span(),
                    "`query = []` names no parameter: leave `query` out, or name the significant ones",
                ));
            }
            let _ = inner.parse::<Option<Token![,]>>()?;
            expect_end(&inner, Property::Fingerprint)?;
            expect_end(input, Property::Fingerprint)?;
            return Ok((body, fields, query));
        }
        let (body, fields) = fingerprint_body(input)?;
        expect_end(input, Property::Fingerprint)?;
        Ok((body, fields, Vec::new()))
    })
}

/// `[customer_id, items]` or `body`.
fn fingerprint_body(input: ParseStream) -> syn::Result<(Fingerprint, Vec<FieldRef>)> {
    {
        let hint = "`fingerprint` lists the significant fields of the body, such as `fingerprint = [customer_id, amount]`, or is `body` for the whole body";
        if input.peek(syn::token::Bracket) {
            let inner;
            bracketed!(inner in input);
            let fields: Vec<FieldRef> = inner
                .parse_terminated(field_path, Token![,])?
                .into_iter()
                .collect();
            let paths = fields.iter().map(FieldRef::path).collect::<Vec<_>>();
            return Ok((Fingerprint::Fields(Cow::Owned(paths)), fields));
        }
        let ident: Ident = input.parse().map_err(|e| syn::Error::new(e.span(), hint))?;
        if ident != "body" {
            return Err(syn::Error::new(ident.span(), hint));
        }
        Ok((Fingerprint::Body, Vec::new()))
    }
}

/// `key_scope = client` or `client(header = "..", body = field, format = uuid)`; also
/// returns the body field, if the key is in the body.
fn key_scope(cx: &mut Ctxt, value: &TokenStream) -> Option<(KeyScope, Option<FieldRef>)> {
    run(cx, value, |input| {
        let ns: Ident = input.parse().map_err(|e| {
            syn::Error::new(e.span(), "`key_scope` names the key's namespace: write `key_scope = client`, or `client(header = \"Idempotency-Key\")`")
        })?;
        if ns != "client" {
            return Err(syn::Error::new(
                ns.span(),
                format!(
                    "unknown key scope `{ns}`: keys live per client and operation, so write `key_scope = client`"
                ),
            ));
        }
        let mut header: Option<LitStr> = None;
        let mut body: Option<FieldRef> = None;
        let mut format = KeyFormat::Any;
        if input.peek(syn::token::Paren) {
            let inner;
            parenthesized!(inner in input);
            while !inner.is_empty() {
                let option: Ident = inner.parse()?;
                inner.parse::<Token![=]>()?;
                match option.to_string().as_str() {
                    "header" if header.is_none() && body.is_none() => header = Some(inner.parse()?),
                    "body" if header.is_none() && body.is_none() => {
                        body = Some(field_path(&inner)?)
                    }
                    "header" | "body" => {
                        return Err(syn::Error::new(
                            option.span(),
                            "the key comes from one place: give either `header = \"..\"` or `body = field`, once",
                        ));
                    }
                    "format" => {
                        let f: Ident = inner.parse()?;
                        format = match f.to_string().as_str() {
                            "any" => KeyFormat::Any,
                            "uuid" => KeyFormat::Uuid,
                            _ => {
                                return Err(syn::Error::new(
                                    f.span(),
                                    format!("unknown key format `{f}`: write `any` or `uuid`"),
                                ));
                            }
                        }
                    }
                    _ => {
                        return Err(syn::Error::new(
                            option.span(),
                            format!(
                                "unknown key scope option `{option}`: expected `header`, `body` or `format`"
                            ),
                        ));
                    }
                }
                if !inner.is_empty() {
                    inner.parse::<Token![,]>()?;
                }
            }
        }
        expect_end(input, Property::KeyScope)?;
        let source = match (header, &body) {
            (Some(lit), _) => KeySource::Header {
                name: Cow::Owned(lit.value()),
            },
            (None, Some(field)) => KeySource::Body {
                field: field.path(),
            },
            (None, None) => KeySource::Header {
                name: Cow::Borrowed(crate::headers::IDEMPOTENCY_KEY),
            },
        };
        Ok((
            KeyScope {
                per: Namespace::Client,
                source,
                format,
            },
            body,
        ))
    })
}

/// `concurrency = conflict`, `conflict(retry_after = "2s")`, `accepted` or `wait("2s")`.
fn concurrency(cx: &mut Ctxt, value: &TokenStream) -> Option<Concurrency> {
    run(cx, value, |input| {
        let hint = "`concurrency` is `conflict` (409 with `Retry-After`), `accepted` (202 with a `Location`) or `wait(\"2s\")` (a bounded wait for the first attempt's result)";
        let kind: Ident = input.parse().map_err(|e| syn::Error::new(e.span(), hint))?;
        let parsed = match kind.to_string().as_str() {
            "conflict" => {
                let mut retry_after = DEFAULT_CONFLICT_RETRY_AFTER;
                if input.peek(syn::token::Paren) {
                    let inner;
                    parenthesized!(inner in input);
                    let option: Ident = inner.parse()?;
                    if option != "retry_after" {
                        return Err(syn::Error::new(
                            option.span(),
                            format!(
                                "unknown option `{option}`: write `conflict(retry_after = \"2s\")`"
                            ),
                        ));
                    }
                    inner.parse::<Token![=]>()?;
                    retry_after = duration_lit(&inner, "`retry_after`")?.0;
                    let _ = inner.parse::<Option<Token![,]>>()?;
                    expect_end(&inner, Property::Concurrency)?;
                }
                Concurrency::Conflict { retry_after }
            }
            "accepted" => Concurrency::Accepted,
            "wait" => {
                if !input.peek(syn::token::Paren) {
                    return Err(syn::Error::new(
                        kind.span(),
                        "`wait` needs its limit: write `concurrency = wait(\"2s\")`",
                    ));
                }
                let inner;
                parenthesized!(inner in input);
                let (limit, _) = duration_lit(&inner, "the wait")?;
                expect_end(&inner, Property::Concurrency)?;
                Concurrency::Wait { limit }
            }
            other => {
                let suggestion = super::suggest(other, &["conflict", "accepted", "wait"])
                    .map(|s| format!("did you mean `{s}`? "))
                    .unwrap_or_default();
                return Err(syn::Error::new(
                    kind.span(),
                    format!("unknown concurrency response `{other}`: {suggestion}{hint}"),
                ));
            }
        };
        expect_end(input, Property::Concurrency)?;
        Ok(parsed)
    })
}

/// The path of a function as written: `order_status`, `crate::ops::order_status`.
fn path_string(path: &syn::Path) -> String {
    let mut s = String::new();
    if path.leading_colon.is_some() {
        s.push_str("::");
    }
    let segments: Vec<String> = path
        .segments
        .iter()
        .map(|seg| seg.ident.to_string())
        .collect();
    s.push_str(&segments.join("::"));
    s
}

fn function_path(input: ParseStream, hint: &str) -> syn::Result<syn::Path> {
    let path = input
        .call(syn::Path::parse_mod_style)
        .map_err(|e| syn::Error::new(e.span(), hint))?;
    Ok(path)
}

/// `status_lookup = handler` or `handler(path = "/orders/operations/{key}")`; also returns
/// the handler's path, for the compiler's check.
fn status_lookup(cx: &mut Ctxt, value: &TokenStream) -> Option<(StatusLookup, syn::Path)> {
    run(cx, value, |input| {
        let hint = "`status_lookup` names the handler that answers by key, such as `status_lookup = order_operation_status`";
        let handler = function_path(input, hint)?;
        let mut path = None;
        if input.peek(syn::token::Paren) {
            let inner;
            parenthesized!(inner in input);
            let option: Ident = inner.parse()?;
            if option != "path" {
                return Err(syn::Error::new(
                    option.span(),
                    format!(
                        "unknown option `{option}`: write `{}(path = \"/operations/{{key}}\")`",
                        path_string(&handler)
                    ),
                ));
            }
            inner.parse::<Token![=]>()?;
            let lit: LitStr = inner.parse()?;
            path = Some(Cow::Owned(lit.value()));
            let _ = inner.parse::<Option<Token![,]>>()?;
            expect_end(&inner, Property::StatusLookup)?;
        }
        expect_end(input, Property::StatusLookup)?;
        Ok((
            StatusLookup {
                handler: Cow::Owned(path_string(&handler)),
                path,
            },
            handler,
        ))
    })
}

/// `recovery = reconcile_fn`, `recovery = manual("runbook")` or `recovery = resume`; also
/// returns the reconcile function's path, for the compiler's check.
fn recovery(cx: &mut Ctxt, value: &TokenStream) -> Option<(Recovery, Option<syn::Path>)> {
    run(cx, value, |input| {
        let hint = "`recovery` names a reconcile function, such as `recovery = reconcile_order`, or is `manual(\"runbook URL\")` or `resume`";
        let fork = input.fork();
        if fork.parse::<Ident>().is_ok_and(|i| i == "resume") && fork.is_empty() {
            input.parse::<Ident>()?;
            return Ok((Recovery::Resume, None));
        }
        let fork = input.fork();
        if fork.parse::<Ident>().is_ok_and(|i| i == "manual") && fork.peek(syn::token::Paren) {
            input.parse::<Ident>()?;
            let inner;
            parenthesized!(inner in input);
            let runbook: LitStr = inner
                .parse()
                .map_err(|e| syn::Error::new(e.span(), "`manual` takes the runbook in quotes: `manual(\"https://runbooks.example.com/orders\")`"))?;
            let _ = inner.parse::<Option<Token![,]>>()?;
            expect_end(&inner, Property::Recovery)?;
            expect_end(input, Property::Recovery)?;
            return Ok((
                Recovery::Manual {
                    runbook: Cow::Owned(runbook.value()),
                },
                None,
            ));
        }
        let function = function_path(input, hint)?;
        expect_end(input, Property::Recovery)?;
        Ok((
            Recovery::Reconcile {
                function: Cow::Owned(path_string(&function)),
            },
            Some(function),
        ))
    })
}

impl FieldRef {
    /// The dotted path of the field.
    pub fn path(&self) -> FieldPath {
        let text = self
            .segments
            .iter()
            .map(|s| syn::ext::IdentExt::unraw(s).to_string())
            .collect::<Vec<_>>()
            .join(".");
        FieldPath::parse(text).expect("identifiers are never empty")
    }

    /// The span of the first segment.
    pub fn span(&self) -> Span {
        self.segments[0].span()
    }
}
