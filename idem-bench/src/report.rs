//! The table: medians of the rounds, ratios to bare, and resident memory per completed key.

use crate::driver::Knobs;
use crate::load::Path;
use crate::serve::{Stats, Variant};
use crate::wrk::median;

/// Every round's requests per second and p99 (ms), by path and variant.
#[derive(Default)]
pub struct Measures(Vec<(Path, Variant, Vec<f64>, Vec<f64>)>);

impl Measures {
    /// Adds one run's figures.
    pub fn push(&mut self, path: Path, variant: Variant, rps: f64, p99: f64) {
        if let Some(m) = self.0.iter_mut().find(|m| m.0 == path && m.1 == variant) {
            m.2.push(rps);
            m.3.push(p99);
        } else {
            self.0.push((path, variant, vec![rps], vec![p99]));
        }
    }

    /// The medians of requests per second and of p99 of one path and variant.
    #[must_use]
    pub fn medians(&self, path: Path, variant: Variant) -> Option<(f64, f64)> {
        let m = self.0.iter().find(|m| m.0 == path && m.1 == variant)?;
        Some((median(&mut m.2.clone()), median(&mut m.3.clone())))
    }
}

/// One variant's memory figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Memory {
    /// Resident memory before any load, kB.
    pub start_kb: u64,
    /// Resident memory after the rounds, kB.
    pub end_kb: u64,
    /// Completed keys: idem's records; the orders of the other two (under
    /// `axum-idempotent` every order has its response cached; bare keeps only orders).
    pub keys: usize,
    /// `(end − start) / keys`, kB.
    pub per_key_kb: f64,
    /// `(end − start − bare's kB per order × orders) / keys − stored body`, kB: what a
    /// completed key costs beyond its order and the bytes it must give back. `None` for
    /// bare itself, or when bare was not run.
    pub beyond_kb: Option<f64>,
}

/// The memory figures of each variant (in the order of `variants`); `stored_bytes` is the
/// 201's body and `Location` header, the bytes any replay must keep.
#[must_use]
pub fn memory(
    variants: &[Variant],
    start: &[Stats],
    end: &[Stats],
    stored_bytes: usize,
) -> Vec<Memory> {
    let delta = |i: usize| end[i].rss_kb.saturating_sub(start[i].rss_kb) as f64;
    let bare_per_order = variants
        .iter()
        .position(|&v| v == Variant::Bare)
        .filter(|&i| end[i].orders > 0)
        .map(|i| delta(i) / end[i].orders as f64);
    variants
        .iter()
        .enumerate()
        .map(|(i, &variant)| {
            let keys = if variant == Variant::Idem {
                end[i].records
            } else {
                end[i].orders
            };
            let per_key = |kb: f64| {
                if keys == 0 {
                    f64::NAN
                } else {
                    kb / keys as f64
                }
            };
            Memory {
                start_kb: start[i].rss_kb,
                end_kb: end[i].rss_kb,
                keys,
                per_key_kb: per_key(delta(i)),
                beyond_kb: bare_per_order
                    .filter(|_| variant != Variant::Bare)
                    .map(|bare| {
                        per_key(delta(i) - bare * end[i].orders as f64)
                            - stored_bytes as f64 / 1024.0
                    }),
            }
        })
        .collect()
}

/// Everything the printout needs.
pub struct Report<'a> {
    /// The run's settings.
    pub knobs: &'a Knobs,
    /// The command that reproduces it.
    pub command: String,
    /// When it started (UTC).
    pub started: String,
    /// `uptime` before the servers started.
    pub load_before: String,
    /// `uptime` after the rounds.
    pub load_after: String,
    /// Each server's variant and pid.
    pub servers: Vec<(Variant, u32)>,
    /// The rounds' figures.
    pub measures: Measures,
    /// `/stats` of each server before any load.
    pub start: Vec<Stats>,
    /// `/stats` of each server after the rounds.
    pub end: Vec<Stats>,
    /// The 201's body and `Location` header, in bytes.
    pub stored_bytes: usize,
}

