//! Parity between the compiler and the command: every compile-fail case of the macro
//! (`tests/ui/fail/*/*.rs`, with the compiler's output kept in `.stderr` snapshots) is run
//! through `idem check`, which reads the source with the same parser, and must report the
//! same errors of idem's own at the same lines and columns. Errors that rustc itself
//! reports (`error[E…]`: an unknown field, an unresolved path) are the compiler's checks
//! of generated code; the command does not see types, so it must report nothing for them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `(line, column, message with its whitespace folded)`
type Reported = (usize, usize, String);

fn fold(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// idem's own errors in a trybuild snapshot: `error: …` blocks (not `error[E…]`), each
/// followed by `--> file:line:column`.
fn from_snapshot(stderr: &str) -> Vec<Reported> {
    let mut out = Vec::new();
    let mut message: Option<String> = None;
    for line in stderr.lines() {
        if let Some(rest) = line.strip_prefix("error: ") {
            message = Some(rest.to_owned());
        } else if line.starts_with("error[") || line.starts_with("warning") {
            message = None;
        } else if let Some(location) = line.trim_start().strip_prefix("--> ") {
            if let Some(message) = message.take() {
                let mut parts = location.rsplitn(3, ':');
                let column = parts.next().and_then(|c| c.parse().ok()).expect("a column");
                let line = parts.next().and_then(|l| l.parse().ok()).expect("a line");
                out.push((line, column, fold(&message)));
            }
        } else if let Some(message) = message.as_mut() {
            message.push(' ');
            message.push_str(line);
        }
    }
    out.sort();
    out
}

/// The errors `idem check` prints: `file:line:column: error: …`, continued on indented
/// lines.
fn from_command(stdout_and_stderr: &str) -> Vec<Reported> {
    let mut out: Vec<Reported> = Vec::new();
    for line in stdout_and_stderr.lines() {
        if let Some((location, message)) = line.split_once(": error: ") {
            let mut parts = location.rsplitn(3, ':');
            let column = parts.next().and_then(|c| c.parse().ok()).expect("a column");
            let line = parts.next().and_then(|l| l.parse().ok()).expect("a line");
            out.push((line, column, message.to_owned()));
        } else if let Some(last) = out.last_mut() {
            last.2.push(' ');
            last.2.push_str(line);
        }
    }
    for reported in &mut out {
        reported.2 = fold(&reported.2);
    }
    out.sort();
    out
}

fn cases() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/ui/fail");
    let mut cases = Vec::new();
    for category in std::fs::read_dir(&root).expect("the ui cases exist") {
        for entry in std::fs::read_dir(category.unwrap().path()).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") {
                cases.push(path);
            }
        }
    }
    cases.sort();
    cases
}

#[test]
fn idem_check_reports_what_the_compiler_reports() {
    let cases = cases();
    assert!(
        cases.len() >= 20,
        "the compile-fail cases are found ({})",
        cases.len()
    );
    let mut compared = 0;
    for case in cases {
        let snapshot = std::fs::read_to_string(case.with_extension("stderr"))
            .unwrap_or_else(|e| panic!("{} has no .stderr snapshot: {e}", case.display()));
        let expected = from_snapshot(&snapshot);
        let output = Command::new(env!("CARGO_BIN_EXE_idem"))
            .arg("check")
            .arg("--src")
            .arg(&case)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let reported = from_command(&text);
        assert_eq!(
            reported,
            expected,
            "{}: `idem check` and the compiler disagree\n{text}",
            case.display()
        );
        assert_eq!(
            output.status.success(),
            expected.is_empty(),
            "{}: exit status {:?}",
            case.display(),
            output.status
        );
        compared += expected.len();
    }
    assert!(
        compared >= 25,
        "idem's own errors were compared ({compared})"
    );
}
