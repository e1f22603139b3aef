//! The `#[idem::contract(..)]` attribute macro. Use it through the `idem` crate, whose
//! documentation describes the attribute; this crate is the thin proc-macro shim.
//!
//! Parsing and every rule live in `idem-contract` (feature `parse`), which the `idem`
//! command uses too, so the compiler and the command report the same errors. This crate
//! only expands a valid contract.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod expand;

use proc_macro::TokenStream;

/// Declares the failure contract of an async axum handler. See the `idem` crate.
#[proc_macro_attribute]
pub fn contract(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::contract(args.into(), item.into()).into()
}