impl Report<'_> {
    /// Prints the table and its notes on stdout.
    pub fn print(&self) {
        let k = self.knobs;
        let variants: Vec<Variant> = self.servers.iter().map(|s| s.0).collect();
        println!("\n`{}`", self.command);
        println!(
            "\nPOST /orders on loopback, `wrk -t2 -c{} -d{}s --latency`, {} interleaved rounds, medians; {} clients; started {}",
            k.connections, k.seconds, k.rounds, k.clients, self.started
        );
        println!("load before: {}", self.load_before);
        println!("load after:  {}", self.load_after);
        let pids: Vec<String> = self
            .servers
            .iter()
            .map(|(v, pid)| format!("{} {pid}", v.name()))
            .collect();
        println!("server pids: {}\n", pids.join(", "));

        let mut header = "| path |".to_owned();
        let mut rule = "|---|".to_owned();
        for v in &variants {
            header.push_str(&format!(" {} |", v.name()));
            rule.push_str("---|");
        }
        println!("{header}\n{rule}");
        let row = |label: String, cell: &dyn Fn(Variant) -> String| {
            let cells: Vec<String> = variants.iter().map(|&v| cell(v)).collect();
            println!("| {label} | {} |", cells.join(" | "));
        };
        for path in Path::ALL {
            let m = |v: Variant| self.measures.medians(path, v);
            let bare = m(Variant::Bare).map(|(rps, _)| rps);
            row(format!("{}, requests/s", path.label()), &|v| {
                m(v).map_or_else(dash, |(rps, _)| format!("{rps:.0}"))
            });
            let ratio_label = if path == Path::Replay {
                "ratio to bare on the same stream"
            } else {
                "ratio to bare"
            };
            row(
                format!("{}, {ratio_label}", path.label()),
                &|v| match (m(v), bare) {
                    (Some(_), Some(_)) if v == Variant::Bare => "1".to_owned(),
                    (Some((rps, _)), Some(bare)) => format!("{:.2}", rps / bare),
                    _ => dash(),
                },
            );
            row(format!("{}, p99 latency", path.label()), &|v| {
                m(v).map_or_else(dash, |(_, p99)| format!("{p99:.2} ms"))
            });
        }
        let memory = memory(&variants, &self.start, &self.end, self.stored_bytes);
        let at = |v: Variant| variants.iter().position(|&x| x == v);
        let mem = |v: Variant| at(v).map(|i| memory[i]);
        row("resident memory before any load".to_owned(), &|v| {
            mem(v).map_or_else(dash, |m| size(m.start_kb))
        });
        row("completed keys (bare: orders)".to_owned(), &|v| {
            mem(v).map_or_else(dash, |m| m.keys.to_string())
        });
        row("resident memory after the rounds".to_owned(), &|v| {
            mem(v).map_or_else(dash, |m| {
                if v == Variant::Bare {
                    format!("{} (orders only)", size(m.end_kb))
                } else {
                    size(m.end_kb)
                }
            })
        });
        row("resident memory per completed key".to_owned(), &|v| {
            mem(v).map_or_else(dash, |m| format!("{:.2} KB", m.per_key_kb))
        });
        row(
            "per key beyond the order and the stored body (goal for idem: ≤ 0.5 KB)".to_owned(),
            &|v| {
                mem(v)
                    .and_then(|m| m.beyond_kb)
                    .map_or_else(dash, |kb| format!("{kb:.2} KB"))
            },
        );
        println!(
            "\nMemory: each server is a process of its own; RSS is its `VmRSS`, read from its \
             `GET /stats` before any load and after the rounds. Completed keys are idem's \
             `MemoryStore` records, and the orders of the other two (bare keeps no keys; under \
             axum-idempotent each order's response sits in its session). Per key = RSS growth / \
             keys. Beyond = (RSS growth − bare's growth per order × the variant's orders) / keys \
             − {} bytes (the 201's body and its `Location` header, name and value: what a \
             replay must give back), in KB of 1024 bytes.",
            self.stored_bytes
        );
        for (i, v) in variants.iter().enumerate() {
            println!(
                "{}: {} orders, {} records at the end",
                v.name(),
                self.end[i].orders,
                self.end[i].records
            );
        }
    }
}

fn dash() -> String {
    "–".to_owned()
}

/// kB as MB (or GB past 1,000 MB), decimal as the issue's table has them.
fn size(kb: u64) -> String {
    let mb = kb as f64 * 1024.0 / 1e6;
    if mb >= 1000.0 {
        format!("{:.2} GB", mb / 1000.0)
    } else {
        format!("{mb:.0} MB")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(orders: usize, records: usize, rss_kb: u64) -> Stats {
        Stats {
            orders,
            records,
            rss_kb,
        }
    }

    #[test]
    fn memory_beyond_the_order_and_the_body() {
        let variants = Variant::ALL;
        let start = [stats(0, 0, 1000); 3];
        // bare: 1 kB per order; axum-idempotent: 2 kB per key; idem: 3 kB per record,
        // with a 512-byte stored body.
        let end = [
            stats(1000, 0, 2000),
            stats(1000, 0, 3000),
            stats(1000, 1000, 4000),
        ];
        let m = memory(&variants, &start, &end, 512);
        assert_eq!(m[0].keys, 1000);
        assert!((m[0].per_key_kb - 1.0).abs() < 1e-9);
        assert_eq!(m[0].beyond_kb, None);
        assert!((m[1].beyond_kb.unwrap_or(f64::NAN) - 0.5).abs() < 1e-9);
        assert!((m[2].per_key_kb - 3.0).abs() < 1e-9);
        assert!((m[2].beyond_kb.unwrap_or(f64::NAN) - 1.5).abs() < 1e-9);
    }

    #[test]
    fn sizes_as_the_issue_writes_them() {
        assert_eq!(size(1_562_500), "1.60 GB");
        assert_eq!(size(16_000), "16 MB");
    }
}
