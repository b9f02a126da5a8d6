//! The `weir` binary: parse the command line and hand over to `cli::run`.

fn main() -> std::process::ExitCode {
    weir::cli::run()
}
