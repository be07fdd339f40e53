//! Command line: argument definitions, dispatch and exit codes. One file per subcommand.
//!
//! Exit codes: 0 success; 1 any error, or validation out of tolerance; 2 the model uses ops
//! onnx2ait does not support (every command, so scripts can tell "not yet supported" from
//! "broken"). Errors print as `error: <message>` on stderr, never as a panic.

mod bench;
mod checks;
mod compile;
mod explain;
mod inspect;
mod ops;
mod profile;
mod run;
mod validate;

use clap::{Args, Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "onnx2ait",
    version,
    about = "Compile an ONNX model into a self-contained CUDA inference library (OUT/libmodel.so and OUT/model.h): fp16 tensor-core kernels, chosen by profiling, checked against ONNX Runtime.",
    override_usage = "onnx2ait MODEL -o OUT\n       onnx2ait <COMMAND> [OPTIONS] MODEL",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// `onnx2ait MODEL -o OUT [OPTIONS]` is `onnx2ait compile MODEL -o OUT [OPTIONS]`: every
    /// compile option works without the command name.
    #[command(flatten)]
    compile: Option<compile::CompileArgs>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Import, optimise and lower a model, generate its CUDA sources in OUT and build
    /// OUT/libmodel.so (with OUT/graph.json, kernels.json and summary.txt for review).
    Compile(compile::CompileArgs),
    /// Describe a model: opsets, inputs/outputs, op histogram, parameters, unsupported ops.
    Inspect(inspect::InspectArgs),
    /// Run the model in ONNX Runtime and in the reference executor and compare the outputs.
    Validate(validate::ValidateArgs),
    /// Optimise the model and report fusions, kernel counts, e-graph statistics and cost.
    Explain(explain::ExplainArgs),
    /// List every supported ONNX op, by family.
    Ops(ops::OpsArgs),
    /// Run a compiled model (OUT of `onnx2ait MODEL -o OUT`) on the GPU; write its outputs as .npy.
    Run(run::RunArgs),
    /// Time a compiled model on the GPU at several batch sizes (CUDA graph and plain launches;
    /// each kernel with --kernels).
    Bench(bench::BenchArgs),
    /// Time every candidate kernel instance of the model on this GPU; store the times in the
    /// profile cache that compile uses to choose instances.
    Profile(profile::ProfileArgs),
}

/// A command's failure: what to print and the exit code.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure { code, message: message.into() }
    }
}

/// Exit code for a model that uses unsupported ops.
pub const EXIT_UNSUPPORTED: u8 = 2;

/// True when the error (or one of a list of errors) reports unsupported ops.
pub fn is_unsupported(e: &onnx2ait::Error) -> bool {
    match e {
        onnx2ait::Error::Unsupported { .. } => true,
        onnx2ait::Error::Many(v) => v.iter().any(is_unsupported),
        _ => false,
    }
}

impl From<onnx2ait::Error> for Failure {
    fn from(e: onnx2ait::Error) -> Failure {
        let code = if is_unsupported(&e) { EXIT_UNSUPPORTED } else { 1 };
        Failure::new(code, e.to_string())
    }
}

/// Writes to stdout. A closed pipe (`onnx2ait inspect m.onnx | head`) is not an error worth
/// reporting; other write errors are reported once on stderr.
pub fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            let _ = writeln!(std::io::stderr(), "error: cannot write to stdout: {e}");
        }
    }
}

/// Prints `error: …` on stderr (ignoring a closed stderr).
fn report_error(message: &str) {
    let _ = writeln!(std::io::stderr().lock(), "error: {}", message.trim_end());
}

/// Reads the command line, runs the command, prints any error.
///
/// A panic is a bug in onnx2ait, never the user's fault: it is reported as an internal error in
/// the usual `error:` form, without a backtrace, and exits 1.
pub fn main() -> ExitCode {
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("unknown cause");
        let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        report_error(&format!("internal error: {msg}{at} (a bug in onnx2ait; please report it with the model)"));
    }));
    match std::panic::catch_unwind(run_cli) {
        Ok(code) => code,
        Err(_) => ExitCode::from(1),
    }
}

/// A parallel job count: a whole number from 1 to 1024.
pub fn parse_jobs(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=1024).contains(&n) => Ok(n),
        _ => Err(format!("'{s}' is not a job count (a whole number from 1 to 1024)")),
    }
}

/// Only the subcommands: what the command line would mean without the default command. Parsing
/// with it gives clap's own "unrecognized subcommand … a similar subcommand exists" error.
#[derive(Parser, Debug)]
#[command(name = "onnx2ait")]
struct SubcommandsOnly {
    #[command(subcommand)]
    _command: Command,
}

