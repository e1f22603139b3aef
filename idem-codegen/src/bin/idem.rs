//! The `idem` command; everything it does lives in `idem_codegen::cli`.

fn main() -> std::process::ExitCode {
    idem_codegen::cli::main()
}
