//! How the stores that keep bytes and text (SQLite, PostgreSQL, Redis) write the headers
//! of a stored result: a JSON array of `[name, value]` pairs, in order; a value that is
//! not UTF-8 is written as `{"hex": "…"}`.

use http::{HeaderName, HeaderValue};

use super::StoreError;

/// The headers of a stored result as the JSON text the stores keep.
pub(super) fn encode_headers(headers: &[(HeaderName, HeaderValue)]) -> String {
    let list: Vec<serde_json::Value> = headers
        .iter()
        .map(|(name, value)| {
            let value = match value.to_str() {
                Ok(text) => serde_json::Value::from(text),
                Err(_) => serde_json::json!({ "hex": hex::encode(value.as_bytes()) }),
            };
            serde_json::json!([name.as_str(), value])
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

/// The headers read back from the stored text.
pub(super) fn decode_headers(text: &str) -> Result<Vec<(HeaderName, HeaderValue)>, StoreError> {
    let corrupt = |what: &str| StoreError::Corrupt(format!("stored headers: {what}"));
    let list: Vec<(String, serde_json::Value)> =
        serde_json::from_str(text).map_err(|e| corrupt(&e.to_string()))?;
    list.into_iter()
        .map(|(name, value)| {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| corrupt("a name"))?;
            let bytes = match &value {
                serde_json::Value::String(text) => text.as_bytes().to_vec(),
                serde_json::Value::Object(map) => map
                    .get("hex")
                    .and_then(serde_json::Value::as_str)
                    .and_then(|h| hex::decode(h).ok())
                    .ok_or_else(|| corrupt("a value"))?,
                _ => return Err(corrupt("a value")),
            };
            let value = HeaderValue::from_bytes(&bytes).map_err(|_| corrupt("a value"))?;
            Ok((name, value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_through_json() {
        let headers = vec![
            (
                HeaderName::from_static("etag"),
                HeaderValue::from_bytes(b"\"\xe9\"").unwrap(),
            ),
            (
                HeaderName::from_static("location"),
                HeaderValue::from_static("/a"),
            ),
        ];
        let text = encode_headers(&headers);
        assert_eq!(text, r#"[["etag",{"hex":"22e922"}],["location","/a"]]"#);
        assert_eq!(decode_headers(&text).unwrap(), headers);
        for bad in [
            "[[\"bad name\",\"x\"]]",
            "[[\"etag\",{\"hex\":\"zz\"}]]",
            "[[\"etag\",7]]",
            "not json",
            "",
        ] {
            assert!(
                matches!(decode_headers(bad), Err(StoreError::Corrupt(_))),
                "{bad}"
            );
        }
    }
}
