//! The `idem` command; everything it does lives in the library of this package (`idem_cli`).

fn main() -> std::process::ExitCode {
    idem_cli::main()
}
