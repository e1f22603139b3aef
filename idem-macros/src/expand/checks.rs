//! Checks that rustc makes for us, spanned at the user's tokens: fingerprint fields and a
//! body key against the body type, and the status lookup's path and shape.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;

use idem_contract::parse::Parsed;

use super::Paths;

/// `const _: () = { fn …() { … } };` holding every check the parsed values allow.
pub(super) fn expand(paths: &Paths, parsed: &Parsed) -> TokenStream {
    let p = &paths.private;
    let mut checks = Vec::new();

    if let Some(body) = body_type(paths, parsed) {
        let fields = parsed
            .fingerprint_fields
            .iter()
            .chain(parsed.key_field.as_ref());
        let accesses: Vec<TokenStream> = fields
            .map(|field| {
                let segments = &field.segments;
                quote_spanned!(field.span()=> let _ = &__idem_body #(.#segments)*;)
            })
            .collect();
        if !accesses.is_empty() {
            checks.push(quote_spanned! {body.span()=>
                #[allow(dead_code, clippy::no_effect_underscore_binding)]
                fn __idem_body_fields(__idem_body: &#body) {
                    #(#accesses)*
                }
            });
        }
    }

    if let Some(query) = parsed.handler.as_ref().and_then(|h| h.query.as_ref()) {
        let accesses: Vec<TokenStream> = parsed
            .fingerprint_query
            .iter()
            .map(|field| {
                let segments = &field.segments;
                quote_spanned!(field.span()=> let _ = &__idem_query #(.#segments)*;)
            })
            .collect();
        if !accesses.is_empty() {
            checks.push(quote! {
                #[allow(dead_code, clippy::no_effect_underscore_binding)]
                fn __idem_query_fields(__idem_query: &#query) {
                    #(#accesses)*
                }
            });
        }
    }

    if let Some(path) = &parsed.status_lookup {
        let assert = quote_spanned!(path.span()=> #p::assert_status_lookup(#path););
        checks.push(quote! {
            #[allow(dead_code)]
            fn __idem_status_lookup() {
                #assert
            }
        });
    }

    if checks.is_empty() {
        return TokenStream::new();
    }
    quote! {
        const _: () = {
            #(#checks)*
        };
    }
}

/// The type fingerprint fields and a body key are checked against: `T` of an argument
/// written `Json<T>` or `Form<T>`; or, when the contract reads the body and no argument is
/// written so, the body of the last argument found through `RequestBody` (`J<T>` after
/// `use axum::Json as J`; the compiler says so at the argument when it is not a body).
pub(super) fn body_type(paths: &Paths, parsed: &Parsed) -> Option<syn::Type> {
    let p = &paths.private;
    let handler = parsed.handler.as_ref()?;
    if let Some(body) = &handler.body {
        return Some(body.clone());
    }
    let reads_body = !parsed.fingerprint_fields.is_empty() || parsed.key_field.is_some();
    let extractor = handler.body_extractor.as_ref().filter(|_| reads_body)?;
    // Every token at the extractor's first one: wherever the projection is used (the
    // field checks, the companion's `body_fields`), a failed bound is the same diagnostic
    // at the same place, which rustc reports once.
    let span = extractor.span();
    let projection = quote_spanned!(span=> <#extractor as #p::RequestBody>::Body);
    Some(syn::Type::Verbatim(respan(projection, span)))
}

/// `tokens`, every one of them (inside groups too) at `span`.
fn respan(tokens: TokenStream, span: proc_macro2::Span) -> TokenStream {
    use proc_macro2::{Group, TokenTree};
    tokens
        .into_iter()
        .map(|tree| match tree {
            TokenTree::Group(group) => {
                let mut respanned = Group::new(group.delimiter(), respan(group.stream(), span));
                respanned.set_span(span);
                TokenTree::Group(respanned)
            }
            mut other => {
                other.set_span(span);
                other
            }
        })
        .collect()
}
