//! Errors that name the file, and the line and column where one is known.

use std::fmt;
use std::path::{Path, PathBuf};

/// A line and a column in a text file, both counted from 1 (the convention of rustc, gcc
/// and editors' `file:line:col` links). Columns count characters, not bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    /// The line, from 1.
    pub line: usize,
    /// The column, from 1.
    pub column: usize,
}

/// One problem with an input of the `idem` command or of this crate's functions.
///
/// Displayed the way compilers print diagnostics, so that editors and CI logs link it:
/// `path:line:col: error: message`, `path: error: message` when no position is known,
/// or `error: message` for a problem with no file (a command-line argument).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// The file the problem is in, as the user named it.
    pub file: Option<PathBuf>,
    /// Where in the file, when the parser says.
    pub position: Option<Position>,
    /// What is wrong and, where it helps, what to write instead; lowercase, no final
    /// period (rustc's style). May span several lines.
    pub message: String,
}

impl Error {
    /// A problem with no file: a command-line argument, or the combination of inputs.
    pub fn new(message: impl Into<String>) -> Error {
        Error {
            file: None,
            position: None,
            message: message.into(),
        }
    }

    /// A problem with the file `file`, position unknown.
    pub fn in_file(file: &Path, message: impl Into<String>) -> Error {
        Error {
            file: Some(file.to_owned()),
            position: None,
            message: message.into(),
        }
    }

    /// A problem at `line:column` (both from 1) of `file`.
    pub fn at(file: &Path, line: usize, column: usize, message: impl Into<String>) -> Error {
        Error {
            file: Some(file.to_owned()),
            position: Some(Position { line, column }),
            message: message.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, self.position) {
            (Some(file), Some(p)) => write!(f, "{}:{}:{}: ", file.display(), p.line, p.column)?,
            (Some(file), None) => write!(f, "{}: ", file.display())?,
            (None, _) => {}
        }
        write!(f, "error: {}", self.message)
    }
}

impl std::error::Error for Error {}

/// Something the `idem` command or this crate's functions found doubtful but not wrong
/// enough to refuse: the output is written, the command succeeds.
///
/// Displayed like [`Error`], with `warning` for `error`: `path:line:col: warning: message`,
/// `path: warning: message`, or `warning: message`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// The file the doubt is about, as the user named it.
    pub file: Option<PathBuf>,
    /// Where in the file, when known.
    pub position: Option<Position>,
    /// What looks wrong and what to check; lowercase, no final period.
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, self.position) {
            (Some(file), Some(p)) => write!(f, "{}:{}:{}: ", file.display(), p.line, p.column)?,
            (Some(file), None) => write!(f, "{}: ", file.display())?,
            (None, _) => {}
        }
        write!(f, "warning: {}", self.message)
    }
}

/// Every problem found in one run: inputs are checked as a whole, so that one run shows
/// all of them (like a compiler), not one per run. Never empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Errors(pub Vec<Error>);

impl Errors {
    /// The errors, in the order they were found.
    pub fn iter(&self) -> std::slice::Iter<'_, Error> {
        self.0.iter()
    }
}

impl From<Error> for Errors {
    fn from(error: Error) -> Errors {
        Errors(vec![error])
    }
}

impl fmt::Display for Errors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Errors {}

/// The line and column (from 1, in characters) of byte `offset` of `text`.
pub(crate) fn position_of(text: &str, offset: usize) -> Position {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    Position {
        line: before.matches('\n').count() + 1,
        column: before[line_start..].chars().count() + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_like_a_compiler() {
        let e = Error::at(Path::new("a/b.rs"), 3, 7, "bad");
        assert_eq!(e.to_string(), "a/b.rs:3:7: error: bad");
        assert_eq!(
            Error::in_file(Path::new("x.json"), "empty").to_string(),
            "x.json: error: empty"
        );
        assert_eq!(Error::new("usage").to_string(), "error: usage");
        let w = Warning {
            file: Some("c.json".into()),
            position: None,
            message: "doubtful".into(),
        };
        assert_eq!(w.to_string(), "c.json: warning: doubtful");
    }

    #[test]
    fn positions_count_characters() {
        let text = "ab\nçd\nef";
        assert_eq!(position_of(text, 0), Position { line: 1, column: 1 });
        assert_eq!(position_of(text, 3), Position { line: 2, column: 1 });
        assert_eq!(position_of(text, 5), Position { line: 2, column: 2 });
        assert_eq!(position_of(text, 100), Position { line: 3, column: 3 });
    }
}
