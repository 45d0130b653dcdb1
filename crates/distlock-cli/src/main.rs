//! `distlock`: the overselling demo, the lock benchmark and operator commands.
//!
//! Exit codes: 0 success; 1 the work failed (a backend error, a failed check); 2 bad input
//! (unknown flag, malformed URL, zero or absurd duration, empty lock name). `run` and `elect`
//! pass on their command's exit status and add 75 (busy), 76 (lost), 126 and 127 (the command
//! cannot be executed, or was not found): [`failure::exit`] lists them all.

mod bench;
mod check;
mod child;
mod cli;
mod demo;
mod exporter;
mod failure;
#[cfg(feature = "zookeeper")]
mod herd;
mod json;
mod operator;
mod progress;
mod run;
mod workers;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    // `run` and `elect` say what happened to the lock in one line of their own; the library's
    // warnings would repeat it.
    let quiet = matches!(cli.command, cli::Command::Run(_) | cli::Command::Elect(_));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new(if quiet { "error" } else { "warn" })
            }),
        )
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("distlock: error: cannot start the async runtime: {error}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            if let Some(line) = failure.report() {
                eprintln!("distlock: {line}");
            }
            ExitCode::from(failure.exit_code())
        }
    }
}
