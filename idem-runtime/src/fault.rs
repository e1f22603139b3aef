//! Fault points for crash tests (feature `fault-points`, never on in a service's own
//! build): a named point in the attempt where the process can be made to stop, so that a
//! test kills it with SIGKILL at exactly that moment.
//!
//! With the feature, a process whose environment has `IDEM_FAULT_POINT=<name>` prints
//! `idem: fault point <name> reached` to standard error when an attempt gets there, and
//! stops that attempt's thread for good, waiting to be killed. The points:
//!
//! | name | where |
//! |---|---|
//! | `before_commit` | the transactional mode: the handler has written, the record is not written, nothing is committed |
//! | `after_commit` | the transactional mode: the effect and the record are committed, the answer is not sent |
//! | `before_complete` | any other mode: the handler has answered (its effect is done), the record is not completed |
//! | `after_complete` | any other mode: the record is completed, the answer is not sent |

/// The variable that names the fault point to stop at.
#[cfg(feature = "fault-points")]
pub const FAULT_POINT_VAR: &str = "IDEM_FAULT_POINT";

/// Stops here for good when `IDEM_FAULT_POINT` names this point.
#[cfg(feature = "fault-points")]
pub(crate) fn point(name: &'static str) {
    if std::env::var(FAULT_POINT_VAR).is_ok_and(|v| v == name) {
        use std::io::Write;
        let mut stderr = std::io::stderr().lock();
        let _ = writeln!(stderr, "idem: fault point {name} reached");
        let _ = stderr.flush();
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

/// Without the feature `fault-points`, nothing.
#[cfg(not(feature = "fault-points"))]
#[inline(always)]
pub(crate) fn point(_name: &'static str) {}