/// clap's error for a misspelled subcommand (`onnx2ait inspct MODEL`: "tip: a similar subcommand
/// exists: 'inspect'"), when the first argument is not a subcommand nor an existing file but
/// close to a subcommand's name. The default command (`onnx2ait MODEL -o OUT`) would otherwise
/// take the word for a model file.
fn misspelled_subcommand(args: &[std::ffi::OsString]) -> Option<clap::Error> {
    let first = args.get(1)?.to_str()?;
    // A word, not a file name: `onnx2ait inspect.onnx -o OUT` is a missing model, not a typo.
    if first.starts_with('-') || first.contains(['.', '/']) || std::path::Path::new(first).exists() {
        return None;
    }
    let e = SubcommandsOnly::try_parse_from(args).err()?;
    let suggested = e.get(clap::error::ContextKind::SuggestedSubcommand).is_some();
    (e.kind() == clap::error::ErrorKind::InvalidSubcommand && suggested).then_some(e)
}

fn run_cli() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(e) = misspelled_subcommand(&args) {
        let _ = e.print();
        return ExitCode::from(1);
    }
    let cli = match Cli::try_parse_from(&args) {
        Ok(c) => c,
        Err(e) => {
            // Help and version go to stdout with status 0; usage errors print clap's
            // `error: …` with usage and exit 1 (2 is reserved for unsupported ops).
            let code = if e.use_stderr() { 1 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let result = match (cli.command, cli.compile) {
        (Some(Command::Compile(a)), _) => compile::run(&a),
        (Some(Command::Inspect(a)), _) => inspect::run(&a),
        (Some(Command::Validate(a)), _) => validate::run(&a),
        (Some(Command::Explain(a)), _) => explain::run(&a),
        (Some(Command::Ops(a)), _) => ops::run(&a),
        (Some(Command::Run(a)), _) => run::run(&a),
        (Some(Command::Bench(a)), _) => bench::run(&a),
        (Some(Command::Profile(a)), _) => profile::run(&a),
        (None, Some(a)) => compile::run(&a),
        // clap asks for MODEL and -o without a subcommand; kept total rather than unwrapped.
        (None, None) => Err(Failure::new(1, "usage: onnx2ait MODEL -o OUT (see onnx2ait --help)")),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            report_error(&f.message);
            ExitCode::from(f.code)
        }
    }
}

/// The model file argument shared by every command.
#[derive(Args, Debug, Clone)]
pub struct ModelArg {
    /// The .onnx model file.
    #[arg(value_name = "MODEL")]
    pub model: PathBuf,
}

impl ModelArg {
    /// Fails early, with a plain message, when the file is not there.
    pub fn check(&self) -> Result<(), Failure> {
        if !self.model.exists() {
            return Err(Failure::new(1, format!("{}: no such file", self.model.display())));
        }
        if self.model.is_dir() {
            return Err(Failure::new(1, format!("{}: is a directory, expected an .onnx file", self.model.display())));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn bare_model_means_compile() {
        let c = Cli::try_parse_from(["onnx2ait", "m.onnx", "-o", "out"]).unwrap();
        assert!(c.command.is_none());
        let a = c.compile.expect("compile arguments");
        assert_eq!(
            (a.model, a.out, a.arch.as_deref(), a.no_build),
            (PathBuf::from("m.onnx"), PathBuf::from("out"), None, false)
        );
        // Every compile option works without the command name.
        let c = Cli::try_parse_from([
            "onnx2ait",
            "m.onnx",
            "-o",
            "out",
            "--no-build",
            "--arch",
            "sm_80",
            "--max-batch",
            "8",
        ])
        .unwrap();
        let a = c.compile.expect("compile arguments");
        assert!(a.no_build && a.arch.as_deref() == Some("sm_80") && a.max_batch == Some(8));
        let c = Cli::try_parse_from(["onnx2ait", "compile", "m.onnx", "-o", "out"]).unwrap();
        assert!(matches!(c.command, Some(Command::Compile(_))));
        let c =
            Cli::try_parse_from(["onnx2ait", "validate", "m.onnx", "--dim", "N=4", "--seed", "3", "--json"]).unwrap();
        assert!(matches!(c.command, Some(Command::Validate(_))));
        assert!(Cli::try_parse_from(["onnx2ait", "m.onnx"]).is_err(), "-o is required");
        assert!(Cli::try_parse_from(["onnx2ait"]).is_err(), "a model is required");
        assert!(
            Cli::try_parse_from(["onnx2ait", "m.onnx", "-o", "out", "--seed", "3"]).is_err(),
            "not a compile option"
        );
    }
}
