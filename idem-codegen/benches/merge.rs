//! Merging the six contracts of `tests/fixtures/stripe.contracts.json` into Stripe's
//! OpenAPI document (4 MB of YAML), against a plain load and save of the same document.
//!
//! `cargo bench -p idem-codegen --bench merge` runs divan's timings of both, then an
//! interleaved measurement of its own that prints the ratio merge / load-and-save.
//! "Save" is rendering the document to text (what `idem merge` writes), without the disk.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use idem_codegen::contracts::{self, Sourced};
use idem_codegen::openapi::{self, Document};

fn data() -> (PathBuf, String, Vec<Sourced>) {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = [
        manifest.join("../../shared/data/openapi/stripe-2023-09-05.spec3.yaml"),
        PathBuf::from("/work/shared/data/openapi/stripe-2023-09-05.spec3.yaml"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .expect("shared/data/openapi/stripe-2023-09-05.spec3.yaml beside the repository");
    let text = std::fs::read_to_string(&path).unwrap();
    let found =
        contracts::from_file(&manifest.join("tests/fixtures/stripe.contracts.json")).unwrap();
    (path, text, found)
}

fn load_and_save(path: &Path, text: &str) -> String {
    Document::parse(path, text).unwrap().render()
}

fn load_merge_and_save(path: &Path, text: &str, found: &[Sourced]) -> String {
    let mut doc = Document::parse(path, text).unwrap();
    openapi::merge(&mut doc, found).unwrap();
    doc.render()
}

#[divan::bench(sample_count = 10, sample_size = 1)]
fn stripe_load_and_save(bencher: divan::Bencher) {
    let (path, text, _) = data();
    bencher.bench(|| load_and_save(&path, &text));
}

#[divan::bench(sample_count = 10, sample_size = 1)]
fn stripe_merge_six(bencher: divan::Bencher) {
    let (path, text, found) = data();
    bencher.bench(|| load_merge_and_save(&path, &text, &found));
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// Interleaved rounds, so that both cases see the same machine state.
fn ratio() {
    let (path, text, found) = data();
    let (mut plain, mut merged) = (Vec::new(), Vec::new());
    for _ in 0..9 {
        let t = Instant::now();
        divan::black_box(load_and_save(&path, &text));
        plain.push(t.elapsed());
        let t = Instant::now();
        divan::black_box(load_merge_and_save(&path, &text, &found));
        merged.push(t.elapsed());
    }
    let (plain, merged) = (median(plain), median(merged));
    println!(
        "\nstripe ({} bytes), median of 9 interleaved rounds:\n  load and save:            {:>8.1} ms\n  load, merge six, save:   {:>8.1} ms\n  ratio merge / load-save: {:>8.3}",
        text.len(),
        plain.as_secs_f64() * 1e3,
        merged.as_secs_f64() * 1e3,
        merged.as_secs_f64() / plain.as_secs_f64()
    );
}

fn main() {
    divan::main();
    ratio();
}
