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

    if let Some(body) = parsed.handler.as_ref().and_then(|h| h.body.as_ref()) {
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
            checks.push(quote! {
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
