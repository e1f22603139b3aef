//! What contracts cost the build: the same N handlers bare and under
//! `#[idem::contract(..)]`, each crate's own compile timed side by side (see
//! `idem_bench::build`). `cargo bench -p idem-bench --bench build`.
//!
//! | variable | default | what |
//! |---|---|---|
//! | `IDEM_BENCH_HANDLERS` | 100 | handlers in each crate; several (`10,100`) add a row of what the handlers between the first and the last count cost, without what every count shares (the runtime, `main`, the link) |
//! | `IDEM_BENCH_BUILD_ROUNDS` | 3 | timed builds of each crate and profile (interleaved; medians) |
//! | `IDEM_BENCH_PROFILES` | `debug,release` | the profiles built |
//! | `IDEM_BENCH_IDEM` | this repository | the checkout of idem the contracted crate is built against (another commit's worktree, to compare two) |
//!
//! The generated workspace lives in `<target>/idem-bench-build` (its own target directory
//! there): the first run compiles the dependencies in each profile, later runs reuse them.

use idem_bench::build::{Generated, Profile, repository, target_dir};

fn main() {
    let counts = counts();
    let rounds = knob("IDEM_BENCH_BUILD_ROUNDS", 3).max(1);
    let profiles = profiles();
    let repository = repository();
    let dir = target_dir().join("idem-bench-build");
    println!(
        "build: {counts:?} handlers, {rounds} rounds, idem from {}, in {}",
        repository.display(),
        dir.display()
    );
    println!(
        "| profile | handlers | bare build | contracted build | ratio | bare CPU | contracted CPU | ratio | bare binary | contracted binary | ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for profile in profiles {
        let mut rows = Vec::new();
        for &handlers in &counts {
            let generated = Generated::write(&dir, &repository, handlers)
                .unwrap_or_else(|e| panic!("writing {}: {e}", dir.display()));
            let row = generated
                .compare(profile, rounds)
                .unwrap_or_else(|e| panic!("{e}"));
            row.print(profile.name(), &handlers.to_string());
            rows.push(row);
        }
        if let [first, .., last] = rows[..] {
            let label = format!("each of {}→{}", counts[0], counts[counts.len() - 1]);
            last.minus(first).print(profile.name(), &label);
        }
    }
}

/// `IDEM_BENCH_HANDLERS`: one count, or several (`10,100`), smallest first.
fn counts() -> Vec<usize> {
    let value = std::env::var("IDEM_BENCH_HANDLERS").unwrap_or_else(|_| "100".into());
    let mut counts: Vec<usize> = value
        .split(',')
        .map(|count| {
            count.trim().parse().unwrap_or_else(|_| {
                panic!("IDEM_BENCH_HANDLERS={value:?}: expected counts such as 100 or 10,100")
            })
        })
        .collect();
    counts.sort_unstable();
    counts
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
