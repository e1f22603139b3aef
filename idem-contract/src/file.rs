//! The contracts file: contracts exported from source, for the `idem` command.

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Contract;

/// The version of the contracts file format this crate writes and reads.
pub const CONTRACTS_FILE_VERSION: u32 = 1;

/// A set of contracts, as `idem export` writes them and `idem merge` and `idem docs` read
/// them (JSON).
///
/// ```json
/// { "version": 1,
///   "contracts": [ { "target": "PostCharges", "contract": { "operation": "create_charge", … } } ] }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ContractsFile {
    /// Always [`CONTRACTS_FILE_VERSION`].
    pub version: u32,
    /// The contracts, in the order they were found.
    pub contracts: Vec<ContractEntry>,
}

/// One contract and the OpenAPI operation it describes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ContractEntry {
    /// The OpenAPI operation to merge into; by default the one whose `operationId` is the
    /// contract's operation name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,
    /// The contract.
    pub contract: Contract,
}

impl ContractEntry {
    /// The operation this entry merges into: its target, or else the `operationId` equal
    /// to the operation name.
    pub fn target(&self) -> Target {
        self.target
            .clone()
            .unwrap_or_else(|| Target::OperationId(self.contract.operation.to_string()))
    }
}

/// Which OpenAPI operation a contract describes (by `operationId`, or by method
/// and path).
///
/// Written as a string: `PostCharges` (an `operationId`), `POST /v1/charges` (a method and
/// a path of `paths`), or `POST webhook newPet` (a method of an OpenAPI 3.1 webhook).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// An operation by its `operationId`.
    OperationId(String),
    /// An operation of `paths` by its method (lowercase) and path.
    Path {
        /// `get`, `post`, `put`, `patch`, `delete`, …
        method: String,
        /// The path template as written in the document, such as `/pets/{id}`.
        path: String,
    },
    /// An operation of `webhooks` (OpenAPI 3.1) by its method (lowercase) and the
    /// webhook's name.
    Webhook {
        /// `post`, …
        method: String,
        /// The webhook's name, such as `newPet`.
        name: String,
    },
}

/// The HTTP methods of an OpenAPI path item, lowercase (OpenAPI 3.1 §4.8.9).
pub const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// Why a target string was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetError(String);

impl fmt::Display for TargetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` is not an operation: write an operationId (`PostCharges`), a method and a path (`POST /v1/charges`) or a method and a webhook (`POST webhook newPet`)",
            self.0
        )
    }
}

impl std::error::Error for TargetError {}

impl FromStr for Target {
    type Err = TargetError;

    fn from_str(text: &str) -> Result<Target, TargetError> {
        let err = || TargetError(text.to_owned());
        let words: Vec<&str> = text.split_whitespace().collect();
        let method = |m: &str| {
            let m = m.to_ascii_lowercase();
            METHODS.contains(&m.as_str()).then_some(m)
        };
        match words.as_slice() {
            [id] if !id.starts_with('/') => Ok(Target::OperationId((*id).to_owned())),
            [m, path] if path.starts_with('/') => Ok(Target::Path {
                method: method(m).ok_or_else(err)?,
                path: (*path).to_owned(),
            }),
            [m, "webhook", name] => Ok(Target::Webhook {
                method: method(m).ok_or_else(err)?,
                name: (*name).to_owned(),
            }),
            _ => Err(err()),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::OperationId(id) => f.write_str(id),
            Target::Path { method, path } => write!(f, "{} {path}", method.to_ascii_uppercase()),
            Target::Webhook { method, name } => {
                write!(f, "{} webhook {name}", method.to_ascii_uppercase())
            }
        }
    }
}

impl Serialize for Target {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Target {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Target, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Target {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Target".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "An operationId (`PostCharges`), a method and a path (`POST /v1/charges`), or a method and a webhook (`POST webhook newPet`).",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_round_trip() {
        for text in ["PostCharges", "POST /v1/charges", "POST webhook newPet"] {
            let target: Target = text.parse().unwrap();
            assert_eq!(target.to_string(), text);
        }
        assert_eq!(
            "post /pets".parse::<Target>().unwrap(),
            Target::Path {
                method: "post".into(),
                path: "/pets".into()
            }
        );
        for bad in ["", "FETCH /pets", "/pets", "POST pets", "a b c d"] {
            assert!(bad.parse::<Target>().is_err(), "{bad:?}");
        }
    }
}
