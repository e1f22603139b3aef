//! Every figure of idem's performance goals in one table:
//!
//! ```sh
//! apt-get install wrk                       # the load generator
//! cargo bench -p idem-bench                 # the figures (about 9 minutes)
//! cargo bench -p idem-bench -- --quick      # the harness end to end at a tiny scale
//! ```
//!
//! One run measures, each against its baseline in the same run:
//!
//! | goal | figure | baseline | target | from |
//! |---|---|---|---|---|
//! | one commit | PostgreSQL and SQLite, new keys, transactional mode | the hand-written minimum (the business insert and one key insert in one transaction) | ≥ 0.90 | [`crate::stores`] |
//! | one commit | PostgreSQL's writing transactions a new key (transaction ids taken, per order written) | the minimum's | ≤ 1.1 | [`crate::stores`] |
//! | memory and Redis | memory new keys; Redis new keys | the minimum | ≥ 0.90; ≥ 0.80 | [`crate::stores`] |
//! | replay | a completed key replayed, memory and Redis | the bare handler | ≥ 1.0 | [`crate::stores`] |
//! | (none) | a completed key replayed, PostgreSQL: what the new keys' one read costs it | the bare handler | – | [`crate::stores`] |
//! | (none) | SQLite, PostgreSQL and Redis new keys, the store's calls alone (no HTTP, no enforcement): the ceiling of the two rows above, what the statements themselves cost | the minimum's statements alone | – | [`crate::alone`] |
//! | flat | PostgreSQL new keys with 10 M records; the memory store's one scope with 4 M | the same traffic on an empty store | ≥ 0.90 | [`crate::flat`] |
//! | purge | PostgreSQL new keys while 1 M expired records are purged | the same traffic just before | ≥ 0.90 | [`crate::flat`] |
//! | build | 100 contracted handlers: wall time, binary size; debug and release | the same handlers bare | ≤ 1.3 | [`crate::build`] |
//!
//! Each row gives the ratio, both absolute figures, idem's p99 latency (the loopback
//! figures) and the store's size while it ran. The load generator shares the machine's
//! cores with the servers, so the figures are ratios, not capacity; on a 2-core VM a
//! loopback ratio moves by about ±0.1 from one run to the next. The stores' rows also
//! give the CPU a request cost the service and the store's server together, idem's and
//! the baseline's, and the baseline's over idem's ([`crate::cpu`]): the same ratio read
//! from what each request costs rather than from the rate, which moves less.
//!
//! **Scale.** The full run: `wrk -t2 -c32`, 3 interleaved rounds of 3 s for the stores
//! (and for their calls alone), 3 s windows for the growth and the purge, the records
//! above, 2 timed builds of each crate in each profile. `--quick` (and `cargo test`, which runs this benchmark without
//! `--bench`) runs every part for a second, with 20,000 records, 2 handlers, one debug
//! build: it checks that the harness runs end to end, not the figures, and its table
//! says so. The knobs of the parts (`IDEM_BENCH_ROUNDS`, `IDEM_BENCH_SECONDS`,
//! `IDEM_BENCH_RECORDS`, …) are not read here: each part's own benchmark reads them.
//!
//! PostgreSQL and Redis are the test servers (`IDEM_TEST_DATABASE_URL`,
//! `IDEM_TEST_REDIS_URL`, local by default), through scratch schemas and key prefixes; a
//! server that does not answer leaves its rows out, and the table says which.

use std::time::{Duration, Instant};

use crate::alone;
use crate::build::{Comparison, Generated, Profile};
use crate::flat::{self, LineKind, Purge};
use crate::stores::{self, Form};

