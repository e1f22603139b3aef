//! The order resource: what `POST /orders` takes and what the service answers.

use serde::{Deserialize, Serialize};

/// The most line items one order may have.
pub const MAX_ITEMS: usize = 100;
/// The largest quantity of one line item.
pub const MAX_QTY: u32 = 10_000;
/// The largest amount, in minor units (10^12: ten billion of a two-decimal currency).
pub const MAX_AMOUNT_MINOR: i64 = 1_000_000_000_000;
/// The longest customer id and SKU, in bytes.
pub const MAX_ID_LEN: usize = 64;
/// The most broken rules a 422 lists; the rest are counted. The answer is stored and
/// replayed for the key's whole TTL, so its size must not grow with the request's: a 1 MB
/// order of bad line items gets a 422 of about 2 KB, not one of 1.7 MB.
pub const MAX_FIELD_ERRORS: usize = 20;

/// The body of `POST /orders`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CreateOrder {
    /// Who the order is for.
    pub customer_id: String,
    /// An ISO 4217 currency code, such as `EUR`.
    pub currency: String,
    /// The amount in the currency's minor unit (cents for `EUR`); more than 0.
    pub amount_minor: i64,
    /// What is ordered: 1 to [`MAX_ITEMS`] lines.
    pub items: Vec<LineItem>,
}

/// One line of an order.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LineItem {
    /// The stock keeping unit.
    pub sku: String,
    /// How many: 1 to [`MAX_QTY`].
    pub qty: u32,
}

/// An order, as the service answers it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct Order {
    /// The order's id, such as `ord_0192…`.
    pub id: String,
    /// Who the order is for.
    pub customer_id: String,
    /// The ISO 4217 currency code.
    pub currency: String,
    /// The amount in minor units.
    pub amount_minor: i64,
    /// What is ordered.
    pub items: Vec<LineItem>,
    /// When the order was created, in unix milliseconds.
    pub created_at: i64,
}

/// One reason an order is refused.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct FieldError {
    /// The JSON path of the member, such as `items[0].qty`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

/// The broken rules of an order: the first [`MAX_FIELD_ERRORS`], in the order of the
/// body, and how many more there were.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldErrors {
    /// The first broken rules, one per field.
    pub errors: Vec<FieldError>,
    /// How many more were found and not listed.
    pub more: usize,
}

impl FieldErrors {
    fn push(&mut self, field: impl Into<String>, message: &str) {
        if self.errors.len() < MAX_FIELD_ERRORS {
            self.errors.push(FieldError {
                field: field.into(),
                message: message.to_owned(),
            });
        } else {
            self.more += 1;
        }
    }
}

impl CreateOrder {
    /// Checks the business rules, and returns the fields that break one.
    ///
    /// # Errors
    ///
    /// The first [`MAX_FIELD_ERRORS`] problems, one per field, and the count of the
    /// rest, when there is at least one.
    pub fn validate(&self) -> Result<(), FieldErrors> {
        let mut errors = FieldErrors::default();
        if let Some(problem) = identifier_problem(&self.customer_id) {
            errors.push("customer_id", problem);
        }
        if iso_currency::Currency::from_code(&self.currency).is_none() {
            errors.push(
                "currency",
                "must be an ISO 4217 currency code such as `EUR`",
            );
        }
        if !(1..=MAX_AMOUNT_MINOR).contains(&self.amount_minor) {
            errors.push(
                "amount_minor",
                "must be a whole number of minor units from 1 to 10^12",
            );
        }
        if self.items.is_empty() || self.items.len() > MAX_ITEMS {
            errors.push("items", "must hold 1 to 100 line items");
        }
        for (i, item) in self.items.iter().enumerate() {
            if let Some(problem) = identifier_problem(&item.sku) {
                errors.push(format!("items[{i}].sku"), problem);
            }
            if !(1..=MAX_QTY).contains(&item.qty) {
                errors.push(format!("items[{i}].qty"), "must be from 1 to 10000");
            }
        }
        if errors.errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

/// What is wrong with an identifier (a customer id, a SKU): blank, longer than
/// [`MAX_ID_LEN`] bytes, or holding a control character (U+0000 to U+001F, U+007F to
/// U+009F). PostgreSQL's `text` cannot hold U+0000 at all, and no identifier needs a
/// control character: refusing them here answers 422 naming the field, where the
/// database would have failed the request with a 500.
fn identifier_problem(value: &str) -> Option<&'static str> {
    if value.trim().is_empty() || value.len() > MAX_ID_LEN {
        Some("must be 1 to 64 bytes and not blank")
    } else if value.chars().any(char::is_control) {
        Some("must not hold control characters (such as U+0000)")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order() -> CreateOrder {
        CreateOrder {
            customer_id: "cus_1".into(),
            currency: "EUR".into(),
            amount_minor: 1999,
            items: vec![LineItem {
                sku: "book-1".into(),
                qty: 1,
            }],
        }
    }

    #[test]
    fn a_valid_order_passes() {
        assert_eq!(order().validate(), Ok(()));
    }

    #[test]
    fn every_broken_rule_is_reported() {
        let bad = CreateOrder {
            customer_id: " ".into(),
            currency: "EURO".into(),
            amount_minor: 0,
            items: vec![LineItem {
                sku: String::new(),
                qty: 0,
            }],
        };
        let fields: Vec<String> = bad
            .validate()
            .unwrap_err()
            .errors
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(
            fields,
            [
                "customer_id",
                "currency",
                "amount_minor",
                "items[0].sku",
                "items[0].qty"
            ]
        );
        let empty = CreateOrder {
            items: vec![],
            ..order()
        };
        assert_eq!(empty.validate().unwrap_err().errors[0].field, "items");
    }

    #[test]
    fn a_list_of_broken_rules_is_bounded() {
        let bad = CreateOrder {
            items: vec![
                LineItem {
                    sku: String::new(),
                    qty: 0,
                };
                5000
            ],
            ..order()
        };
        let errors = bad.validate().unwrap_err();
        assert_eq!(errors.errors.len(), MAX_FIELD_ERRORS);
        assert_eq!(errors.errors[0].field, "items");
        assert_eq!(errors.errors[1].field, "items[0].sku");
        assert_eq!(errors.more, 1 + 2 * 5000 - MAX_FIELD_ERRORS);
    }

    #[test]
    fn control_characters_in_identifiers_are_refused() {
        for bad in ["cus\u{0}1", "cus\n1", "\u{7f}", "cus\u{9b}"] {
            let order = CreateOrder {
                customer_id: bad.into(),
                items: vec![LineItem {
                    sku: bad.into(),
                    qty: 1,
                }],
                ..order()
            };
            let errors = order.validate().unwrap_err().errors;
            let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
            assert_eq!(fields, ["customer_id", "items[0].sku"], "{bad:?}");
            assert!(errors[0].message.contains("control characters"), "{bad:?}");
        }
        let unicode = CreateOrder {
            customer_id: "cus_čřž_日本".into(),
            ..order()
        };
        assert_eq!(unicode.validate(), Ok(()), "other Unicode is fine");
    }
}
