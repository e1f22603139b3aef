//! Reading a policy from an OpenAPI document or a contracts file never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = idem_client::RetryPolicy::from_openapi(text, "create_order");
        let _ = idem_client::RetryPolicy::from_contracts_file(text, "create_order");
    }
});
