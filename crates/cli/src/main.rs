//! `blockalloc`: the command-line tool.
//!
//! Layers: [`flags`] (raw clap flags, no I/O) → per-subcommand validated
//! settings → the action. Errors travel as `anyhow::Error`; one function,
//! [`error::exit_code`], maps them to exit codes.

mod args;
mod bench;
mod checks;
mod cluster;
mod device;
mod error;
mod flags;
mod help;
mod limits;
mod manual;
mod ops_args;
mod out;
mod plot;
mod remote;
mod replay;
mod serve;
mod status;
mod trace;

use std::process::ExitCode;

use clap::CommandFactory;
use flags::{Cli, Command};

fn main() -> ExitCode {
    let cli = flags::parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit());
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of stdout went away (`| head`): it has what it wanted.
        Err(e) if out::is_closed_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("blockalloc: {}", out::error_message(&e));
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
        Command::Reconcile(args) => device::reconcile::run(&args),
        Command::Trace(args) => trace::run(&args),
        Command::Replay(args) => replay::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Status(args) => status::run(&args),
        Command::Token(args) => serve::token(&args),
        Command::Cluster(args) => cluster::run(&args),
        Command::Completions(args) => manual::completions(&args, Cli::command()),
        Command::Man(args) => manual::man(&args, Cli::command()),
        Command::Bench(args) => bench::run(&bench::BenchSettings::from_args(&args)?),
    }
}
