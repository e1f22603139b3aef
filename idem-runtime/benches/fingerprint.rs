//! The cost of a request's fingerprint (`idem_runtime::fingerprint::compute`) on a 1 KiB
//! JSON body, against the floor: plain SHA-256 of the same bytes, which any fingerprint
//! pays. `cargo bench -p idem-runtime --bench fingerprint`.
//!
//! - `sha256_floor`: SHA-256 of the body as received, hex-encoded as a fingerprint is.
//! - `fields`: `fingerprint = [customer_id, amount_minor]` (the shape of the examples):
//!   the whole body is parsed (I-JSON checks included), two members are selected, put
//!   in canonical form (RFC 8785) and hashed.
//! - `body`: `fingerprint = body`: the whole body is parsed, put in canonical form and
//!   hashed.
//!
//! After divan's table, a summary prints the nanoseconds per fingerprint of a plain loop
//! and each one's ratio to the floor.

use std::hint::black_box;
use std::time::Instant;

use idem_contract::{FieldPath, Fingerprint};
use idem_runtime::fingerprint::compute;
use sha2::{Digest, Sha256};

/// A 1024-byte order: a few scalar members, an array of line items, a padded note.
fn body() -> Vec<u8> {
    let items: Vec<String> = (1..=8)
        .map(|i| {
            format!(
                r#"{{"sku":"sku-{i:04}","quantity":{i},"unit_price_minor":{},"tax_rate":0.2}}"#,
                1000 + i * 37
            )
        })
        .collect();
    let head = format!(
        r#"{{"customer_id":"cus_42","amount_minor":1999,"currency":"EUR","items":[{}],"shipping":{{"country":"FR","postcode":"75011","express":false}},"note":""#,
        items.join(",")
    );
    let tail = r#""}"#;
    let pad = 1024 - head.len() - tail.len();
    let text = format!("{head}{}{tail}", "x".repeat(pad));
    assert_eq!(text.len(), 1024);
    text.into_bytes()
}

fn fields() -> Fingerprint {
    Fingerprint::Fields(
        vec![
            FieldPath::from_static("customer_id"),
            FieldPath::from_static("amount_minor"),
        ]
        .into(),
    )
}

fn sha256_hex(body: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(body)))
}

#[divan::bench]
fn sha256_floor(bencher: divan::Bencher) {
    let body = body();
    bencher.bench(|| sha256_hex(black_box(&body)));
}

#[divan::bench]
fn fingerprint_fields(bencher: divan::Bencher) {
    let (spec, body) = (fields(), body());
    bencher.bench(|| compute(black_box(&spec), black_box(&body)).unwrap());
}

#[divan::bench]
fn fingerprint_body(bencher: divan::Bencher) {
    let body = body();
    bencher.bench(|| compute(black_box(&Fingerprint::Body), black_box(&body)).unwrap());
}

/// Nanoseconds per call of `f`, the best of 5 runs of `n` calls.
fn ns_per_call(n: u32, mut f: impl FnMut()) -> f64 {
    (0..5)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..n {
                f();
            }
            start.elapsed().as_secs_f64() * 1e9 / f64::from(n)
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    divan::main();
    let (spec, body) = (fields(), body());
    let n = 20_000;
    let floor = ns_per_call(n, || drop(black_box(sha256_hex(black_box(&body)))));
    let by_fields = ns_per_call(n, || drop(black_box(compute(&spec, black_box(&body)))));
    let whole = ns_per_call(n, || {
        drop(black_box(compute(&Fingerprint::Body, black_box(&body))));
    });
    println!("\nfingerprint of a 1 KiB JSON body, best of 5 loops of {n}\n");
    println!("| what | ns per fingerprint | ratio to SHA-256 |");
    println!("|---|---|---|");
    for (name, ns) in [
        ("SHA-256 of the bytes (the floor)", floor),
        ("`fingerprint = [customer_id, amount_minor]`", by_fields),
        ("`fingerprint = body`", whole),
    ] {
        println!("| {name} | {ns:.0} | {:.1} |", ns / floor);
    }
}
