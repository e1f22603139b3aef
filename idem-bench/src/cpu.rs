//! The CPU time a loopback run costs, per request, on each side: this process (the
//! service, and a store that lives in it: memory, SQLite) and the store's server
//! (`redis-server`, PostgreSQL's processes), read from Linux's `/proc/<pid>/stat`.
//!
//! On a 2-core machine shared by the load generator, the service and the store's server,
//! requests per second move by ±10 % from one run to the next; the CPU a request costs
//! each process moves far less, so a change of a few percent shows there first. A
//! server's CPU is that of every process of that name on the machine (PostgreSQL's
//! backends, its checkpointer, its vacuum): a run counts them whole, and nothing else
//! should use them meanwhile. Where `/proc` cannot be read (not Linux), nothing is
//! measured.

use std::fs;

/// Where a store's work runs, besides this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    /// In this process (memory, SQLite): all of its CPU is the service's.
    InProcess,
    /// Every process whose name (`/proc/<pid>/comm`) is this: `redis-server`,
    /// `postgres`.
    Named(&'static str),
}

impl Server {
    /// The server of a store of the stores bench: `pg` and `redis` run in processes of
    /// their own, the others in this one.
    #[must_use]
    pub fn of_store(store: &str) -> Server {
        match store {
            "pg" => Server::Named("postgres"),
            "redis" => Server::Named("redis-server"),
            _ => Server::InProcess,
        }
    }
}

/// CPU time used so far (user and system), in clock ticks: this process's, and the
/// server's processes' summed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTime {
    service: u64,
    server: u64,
}

/// The CPU a run cost per request, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PerRequest {
    /// This process: the service, and a store that lives in it.
    pub service_us: f64,
    /// The store's server processes (0 for a store in this process).
    pub server_us: f64,
}

impl PerRequest {
    /// Both sides together.
    #[must_use]
    pub fn total_us(&self) -> f64 {
        self.service_us + self.server_us
    }

    /// The median of each side over `rounds` (each side on its own); `None` for no round.
    #[must_use]
    pub fn median(rounds: &[PerRequest]) -> Option<PerRequest> {
        let side = |f: fn(&PerRequest) -> f64| {
            let mut values: Vec<f64> = rounds.iter().map(f).collect();
            values.sort_by(f64::total_cmp);
            values.get(values.len() / 2).copied()
        };
        Some(PerRequest {
            service_us: side(|r| r.service_us)?,
            server_us: side(|r| r.server_us)?,
        })
    }
}

impl CpuTime {
    /// The CPU time used so far by this process and by `server`'s; `None` when this
    /// process's cannot be read.
    #[must_use]
    pub fn now(server: Server) -> Option<CpuTime> {
        let service = ticks(&fs::read_to_string("/proc/self/stat").ok()?)?;
        let server = match server {
            Server::InProcess => 0,
            Server::Named(name) => named_ticks(name),
        };
        Some(CpuTime { service, server })
    }

    /// What was used since `before`, per request of `requests`; `None` for no request.
    #[must_use]
    pub fn per_request_since(&self, before: &CpuTime, requests: f64) -> Option<PerRequest> {
        if requests < 1.0 {
            return None;
        }
        #[allow(clippy::cast_precision_loss, reason = "tick counts far below 2^52")]
        let us = |now: u64, then: u64| {
            now.saturating_sub(then) as f64 * 1e6 / ticks_per_second() / requests
        };
        Some(PerRequest {
            service_us: us(self.service, before.service),
            server_us: us(self.server, before.server),
        })
    }
}

/// The clock ticks `/proc` counts CPU time in, per second (`sysconf(_SC_CLK_TCK)`).
#[allow(clippy::cast_precision_loss, reason = "a small number")]
fn ticks_per_second() -> f64 {
    rustix::param::clock_ticks_per_second() as f64
}

/// The CPU time of every process named `name`, summed, in clock ticks. A process that
/// ends while the list is read is left out.
fn named_ticks(name: &str) -> u64 {
    let Ok(entries) = fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter(|e| fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim_end() == name))
        .filter_map(|e| ticks(&fs::read_to_string(e.path().join("stat")).ok()?))
        .sum()
}

/// `utime` + `stime` of a `/proc/<pid>/stat` line: the 14th and 15th fields, counted
/// after the command's name, which is in parentheses and may hold spaces or parentheses
/// itself (proc(5)).
fn ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_ascii_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_two_times_after_a_name_with_spaces_and_parentheses() {
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 110 0 0 0 17 5 0 0 20 0 1 0";
        assert_eq!(ticks(stat), Some(22));
        assert_eq!(ticks("4242 (short) S 1"), None);
        assert_eq!(ticks("no name at all"), None);
        assert_eq!(ticks(""), None);
    }

    #[test]
    fn this_process_is_counted_and_its_work_shows() {
        let Some(before) = CpuTime::now(Server::InProcess) else {
            return; // not Linux
        };
        let started = std::time::Instant::now();
        let mut x = 0_u64;
        while started.elapsed() < std::time::Duration::from_millis(120) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = CpuTime::now(Server::InProcess).unwrap();
        let cost = after.per_request_since(&before, 1.0).unwrap();
        assert!(cost.service_us >= 50_000.0, "{cost:?}");
        assert!(cost.server_us.abs() < f64::EPSILON);
        assert!(after.per_request_since(&before, 0.0).is_none());
    }

    #[test]
    fn the_median_takes_each_side_on_its_own() {
        let r = |service_us, server_us| PerRequest {
            service_us,
            server_us,
        };
        let m = PerRequest::median(&[r(3.0, 10.0), r(1.0, 30.0), r(2.0, 20.0)]).unwrap();
        assert_eq!(m, r(2.0, 20.0));
        assert!(PerRequest::median(&[]).is_none());
    }
}
