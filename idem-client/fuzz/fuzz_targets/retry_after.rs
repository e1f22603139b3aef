//! `Retry-After` parsing never panics, and never asks for more than `MAX_DELAY`.
#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let now = UNIX_EPOCH + Duration::from_secs(1_764_633_600); // 2025-12-02
    if let Some(delay) = idem_client::retry_after::parse(data, now) {
        assert!(delay <= idem_client::retry_after::MAX_DELAY);
    }
});
