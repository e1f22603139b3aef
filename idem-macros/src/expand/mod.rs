//! parse → model → check (in `idem-contract`) → expand (here).

mod checks;
mod fallback;
mod handler;
mod mode;
mod model;

use proc_macro2::{Span, TokenStream};
use quote::quote;

use idem_contract::parse::parse;

/// The paths generated code reaches the runtime and the model through, derived from the
/// name the user's crate gives `idem` (it may be renamed in Cargo.toml).
pub(crate) struct Paths {
    /// `::idem::__private`
    pub private: TokenStream,
    /// `::idem::__private::contract` (the `idem-contract` crate)
    pub model: TokenStream,
}

impl Paths {
    fn new() -> Paths {
        use proc_macro_crate::{FoundCrate, crate_name};
        let krate = match crate_name("idem") {
            Ok(FoundCrate::Name(name)) => {
                let ident = syn::Ident::new(&name, Span::call_site());
                quote!(::#ident)
            }
            // Inside the `idem` package itself (its tests and examples), or when the
            // manifest cannot be read: the usual name.
            Ok(FoundCrate::Itself) | Err(_) => quote!(::idem),
        };
        Paths {
            private: quote!(#krate::__private),
            model: quote!(#krate::__private::contract),
        }
    }
}

/// Expands `#[idem::contract(args)] item`.
pub(crate) fn contract(args: TokenStream, item: TokenStream) -> TokenStream {
    let parsed_item = syn::parse2::<syn::Item>(item.clone()).ok();
    let parsed = parse(args, Span::call_site(), parsed_item.as_ref());
    let paths = Paths::new();
    let output = match (&parsed.contract, &parsed.handler, parsed_item) {
        (Some(contract), Some(handler), Some(syn::Item::Fn(func))) => {
            let expanded = handler::expand(&paths, contract, &parsed, handler, func);
            let checks = checks::expand(&paths, &parsed);
            quote!(#expanded #checks)
        }
        (_, _, parsed_item) => fallback::expand(&paths, &parsed, parsed_item.as_ref(), item),
    };
    debug(&output);
    output
}

/// `IDEM_MACROS_DEBUG=1` prints every expansion to standard error while compiling.
fn debug(output: &TokenStream) {
    if std::env::var_os("IDEM_MACROS_DEBUG").is_some_and(|v| v == "1") {
        eprintln!("#[idem::contract] expands to:\n{output}\n");
    }
}