/// The size of a run: the full figures, or the harness checked at a tiny scale.
#[derive(Clone, Debug)]
pub struct Scale {
    /// Whether this is the quick form (its figures are not the goals').
    pub quick: bool,
    /// The stores part.
    pub stores: stores::Settings,
    /// The stores' calls without the service.
    pub alone: alone::Settings,
    /// The growth and purge part.
    pub flat: flat::Settings,
    /// Handlers in each generated crate.
    pub handlers: usize,
    /// Timed builds of each crate in each profile.
    pub build_rounds: usize,
    /// The profiles built.
    pub profiles: Vec<Profile>,
}

/// The runs of the stores part the figures use.
const STORE_RUNS: [&str; 14] = [
    "memory bare",
    "memory min",
    "memory idem",
    "memory idem replay",
    "sqlite min",
    "sqlite idem",
    "pg bare",
    "pg min",
    "pg idem",
    "pg idem replay",
    "redis bare",
    "redis min",
    "redis idem",
    "redis idem replay",
];

impl Scale {
    /// The full figures.
    #[must_use]
    pub fn full() -> Scale {
        Scale {
            quick: false,
            stores: stores::Settings {
                rounds: 3,
                seconds: 3,
                only: Some(STORE_RUNS.iter().map(|&r| r.to_owned()).collect()),
                replay_keys: 1000,
            },
            alone: alone::Settings {
                rounds: 3,
                seconds: 3,
                tasks: 32,
                warm_up: 500,
                only: None,
            },
            flat: flat::Settings {
                rounds: 3,
                seconds: 3,
                only: None,
                memory_records: 4_000_000,
                records: 10_000_000,
                purge: 1_000_000,
                purges: vec![Purge::STORE],
            },
            handlers: 100,
            build_rounds: 2,
            profiles: vec![Profile::Debug, Profile::Release],
        }
    }

    /// The harness at a tiny scale: every part runs, no figure means anything.
    #[must_use]
    pub fn quick() -> Scale {
        let full = Scale::full();
        Scale {
            quick: true,
            stores: stores::Settings {
                rounds: 1,
                seconds: 1,
                replay_keys: 50,
                ..full.stores
            },
            alone: alone::Settings {
                rounds: 1,
                seconds: 1,
                warm_up: 50,
                ..full.alone
            },
            flat: flat::Settings {
                rounds: 1,
                seconds: 1,
                memory_records: 20_000,
                records: 20_000,
                purge: 2_000,
                ..full.flat
            },
            handlers: 2,
            build_rounds: 1,
            profiles: vec![Profile::Debug],
        }
    }

    /// [`Scale::quick`] when the arguments hold `--quick`, or lack `--bench` (`cargo
    /// test` runs a benchmark without it; `cargo bench` passes it); [`Scale::full`]
    /// otherwise.
    #[must_use]
    pub fn from_args(args: &[String]) -> Scale {
        let quick = args.iter().any(|a| a == "--quick") || !args.iter().any(|a| a == "--bench");
        if quick { Scale::quick() } else { Scale::full() }
    }
}

/// The stores part's rows: the store, replays or new keys, the baseline form, what the
/// row says, and its goal.
const STORE_FIGURES: [(&str, bool, Form, &str, Target); 7] = [
    (
        "pg",
        false,
        Form::Min,
        "PostgreSQL, new keys, of the minimum",
        Target::AtLeast(0.9),
    ),
    (
        "sqlite",
        false,
        Form::Min,
        "SQLite, new keys, of the minimum",
        Target::AtLeast(0.9),
    ),
    (
        "memory",
        false,
        Form::Min,
        "memory, new keys, of the minimum",
        Target::AtLeast(0.9),
    ),
    (
        "redis",
        false,
        Form::Min,
        "Redis, new keys, of the minimum",
        Target::AtLeast(0.8),
    ),
    (
        "memory",
        true,
        Form::Bare,
        "memory, replay, of the bare handler",
        Target::AtLeast(1.0),
    ),
    (
        "redis",
        true,
        Form::Bare,
        "Redis, replay, of the bare handler",
        Target::AtLeast(1.0),
    ),
    (
        "pg",
        true,
        Form::Bare,
        "PostgreSQL, replay, of the bare handler",
        Target::NoGoal,
    ),
];

