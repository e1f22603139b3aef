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

use std::path::PathBuf;
use std::time::Duration;

use idem_bench::build::{Built, Generated, Profile, Variant};

fn main() {
    let counts = counts();
    let rounds = knob("IDEM_BENCH_BUILD_ROUNDS", 3).max(1);
    let profiles = profiles();
    let repository = std::env::var_os("IDEM_BENCH_IDEM").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."),
        PathBuf::from,
    );
    let repository = repository.canonicalize().unwrap_or(repository);
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
            generated.prepare(profile).unwrap_or_else(|e| panic!("{e}"));
            let mut bare = Vec::new();
            let mut contracted = Vec::new();
            for _ in 0..rounds {
                bare.push(time(&generated, Variant::Bare, profile));
                contracted.push(time(&generated, Variant::Contracted, profile));
            }
            let row = Row::of(&bare, &contracted);
            row.print(profile.name(), &handlers.to_string());
            rows.push(row);
        }
        if let [first, .., last] = rows[..] {
            let label = format!("each of {}→{}", counts[0], counts[counts.len() - 1]);
            last.minus(first).print(profile.name(), &label);
        }
    }
}

fn time(generated: &Generated, variant: Variant, profile: Profile) -> Built {
    generated
        .time(variant, profile)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Medians of the rounds: wall time, CPU time (seconds) and binary size (bytes), bare
/// and contracted.
#[derive(Clone, Copy)]
struct Row {
    bare: [f64; 3],
    contracted: [f64; 3],
}

impl Row {
    fn of(bare: &[Built], contracted: &[Built]) -> Row {
        let medians = |builds: &[Built]| {
            let median = |of: fn(&Built) -> Duration| {
                let mut times: Vec<Duration> = builds.iter().map(of).collect();
                times.sort();
                times[times.len() / 2].as_secs_f64()
            };
            [
                median(|b| b.time),
                median(|b| b.cpu),
                builds[0].binary as f64,
            ]
        };
        Row {
            bare: medians(bare),
            contracted: medians(contracted),
        }
    }

    /// What the handlers between `smaller`'s count and this row's add, per handler set:
    /// the ratio of the two differences is the cost of one contracted handler against
    /// one bare, without what both counts share (the runtime, `main`, the link).
    fn minus(self, smaller: Row) -> Row {
        let sub = |a: [f64; 3], b: [f64; 3]| [a[0] - b[0], a[1] - b[1], a[2] - b[2]];
        Row {
            bare: sub(self.bare, smaller.bare),
            contracted: sub(self.contracted, smaller.contracted),
        }
    }

    fn print(&self, profile: &str, handlers: &str) {
        let [b, bc, bb] = self.bare;
        let [c, cc, cb] = self.contracted;
        let mb = |bytes: f64| bytes / 1_000_000.0;
        println!(
            "| {profile} | {handlers} | {b:.2} s | {c:.2} s | **{:.2}** | {bc:.2} s | {cc:.2} s | **{:.2}** | {:.2} MB | {:.2} MB | **{:.2}** |",
            c / b,
            cc / bc,
            mb(bb),
            mb(cb),
            cb / bb,
        );
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

/// The target directory this bench binary was built into (`<target>/release/deps/build-…`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the bench binary's path");
    exe.ancestors()
        .nth(3)
        .map(PathBuf::from)
        .expect("the bench binary lives in <target>/<profile>/deps")
}
