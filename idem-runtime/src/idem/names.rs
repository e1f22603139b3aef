//! Operation names: keys live per client and per operation, and an operation is named by
//! its handler's name. Two contracted handlers with one name (`orders::create` and
//! `refunds::create`) would share every key, so one would answer with the other's
//! results. The first handler to serve a request claims its name in the [`Idem`] handle;
//! a second one is refused with 500 `not-configured` and a detail that says to rename it.
//!
//! [`Idem`]: crate::Idem

use std::any::TypeId;
use std::sync::Arc;

use dashmap::DashMap;

use crate::operation::{Contracted, OperationRef};
use crate::serde_names::{self, SerdeNames};
use crate::telemetry::OperationMetrics;

/// What one operation's claim holds: its type, and its body fields under their serde names
/// (resolved once, see [`crate::serde_names`]), or why they cannot be.
#[derive(Clone)]
pub(crate) struct Claim {
    id: TypeId,
    type_name: &'static str,
    pub(crate) names: Arc<Result<SerdeNames, String>>,
    /// The operation's metric keys (`crate::telemetry`).
    pub(crate) metrics: Arc<OperationMetrics>,
}

/// The operation names claimed under one `Idem` handle, each with the type that claimed it.
#[derive(Default)]
pub(crate) struct Names(DashMap<&'static str, Claim>);

impl Names {
    /// Claims `C`'s operation name for `C`, and returns the claim.
    ///
    /// # Errors
    ///
    /// The type name of the other operation that holds the name.
    pub(crate) fn claim<C: Contracted>(&self) -> Result<Claim, &'static str> {
        self.claim_operation(&OperationRef::of::<C>())
    }

    /// Claims `operation`'s name for its type, and returns the claim.
    ///
    /// # Errors
    ///
    /// The type name of the other operation that holds the name.
    pub(crate) fn claim_operation(&self, operation: &OperationRef) -> Result<Claim, &'static str> {
        let contract: &'static idem_contract::Contract = operation.contract;
        let name: &'static str = &contract.operation;
        let claim = match self.0.get(name) {
            Some(claim) => claim.clone(),
            None => self
                .0
                .entry(name)
                .or_insert_with(|| Claim {
                    id: operation.id,
                    type_name: operation.type_name,
                    names: Arc::new(serde_names::resolve(
                        contract,
                        (operation.body_fields)(),
                        (operation.query_fields)(),
                    )),
                    metrics: Arc::new(OperationMetrics::new(name)),
                })
                .clone(),
        };
        if claim.id == operation.id {
            Ok(claim)
        } else {
            Err(claim.type_name)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::any::type_name;

    use super::*;

    struct First;
    struct Second;
    impl Contracted for First {
        const CONTRACT: &'static idem_contract::Contract = &idem_contract::Contract::PLACEHOLDER;
    }
    impl Contracted for Second {
        const CONTRACT: &'static idem_contract::Contract = &idem_contract::Contract::PLACEHOLDER;
    }

    #[test]
    fn a_name_belongs_to_one_operation() {
        let names = Names::default();
        assert!(names.claim::<First>().is_ok());
        assert!(names.claim::<First>().is_ok());
        assert_eq!(names.claim::<Second>().err(), Some(type_name::<First>()));
    }
}
