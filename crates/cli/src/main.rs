//! `blockalloc`: the command-line tool.
//!
//! Layers: [`flags`] (raw clap flags, no I/O) → per-subcommand validated
//! settings → the action. Errors travel as `anyhow::Error`; one function,
//! [`error::exit_code`], maps them to exit codes.

mod bench;
mod checks;
mod device;
mod error;
mod flags;
mod plot;
mod remote;
mod replay;
mod serve;
mod trace;

use std::process::ExitCode;

use clap::Parser;

use flags::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("blockalloc: {e:#}");
            ExitCode::from(error::exit_code(&e))
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Bench(args) if args.device.is_some() => device::bench::run(&args),
        Command::Bench(args) if args.remote.is_some() => remote::run(&args),
        Command::Format(args) => device::format::run(&args),
        Command::Inspect(args) => device::inspect::run(&args),
        Command::Check(args) => device::check::run(&args),
        Command::Trace(args) => trace::run(&args),
        Command::Replay(args) => replay::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Bench(args) => bench::run(&bench::BenchSettings::from_args(&args)?),
    }
}
