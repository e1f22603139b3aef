//! The commands a build leaves out: they still parse (any arguments), and say which
//! feature brings them instead of being unknown.

use std::ffi::OsString;

use clap::Args;
use idem_codegen::error::{Error, Errors};

/// The arguments of a command this build leaves out: anything, ignored.
#[derive(Debug, Args)]
pub struct Off {
    /// Ignored: the command is not in this build.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        hide = true,
        value_name = "ARGS"
    )]
    pub args: Vec<OsString>,
}

/// `idem ops` in a build without a store driver.
#[cfg(not(feature = "ops"))]
pub mod ops {
    use super::{Off, refuse};

    /// Refuses, naming the features that bring `idem ops`.
    pub fn run(_: Off) -> Result<(), crate::Failure> {
        Err(crate::Failure::Failed(refuse(
            "ops",
            "a store driver: `cargo install idem-cli --features sqlite` (or `postgres`, `redis`)",
        )))
    }
}

/// `idem monday` in a build without the feature `monday`.
#[cfg(not(feature = "monday"))]
pub mod monday {
    use super::{Errors, Off, refuse};

    /// Refuses, naming the feature that brings `idem monday`.
    pub fn run(_: Off) -> Result<(), Errors> {
        Err(refuse(
            "monday",
            "the feature `monday`: `cargo install idem-cli --features monday` (with a driver, such as `--features monday,sqlite`, for `--store`)",
        ))
    }
}

/// `idem COMMAND` is not in this build; what brings it.
fn refuse(command: &str, needs: &str) -> Errors {
    Error::new(format!(
        "`idem {command}` is not in this build of idem: it needs {needs}; the default features have it"
    ))
    .into()
}
