//! One set-once slot per property (serde's `Attr<T>`): the second occurrence is the error.

use std::ops::{Index, IndexMut};

use proc_macro2::TokenStream;
use syn::Ident;

use super::Ctxt;
use super::value::Value;
use crate::Property;

/// One slot per property, indexed by the property.
pub(super) struct Slots([Slot<Value>; Property::ALL.len()]);

impl Default for Slots {
    fn default() -> Slots {
        Slots(std::array::from_fn(|_| Slot::Empty))
    }
}

impl Index<Property> for Slots {
    type Output = Slot<Value>;

    fn index(&self, property: Property) -> &Slot<Value> {
        &self.0[property.index()]
    }
}

impl IndexMut<Property> for Slots {
    fn index_mut(&mut self, property: Property) -> &mut Slot<Value> {
        &mut self.0[property.index()]
    }
}

/// The state of one property while the attribute is read.
pub(super) enum Slot<T> {
    /// Not written.
    Empty,
    /// Written, but its value was refused (the error is already recorded). It counts as
    /// present, so it is not also reported missing.
    Invalid { key: Ident },
    /// Written with a valid value.
    Set {
        key: Ident,
        value: T,
        tokens: TokenStream,
    },
}

impl<T> Slot<T> {
    /// Records the property written at `key` with the value `parsed` and its tokens (already parsed, so
    /// value errors are reported even for a duplicate). A duplicate is an error at the
    /// second key, and the slot becomes invalid: neither value silently wins.
    pub(super) fn set(
        &mut self,
        cx: &mut Ctxt,
        property: Property,
        key: Ident,
        parsed: Option<(T, TokenStream)>,
    ) {
        if let Slot::Invalid { key: first } | Slot::Set { key: first, .. } = self {
            cx.error(
                key.span(),
                format!("`{property}` is given twice: a contract takes one value, so neither wins; remove one of them"),
            );
            let first = first.clone();
            *self = Slot::Invalid { key: first };
            return;
        }
        *self = match parsed {
            Some((value, tokens)) => Slot::Set { key, value, tokens },
            None => Slot::Invalid { key },
        };
    }

    pub(super) fn is_empty(&self) -> bool {
        matches!(self, Slot::Empty)
    }

    pub(super) fn get(&self) -> Option<(&T, &TokenStream)> {
        match self {
            Slot::Set { value, tokens, .. } => Some((value, tokens)),
            _ => None,
        }
    }
}
