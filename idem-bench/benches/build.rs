//! What contracts cost the build: the same N handlers bare and under
//! `#[idem::contract(..)]`, each crate's own compile timed side by side (see
//! `idem_bench::build`). `cargo bench -p idem-bench --bench build`.
//!
//! | variable | default | what |
//! |---|---|---|
//! | `IDEM_BENCH_HANDLERS` | 100 | handlers in each crate |
//! | `IDEM_BENCH_BUILD_ROUNDS` | 3 | timed builds of each crate and profile (interleaved; medians) |
//! | `IDEM_BENCH_PROFILES` | `debug,release` | the profiles built |
//! | `IDEM_BENCH_IDEM` | this repository | the checkout of idem the contracted crate is built against (another commit's worktree, to compare two) |
//!
//! The generated workspace lives in `<target>/idem-bench-build` (its own target directory
//! there): the first run compiles the dependencies in each profile, later runs reuse them.

use std::path::PathBuf;
use std::time::Duration;

use idem_bench::build::{Built, Generated, Profile, Variant};

fn main() {
    let handlers = knob("IDEM_BENCH_HANDLERS", 100);
    let rounds = knob("IDEM_BENCH_BUILD_ROUNDS", 3).max(1);
    let profiles = profiles();
    let repository = std::env::var_os("IDEM_BENCH_IDEM").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."),
        PathBuf::from,
    );
    let repository = repository.canonicalize().unwrap_or(repository);
    let dir = target_dir().join("idem-bench-build");
    let generated = Generated::write(&dir, &repository, handlers)
        .unwrap_or_else(|e| panic!("writing {}: {e}", dir.display()));
    println!(
        "build: {handlers} handlers, {rounds} rounds, in {}",
        dir.display()
    );
    println!(
        "| profile | bare build | contracted build | ratio | bare CPU | contracted CPU | ratio | bare binary | contracted binary | ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for profile in profiles {
        generated.prepare(profile).unwrap_or_else(|e| panic!("{e}"));
        let mut bare = Vec::new();
        let mut contracted = Vec::new();
        for _ in 0..rounds {
            bare.push(time(&generated, Variant::Bare, profile));
            contracted.push(time(&generated, Variant::Contracted, profile));
        }
        row(profile, &bare, &contracted);
    }
}

fn time(generated: &Generated, variant: Variant, profile: Profile) -> Built {
    generated
        .time(variant, profile)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// One table row: the medians of the build times (wall and CPU), the binaries' sizes,
/// their ratios.
fn row(profile: Profile, bare: &[Built], contracted: &[Built]) {
    let median = |builds: &[Built], of: fn(&Built) -> Duration| {
        let mut times: Vec<Duration> = builds.iter().map(of).collect();
        times.sort();
        times[times.len() / 2].as_secs_f64()
    };
    let (b, c) = (median(bare, |b| b.time), median(contracted, |b| b.time));
    let (bc, cc) = (median(bare, |b| b.cpu), median(contracted, |b| b.cpu));
    let (bb, cb) = (bare[0].binary as f64, contracted[0].binary as f64);
    let mb = |bytes: f64| bytes / 1_000_000.0;
    println!(
        "| {} | {b:.2} s | {c:.2} s | **{:.2}** | {bc:.2} s | {cc:.2} s | **{:.2}** | {:.1} MB | {:.1} MB | **{:.2}** |",
        profile.name(),
        c / b,
        cc / bc,
        mb(bb),
        mb(cb),
        cb / bb,
    );
}

fn knob(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?}: expected a count")),
        Err(_) => default,
    }
}

fn profiles() -> Vec<Profile> {
    let value = std::env::var("IDEM_BENCH_PROFILES").unwrap_or_else(|_| "debug,release".into());
    value
        .split(',')
        .map(|name| match name.trim() {
            "debug" => Profile::Debug,
            "release" => Profile::Release,
            other => panic!("IDEM_BENCH_PROFILES: {other:?} is neither debug nor release"),
        })
        .collect()
}

/// The target directory this bench binary was built into (`<target>/release/deps/build-…`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the bench binary's path");
    exe.ancestors()
        .nth(3)
        .map(PathBuf::from)
        .expect("the bench binary lives in <target>/<profile>/deps")
}
