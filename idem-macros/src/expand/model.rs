//! The contract as a `const` expression of the model's types.

use proc_macro2::TokenStream;
use quote::quote;

use idem_contract::{
    Concurrency, Contract, Deadline, Duration, Fingerprint, KeyFormat, KeySource, Namespace,
    Recovery, Retryable, TransportFailure,
};

use super::Paths;

fn cow_str(s: &str) -> TokenStream {
    quote!(::std::borrow::Cow::Borrowed(#s))
}

fn duration(m: &TokenStream, d: Duration) -> TokenStream {
    let millis = d.as_millis();
    quote!(#m::Duration::from_millis(#millis))
}

fn option(value: Option<TokenStream>) -> TokenStream {
    match value {
        Some(v) => quote!(::core::option::Option::Some(#v)),
        None => quote!(::core::option::Option::None),
    }
}

/// `::idem::__private::contract::Contract { … }`, usable in a `const`.
pub(super) fn contract(paths: &Paths, c: &Contract) -> TokenStream {
    let m = &paths.model;
    let operation = cow_str(&c.operation);
    let Namespace::Client = c.key_scope.per;
    let source = match &c.key_scope.source {
        KeySource::Header { name } => {
            let name = cow_str(name);
            quote!(#m::KeySource::Header { name: #name })
        }
        KeySource::Body { field } => {
            let field = field.as_str();
            quote!(#m::KeySource::Body { field: #m::FieldPath::from_static(#field) })
        }
    };
    let format = match c.key_scope.format {
        KeyFormat::Any => quote!(#m::KeyFormat::Any),
        KeyFormat::Uuid => quote!(#m::KeyFormat::Uuid),
    };
    let fingerprint = match &c.fingerprint {
        Fingerprint::Body => quote!(#m::Fingerprint::Body),
        Fingerprint::Fields(fields) => {
            let fields = fields.iter().map(|f| f.as_str());
            quote!(#m::Fingerprint::Fields(::std::borrow::Cow::Borrowed(&[#(#m::FieldPath::from_static(#fields)),*])))
        }
    };
    let ttl = duration(m, c.ttl);
    let Deadline { total, per_attempt } = c.deadline;
    let total = duration(m, total);
    let per_attempt = option(per_attempt.map(|d| duration(m, d)));
    let max_attempts = c.max_attempts;
    let retryable = c.retryable.iter().map(|r| match r {
        Retryable::Status(s) => {
            let code = s.as_u16();
            quote!(#m::Retryable::Status(#m::StatusCode(#code)))
        }
        Retryable::Transport(t) => {
            let variant = match t {
                TransportFailure::Timeout => quote!(Timeout),
                TransportFailure::ConnectionReset => quote!(ConnectionReset),
                TransportFailure::ConnectionRefused => quote!(ConnectionRefused),
            };
            quote!(#m::Retryable::Transport(#m::TransportFailure::#variant))
        }
    });
    let concurrency = match c.concurrency {
        Concurrency::Conflict { retry_after } => {
            let retry_after = duration(m, retry_after);
            quote!(#m::Concurrency::Conflict { retry_after: #retry_after })
        }
        Concurrency::Accepted => quote!(#m::Concurrency::Accepted),
        Concurrency::Wait { limit } => {
            let limit = duration(m, limit);
            quote!(#m::Concurrency::Wait { limit: #limit })
        }
    };
    let lookup_handler = cow_str(&c.status_lookup.handler);
    let lookup_path = option(c.status_lookup.path.as_deref().map(cow_str));
    let recovery = match &c.recovery {
        Recovery::Reconcile { function } => {
            let function = cow_str(function);
            quote!(#m::Recovery::Reconcile { function: #function })
        }
        Recovery::Manual { runbook } => {
            let runbook = cow_str(runbook);
            quote!(#m::Recovery::Manual { runbook: #runbook })
        }
        Recovery::Resume => quote!(#m::Recovery::Resume),
    };
    let query = c.fingerprint_query.iter().map(|f| f.as_str());
    quote! {
        #m::Contract {
            operation: #operation,
            key_scope: #m::KeyScope { per: #m::Namespace::Client, source: #source, format: #format },
            fingerprint: #fingerprint,
            fingerprint_query: ::std::borrow::Cow::Borrowed(&[#(#m::FieldPath::from_static(#query)),*]),
            ttl: #ttl,
            deadline: #m::Deadline { total: #total, per_attempt: #per_attempt },
            max_attempts: #max_attempts,
            retryable: ::std::borrow::Cow::Borrowed(&[#(#retryable),*]),
            concurrency: #concurrency,
            status_lookup: #m::StatusLookup { handler: #lookup_handler, path: #lookup_path },
            recovery: #recovery,
        }
    }
}

/// A Markdown summary of the contract, appended to the handler's documentation.
pub(super) fn doc(c: &Contract) -> String {
    fn json(value: &impl serde::Serialize) -> String {
        serde_json::to_string(value).unwrap_or_default()
    }
    let rows = [
        ("key scope", json(&c.key_scope)),
        ("fingerprint", json(&c.fingerprint)),
        ("significant query parameters", json(&c.fingerprint_query)),
        ("TTL", c.ttl.to_string()),
        ("deadline", json(&c.deadline)),
        ("max attempts", c.max_attempts.to_string()),
        ("retryable", json(&c.retryable)),
        ("concurrency", json(&c.concurrency)),
        ("status lookup", json(&c.status_lookup)),
        ("recovery", json(&c.recovery)),
    ];
    let mut doc = format!(
        "\n\n# Idempotency contract\n\nEnforced by `#[idem::contract]`; the value is `{}::CONTRACT`.\n\n| property | value |\n|---|---|\n",
        c.operation
    );
    for (name, value) in rows {
        doc.push_str(&format!("| {name} | `{}` |\n", value.replace('|', "\\|")));
    }
    doc
}