/// Which way a figure's target points.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    /// The ratio must reach this (a rate: more is better).
    AtLeast(f64),
    /// The ratio must stay under this (a cost: less is better).
    AtMost(f64),
    /// No goal: the figure is shown so that what a change costs it is seen (a
    /// PostgreSQL replay, which pays for the new keys' one read), or what bounds a goal's
    /// figure (a store's calls without the service).
    NoGoal,
}

impl Target {
    /// Whether `ratio` meets the target; `None` for [`Target::NoGoal`].
    #[must_use]
    pub fn met(self, ratio: f64) -> Option<bool> {
        match self {
            Target::AtLeast(goal) => Some(ratio >= goal),
            Target::AtMost(goal) => Some(ratio <= goal),
            Target::NoGoal => None,
        }
    }

    fn text(self) -> String {
        match self {
            Target::AtLeast(goal) => format!("≥ {goal:.2}"),
            Target::AtMost(goal) => format!("≤ {goal:.2}"),
            Target::NoGoal => "–".to_owned(),
        }
    }
}

/// One row of the table.
#[derive(Clone, Debug)]
pub struct Figure {
    /// What is measured, and against what.
    pub what: String,
    /// idem's absolute figure, with its unit.
    pub idem: String,
    /// The baseline's absolute figure, with its unit.
    pub baseline: String,
    /// idem's over the baseline's.
    pub ratio: f64,
    /// idem's p99 latency in milliseconds, for the loopback figures.
    pub p99_ms: Option<f64>,
    /// The store's size while it ran.
    pub size: String,
    /// The goal.
    pub target: Target,
    /// The stores' rows: the CPU a request cost idem and the baseline (the service and
    /// the store's server together, [`crate::cpu`]) and the baseline's over idem's, a
    /// steadier reading of the same ratio.
    pub cpu: Option<String>,
}

/// What a run measured: its figures, the parts it left out and why, and how long it took.
#[derive(Clone, Debug)]
pub struct Figures {
    /// The scale it ran at.
    pub scale: Scale,
    /// The rows, in the order of the module docs' table.
    pub rows: Vec<Figure>,
    /// The figures that could not be measured, and why (a server that did not answer).
    pub missing: Vec<String>,
    /// Answers that were not 2xx during the growth and purge part (counted, not fatal).
    pub errors: u64,
    /// The whole run's wall time.
    pub took: Duration,
}

/// Runs every part at `scale`.
///
/// # Panics
///
/// As the parts do: `wrk` missing or failing, a variant answering errors under load in
/// the stores part, a generated crate that does not build.
#[must_use]
pub fn run(scale: &Scale) -> Figures {
    crate::wrk::require();
    let started = Instant::now();
    let mut figures = Figures {
        scale: scale.clone(),
        rows: Vec::new(),
        missing: Vec::new(),
        errors: 0,
        took: Duration::ZERO,
    };
    // The build first: after the purge PostgreSQL vacuums for a while, beside whatever
    // runs next, and timed builds are what that would disturb most.
    eprintln!("figures: the build");
    figures.build();
    let build_rows = figures.rows.len();
    // The memory store's growth next, on a quiet machine: right after the stores part
    // (PostgreSQL and Redis still busy behind it) its 4 M-record store read 0.82–0.85 of
    // the empty one, and 0.99 run alone, as here.
    let grown_part = |part: &str| {
        scale.flat.part(part).map(|settings| {
            eprintln!("figures: the {part} store as it grows");
            flat::run(&settings)
        })
    };
    let memory = grown_part("memory");
    eprintln!("figures: the stores ({} runs)", STORE_RUNS.len());
    figures.stores(&stores::run(&scale.stores));
    eprintln!("figures: the stores' calls alone");
    figures.alone(&alone::run(&scale.alone));
    let pg = grown_part("pg");
    let none = flat::Report {
        lines: Vec::new(),
        errors: 0,
    };
    let grown = [memory, pg]
        .into_iter()
        .flatten()
        .fold(none, flat::Report::and);
    figures.errors = grown.errors;
    figures.flat(&grown);
    // The table keeps its order: the stores, the growth, then the build.
    figures.rows.rotate_left(build_rows);
    figures.took = started.elapsed();
    figures
}

