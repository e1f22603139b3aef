//! What a contracted handler needs of the handle that serves it, read from its
//! arguments: the `MODE` of its `Contracted` impl.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn};

use idem_contract::parse::is_passed_in;

use super::Paths;

/// `create_order::Operation::MODE`, what the handler needs of the handle that serves it
/// (`Contracted::MODE`, checked by `Idem::check_handlers`): transactional when an argument
/// is the transaction. Found by type, so `idem::PgTx`, `idem::transaction::Tx<Postgres>`
/// and an alias of either are the transaction and nothing else is: each argument's
/// `ModeOf::<T>::MODE` is the transaction's inherent const, else the `PlainArgument`
/// fallback. An argument whose type names the handler's generic parameters (or is an
/// `impl Trait`) cannot be named outside it and is left out.
pub(super) fn mode(paths: &Paths, func: &ItemFn) -> TokenStream {
    let p = &paths.private;
    let generics: Vec<String> = func
        .sig
        .generics
        .params
        .iter()
        .map(|param| match param {
            syn::GenericParam::Type(t) => t.ident.to_string(),
            syn::GenericParam::Lifetime(l) => l.lifetime.ident.to_string(),
            syn::GenericParam::Const(c) => c.ident.to_string(),
        })
        .collect();
    let probes = func.sig.inputs.iter().filter_map(|input| match input {
        FnArg::Typed(arg) if !is_passed_in(&arg.ty) && nameable(&arg.ty, &generics) => {
            let ty = &arg.ty;
            Some(quote_spanned!(ty.span()=> #p::ModeOf::<#ty>::MODE))
        }
        _ => None,
    });
    quote! {
        const MODE: #p::HandlerMode = {
            #[allow(unused_imports)]
            use #p::PlainArgument as _;
            #p::HandlerMode::of(&[#(#probes),*])
        };
    }
}

/// Whether `ty` can be named outside the handler: it names none of the handler's
/// `generics` and is no `impl Trait`.
fn nameable(ty: &syn::Type, generics: &[String]) -> bool {
    fn walk(tokens: TokenStream, generics: &[String]) -> bool {
        tokens.into_iter().all(|token| match token {
            proc_macro2::TokenTree::Ident(ident) => {
                let name = ident.to_string();
                name != "impl" && !generics.contains(&name)
            }
            proc_macro2::TokenTree::Group(group) => walk(group.stream(), generics),
            _ => true,
        })
    }
    walk(quote!(#ty), generics)
}
