//! The `onnx2ait` command line; see `cli` for the commands and exit codes.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
