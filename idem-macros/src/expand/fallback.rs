//! The expansion of a contract with errors: the errors, the item as the user wrote it
//! (for a function, inside a stand-in handler of the same name that axum accepts), and a
//! companion module of the right shape, so that the user sees only the real problems and
//! no cascade of follow-on errors (thiserror's `fallback.rs`).

use proc_macro2::TokenStream;
use quote::quote;

use idem_contract::parse::Parsed;

use super::{Paths, checks, handler};

pub(super) fn expand(
    paths: &Paths,
    parsed: &Parsed,
    item: Option<&syn::Item>,
    raw: TokenStream,
) -> TokenStream {
    let errors = parsed.errors.iter().map(syn::Error::to_compile_error);
    let p = &paths.private;
    let m = &paths.model;
    let (item, companion) = match item {
        // A method (`self`) is refused by the parser; it stays as written.
        Some(syn::Item::Fn(func))
            if !matches!(func.sig.inputs.first(), Some(syn::FnArg::Receiver(_))) =>
        {
            let ident = &func.sig.ident;
            let module = handler::companion(
                paths,
                func,
                quote!(#m::Contract::PLACEHOLDER),
                None,
                None,
                None,
            );
            let checks = checks::expand(paths, parsed);
            let handler = handler::stand_in(paths, func);
            let companion = quote! {
                #module
                impl<__IdemS> #p::Recover<__IdemS> for #ident::Operation
                where
                    __IdemS: ::core::marker::Send + ::core::marker::Sync,
                {
                    fn recoverer(_: &__IdemS) -> #p::Recoverer {
                        #p::Recoverer::manual()
                    }
                }
                #checks
            };
            (handler, companion)
        }
        _ => (raw, TokenStream::new()),
    };
    quote! {
        #(#errors)*
        #item
        #companion
    }
}
