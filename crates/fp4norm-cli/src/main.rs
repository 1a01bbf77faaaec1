//! `fp4norm`: benchmark and verify the fused residual add + RMSNorm + FP4 quantisation.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod args;
mod backend;
mod bench;
mod case;
#[cfg(feature = "cuda")]
mod cuda_backend;
mod format;
mod info;
mod tune;
mod verify;

/// An error for the user: a message that says what went wrong, printed as `error: ...`.
#[derive(Debug)]
pub struct CliError(pub String);

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<fp4norm::Error> for CliError {
    fn from(e: fp4norm::Error) -> Self {
        CliError(e.to_string())
    }
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> Self {
        CliError(format!("I/O error: {e}"))
    }
}

#[derive(Parser)]
#[command(
    name = "fp4norm",
    version,
    about = "Benchmark and verify fp4norm: fused residual add + RMSNorm + FP4 (NVFP4/MXFP4) or FP8 quantisation",
    long_about = "Benchmark and verify fp4norm: fused residual add + RMSNorm + FP4 (NVFP4/MXFP4) \
block quantisation, and its FP8 siblings (per-tensor, per-token, per-group, MXFP8; E4M3/E5M2), \
bit-exact to SPEC.md.\n\n\
  fp4norm bench    time the ops over decode/prefill shapes, report GB/s vs a memcpy, check the bytes\n\
  fp4norm verify   random and edge-case inputs through every backend, byte for byte vs the reference\n\
  fp4norm info     version, formats, layouts and available backends\n\
  fp4norm tune     measure launch shapes on this GPU and write the table fp4norm then uses\n\n\
Exit status: 0 all good, 1 a mismatch or an error, 2 a bad command line."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    // The one-line summaries are `about` attributes, not doc comments: a doc comment here
    // would also reset each subcommand's long help (its argument struct's `long_about`),
    // which is where `--help` documents the formats, groups and measurements.
    #[command(
        about = "Time the FP4 and FP8 ops over a table of shapes; effective GB/s vs a memcpy; check against the reference"
    )]
    Bench(bench::BenchArgs),
    #[command(
        about = "Run random and edge-case inputs (FP4 and FP8 ops) through every backend and compare byte for byte with the reference"
    )]
    Verify(verify::VerifyArgs),
    /// Print the version, formats, layouts and which backends are available.
    Info,
    #[command(
        about = "Measure launch shapes on this GPU and write the fastest per bucket to the table fp4norm then uses"
    )]
    Tune(tune::TuneArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Option values that contradict each other are a bad command line too (exit status 2,
    // as --help says), found before any work.
    let usage = match &cli.command {
        Command::Bench(args) => args.check_usage().err().map(|msg| ("bench", msg)),
        Command::Tune(args) => args.check_usage().err().map(|msg| ("tune", msg)),
        Command::Verify(_) | Command::Info => None,
    };
    if let Some((name, msg)) = usage {
        usage_error(name, msg);
    }
    let result = match cli.command {
        Command::Bench(args) => bench::run(args),
        Command::Verify(args) => verify::run(args),
        Command::Info => info::run(),
        Command::Tune(args) => tune::run(args),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

/// Exits with clap's error for a bad command line (status 2) that `check_usage` found in
/// subcommand `name`, its usage line naming the binary ("Usage: fp4norm bench ...").
fn usage_error(name: &str, msg: String) -> ! {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    // Building the whole command gives each subcommand its full name for the usage line.
    cmd.build();
    let kind = clap::error::ErrorKind::ValueValidation;
    match cmd.find_subcommand_mut(name) {
        Some(sub) => sub.error(kind, msg).exit(),
        None => cmd.error(kind, msg).exit(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_lists_and_formats() {
        let cli = Cli::try_parse_from([
            "fp4norm",
            "bench",
            "--m",
            "1,7",
            "--h",
            "64",
            "--format",
            "nvfp4",
            "--format",
            "b32-e4m3",
            "--dtype",
            "f16",
            "--layout",
            "both",
            "--no-check",
        ])
        .unwrap();
        assert!(matches!(cli.command, Command::Bench(_)));
        let cli = Cli::try_parse_from([
            "fp4norm",
            "bench",
            "--format",
            "nvfp4,fp8-token,mxfp8",
            "--format",
            "fp8-g64-ue8m0-column-major-e5m2",
            "--fp8-scale",
            "-0.5",
            "--fp8-scale-floor",
            "4.3597e-6",
        ])
        .unwrap();
        let Command::Bench(b) = cli.command else {
            unreachable!()
        };
        assert!(b.check_usage().is_ok());
        assert!(Cli::try_parse_from(["fp4norm", "bench", "--format", "fp5"]).is_err());
        assert!(
            Cli::try_parse_from(["fp4norm", "bench", "--format", "fp8-g32-f32-swizzled"]).is_err()
        );
        assert!(Cli::try_parse_from(["fp4norm", "bench", "--device", "tpu"]).is_err());
        // Values that start with '-' are values, not options.
        let cli = Cli::try_parse_from([
            "fp4norm",
            "bench",
            "--global-scale",
            "-0.5",
            "--weight-bias",
            "-1e-3",
            "--m",
            "1,16",
        ])
        .unwrap();
        let Command::Bench(b) = cli.command else {
            unreachable!()
        };
        assert!(b.check_usage().is_ok());
        for (arg, value) in [("--m", "-1"), ("--h", "-64"), ("--reps", "-3")] {
            let e = Cli::try_parse_from(["fp4norm", "bench", arg, value])
                .err()
                .expect("a negative count is rejected");
            assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{arg}");
        }
        for device in ["auto", "cpu", "cuda"] {
            let cli = Cli::try_parse_from(["fp4norm", "verify", "--device", device]).unwrap();
            assert!(matches!(cli.command, Command::Verify(_)));
        }
        assert!(Cli::try_parse_from(["fp4norm", "verify", "--device", "tpu"]).is_err());
        assert!(Cli::try_parse_from(["fp4norm", "verify", "--group", "fp8-ti"]).is_ok());
        let e = Cli::try_parse_from(["fp4norm", "verify", "--group", "nosuchgroup"])
            .err()
            .expect("an unknown group is rejected");
        assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation);
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn contradicting_values_are_usage_errors() {
        for args in [
            &["--m", "0"][..],
            &["--h", "100"],
            &["--h", "48", "--format", "mxfp4"],
            &["--reps", "0"],
            &["--copy-mib", "0"],
            &["--copy-mib", "17592186044416"],
            &["--copy-mib", "18446744073709551615"],
            &["--m", "4294967296", "--h", "4294967296"],
            &["--m", "1", "--h", "4611686018427387904"],
            &["--eps", "-1"],
            &["--h", "48", "--format", "mxfp8"],
            &["--h", "4160", "--format", "fp8-group128"],
            &["--h", "64", "--format", "fp8-token-ue8m0-swizzled"],
            &["--h", "0", "--format", "fp8-tensor"],
            &["--format", "fp8-token", "--fp8-scale-floor", "-1"],
            &["--format", "fp8-token", "--fp8-scale-floor", "nan"],
            &["--format", "fp8-tensor", "--fp8-scale", "inf"],
            &["--format", "fp8-tensor", "--fp8-scale", "-inf"],
            &["--global-scale", "nan"],
            &["--global-scale", "-inf"],
            &["--global-scale", "inf"],
            &["--eps", "-1e-3"],
            &["--weight-bias", "-inf"],
            &["--device", "cpu", "--pdl"],
        ] {
            let cli = Cli::try_parse_from(["fp4norm", "bench"].iter().chain(args)).unwrap();
            let Command::Bench(b) = cli.command else {
                unreachable!()
            };
            assert!(b.check_usage().is_err(), "{args:?} accepted");
        }
        let cli = Cli::try_parse_from(["fp4norm", "bench", "--h", "48"]).unwrap();
        let Command::Bench(b) = cli.command else {
            unreachable!()
        };
        assert!(b.check_usage().unwrap_err().contains("mxfp4"));
    }
}