impl Figures {
    /// The rows of the stores part.
    fn stores(&mut self, report: &stores::Report) {
        // Each store starts empty but for the warm-up's completed keys; the new-key runs
        // add theirs as they go.
        let fresh = format!("{} warm-up keys, growing", report.settings.replay_keys);
        for (store, replay, against, what, target) in STORE_FIGURES {
            let idem = report.find(store, Form::Idem, replay);
            let base = report.find(store, against, false);
            let (Some(idem), Some(base)) = (idem, base) else {
                self.missing
                    .push(format!("{what}: the {store} runs did not run"));
                continue;
            };
            let cpu = stores::cpu_ratio(base, idem)
                .zip(idem.cpu.zip(base.cpu))
                .map(|(ratio, (idem, base))| {
                    format!(
                        "{:.0} µs; {:.0} µs: **{ratio:.2}**",
                        idem.total_us(),
                        base.total_us()
                    )
                });
            self.rows.push(Figure {
                what: what.to_owned(),
                idem: format!("{:.0} req/s", idem.rps),
                baseline: format!("{:.0} req/s", base.rps),
                ratio: idem.rps / base.rps,
                p99_ms: Some(idem.p99_ms),
                size: fresh.clone(),
                target,
                cpu,
            });
        }
        self.commits(report, &fresh);
    }

    /// The row of PostgreSQL's writing transactions a new key, idem's and the minimum's
    /// (goal 1: one commit, as the minimum makes).
    fn commits(&mut self, report: &stores::Report, size: &str) {
        let what = "PostgreSQL, new keys, writing transactions a request, of the minimum's";
        let idem = report
            .find("pg", Form::Idem, false)
            .and_then(|m| m.writes_per_request);
        let min = report
            .find("pg", Form::Min, false)
            .and_then(|m| m.writes_per_request);
        let (Some(idem), Some(min)) = (idem, min) else {
            self.missing
                .push(format!("{what}: the pg runs did not run"));
            return;
        };
        self.rows.push(Figure {
            what: what.to_owned(),
            idem: format!("{idem:.2} a request"),
            baseline: format!("{min:.2} a request"),
            ratio: idem / min,
            p99_ms: None,
            size: size.to_owned(),
            target: Target::AtMost(1.1),
            cpu: None,
        });
    }

    /// The rows of the stores' calls without the service: what the statements cost, the
    /// ceiling of the loopback rows of the same store.
    fn alone(&mut self, report: &alone::Report) {
        let rows = [
            (
                "sqlite",
                "SQLite, new keys, the store's calls alone (no HTTP), of the minimum's",
            ),
            (
                "pg",
                "PostgreSQL, new keys, the store's calls alone (no HTTP), of the minimum's",
            ),
            (
                "redis",
                "Redis, new keys, the store's calls alone (no HTTP), of the minimum's",
            ),
        ];
        for (store, what) in rows {
            let (Some(idem), Some(base)) = (
                report.rate(store, Form::Idem),
                report.rate(store, Form::Min),
            ) else {
                self.missing
                    .push(format!("{what}: the {store} calls did not run"));
                continue;
            };
            self.rows.push(Figure {
                what: what.to_owned(),
                idem: format!("{idem:.0} keys/s"),
                baseline: format!("{base:.0} keys/s"),
                ratio: idem / base,
                p99_ms: None,
                size: format!("{} warm-up keys, growing", self.scale.alone.warm_up),
                target: Target::NoGoal,
                cpu: None,
            });
        }
    }

