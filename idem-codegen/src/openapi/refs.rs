//! Following local references (`{"$ref": "#/components/…"}`) inside one document.
//! References to other files or URLs are not followed: whoever asks gets `None` and
//! says nothing rather than guess.

use serde_json::Value;

/// The most `$ref` hops followed from one value: more is a cycle, or a document no
/// reader should have to unwind.
const MAX_HOPS: usize = 16;

/// The value at the local reference `reference` (`#/components/schemas/Pet`): a JSON
/// pointer (RFC 6901, `~1` for `/` and `~0` for `~`) from the document's root.
pub(crate) fn target<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    if pointer.is_empty() {
        return Some(root);
    }
    pointer
        .strip_prefix('/')?
        .split('/')
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .try_fold(root, |v, k| match v {
            Value::Array(items) => k.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => v.get(&k),
        })
}

/// `value`, or what its `$ref` chain leads to; `None` when a reference is not local or
/// does not resolve. Members beside a `$ref` are not merged in: callers that care
/// (schemas in OpenAPI 3.1) look at them themselves.
pub(crate) fn resolve<'a>(root: &'a Value, mut value: &'a Value) -> Option<&'a Value> {
    for _ in 0..MAX_HOPS {
        match value.get("$ref") {
            Some(reference) => value = target(root, reference.as_str()?)?,
            None => return Some(value),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn local_references_are_followed() {
        let root = json!({
            "components": {
                "schemas": { "A": { "$ref": "#/components/schemas/B" }, "B": { "type": "object" }, "a/b": { "type": "string" } },
                "loop": { "$ref": "#/components/loop" },
            }
        });
        let a = json!({ "$ref": "#/components/schemas/A" });
        assert_eq!(resolve(&root, &a), Some(&json!({ "type": "object" })));
        let escaped = json!({ "$ref": "#/components/schemas/a~1b" });
        assert_eq!(resolve(&root, &escaped), Some(&json!({ "type": "string" })));
        assert_eq!(
            resolve(&root, &json!({ "$ref": "#/components/loop" })),
            None
        );
        assert_eq!(resolve(&root, &json!({ "$ref": "other.yaml#/A" })), None);
        assert_eq!(resolve(&root, &json!({ "$ref": "#/nowhere" })), None);
    }
}
