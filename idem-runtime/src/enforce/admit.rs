//! Stage 1, admit: the request has an idem handle, the operation's name is its own, its
//! contract fits the body type, and the application says who the client is. Shared with
//! the status lookup ([`crate::Lookup`]).

use http::request::Parts;

use super::Rejection;
use crate::Idem;
use crate::answer;
use crate::idem::names::Claim;
use crate::operation::OperationRef;
use crate::serde_names::SerdeNames;

/// A request admitted for an operation.
pub(crate) struct Admitted {
    /// The handle the layer put into the request.
    pub(crate) idem: Idem,
    /// The operation's claim on its name: its serde names and its metric keys.
    pub(crate) claim: Claim,
}

impl Admitted {
    /// The contract's body fields under their serde names.
    ///
    /// # Errors
    ///
    /// 500 `not-configured` when the contract names a field that the body type does not
    /// have under any spelling serde reads.
    pub(crate) fn serde_names(&self, operation: &str) -> Result<&SerdeNames, Rejection> {
        match self.claim.names.as_ref() {
            Ok(names) => Ok(names),
            Err(why) => Err(answer::misconfigured(operation, why).into()),
        }
    }

    /// The client, as the application's identity names it.
    ///
    /// # Errors
    ///
    /// The identity's own refusal (typically 401), with a fresh `Operation-Id`.
    pub(crate) fn identify(&self, parts: &Parts) -> Result<String, Rejection> {
        self.idem
            .identity()
            .identify(parts)
            .map_err(Rejection::refused)
    }
}

/// Admits a request for `operation`: its handle, and the operation's claim on its name.
///
/// # Errors
///
/// 500 `not-configured` without a handle (the router has no idem layer) or when another
/// contracted handler holds the name.
pub(crate) fn admit(parts: &Parts, operation: &OperationRef) -> Result<Admitted, Rejection> {
    let idem = handle(parts)?;
    let claim = idem
        .names()
        .claim_operation(operation)
        .map_err(|other| answer::operation_name_taken(operation.contract, other))?;
    Ok(Admitted { idem, claim })
}

/// The idem handle the layer put into the request.
///
/// # Errors
///
/// 500 `not-configured` when the router has no idem layer.
pub(crate) fn handle(parts: &Parts) -> Result<Idem, Rejection> {
    match parts.extensions.get::<Idem>() {
        Some(idem) => Ok(idem.clone()),
        None => Err(answer::not_configured(parts).into()),
    }
}