    /// The rows of the growth and purge part.
    fn flat(&mut self, report: &flat::Report) {
        let kinds = [
            (
                LineKind::PgGrown,
                "PostgreSQL, new keys, grown store of the empty one",
            ),
            (
                LineKind::PgPurging,
                "PostgreSQL, new keys during a purge, of before it",
            ),
            (
                LineKind::MemoryGrown,
                "memory, one scope's new keys, grown store of the empty one",
            ),
        ];
        for (kind, what) in kinds {
            let found = report.lines.iter().position(|l| l.kind == kind);
            let Some(at) = found.filter(|&at| at > 0) else {
                self.missing.push(format!("{what}: its part did not run"));
                continue;
            };
            let (base, line) = (&report.lines[at - 1], &report.lines[at]);
            let size = match kind {
                LineKind::PgPurging => format!("{} records, purging {}", line.records, line.purged),
                _ => format!("{} records (baseline: empty)", line.records),
            };
            self.rows.push(Figure {
                what: what.to_owned(),
                idem: format!("{:.0} req/s", line.rps),
                baseline: format!("{:.0} req/s", base.rps),
                ratio: line.ratio,
                p99_ms: Some(line.p99),
                size,
                target: Target::AtLeast(0.9),
                cpu: None,
            });
        }
    }

    /// The rows of the build part: wall time and binary size in each profile.
    ///
    /// # Panics
    ///
    /// When the generated workspace cannot be written or does not build.
    fn build(&mut self) {
        let dir = crate::build::target_dir().join("idem-bench-build");
        let handlers = self.scale.handlers;
        let generated = Generated::write(&dir, &crate::build::repository(), handlers)
            .unwrap_or_else(|e| panic!("writing {}: {e}", dir.display()));
        for &profile in &self.scale.profiles {
            let built: Comparison = generated
                .compare(profile, self.scale.build_rounds)
                .unwrap_or_else(|e| panic!("{e}"));
            let [time, _, binary] = built.ratios();
            let name = profile.name();
            let size = format!("{handlers} handlers");
            self.rows.push(Figure {
                what: format!("build, {name}: contracted of bare, wall time"),
                idem: format!("{:.2} s", built.contracted[0]),
                baseline: format!("{:.2} s", built.bare[0]),
                ratio: time,
                p99_ms: None,
                size: size.clone(),
                target: Target::AtMost(1.3),
                cpu: None,
            });
            self.rows.push(Figure {
                what: format!("build, {name}: contracted of bare, binary"),
                idem: format!("{:.1} MB", built.contracted[2] / 1e6),
                baseline: format!("{:.1} MB", built.bare[2] / 1e6),
                ratio: binary,
                p99_ms: None,
                size,
                target: Target::AtMost(1.3),
                cpu: None,
            });
        }
    }

    /// The markdown table, what is missing, and the run's time.
    pub fn print(&self) {
        if self.scale.quick {
            println!("\nQUICK RUN: the harness at a tiny scale; these figures are not the goals'.");
        }
        println!(
            "\n| figure | idem | baseline | ratio | p99 | store | target | met | CPU a request: idem; baseline: ratio |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        for row in &self.rows {
            let p99 = row
                .p99_ms
                .map_or_else(|| "–".to_owned(), |p| format!("{p:.2} ms"));
            let met = match row.target.met(row.ratio) {
                Some(true) => "yes",
                Some(false) => "no",
                None => "–",
            };
            println!(
                "| {} | {} | {} | **{:.2}** | {p99} | {} | {} | {met} | {} |",
                row.what,
                row.idem,
                row.baseline,
                row.ratio,
                row.size,
                row.target.text(),
                row.cpu.as_deref().unwrap_or("–")
            );
        }
        for missing in &self.missing {
            println!("\nnot measured: {missing}");
        }
        println!(
            "\n{} answers not 2xx in the growth and purge part; the run took {:.0?}",
            self.errors, self.took
        );
    }
}
