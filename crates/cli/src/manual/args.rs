//! Raw flags of `blockalloc completions` and `blockalloc man` (clap
//! derive, no I/O).

use std::path::PathBuf;

use clap::Args;
use clap_complete::Shell;

/// Flags of `blockalloc completions`.
#[derive(Debug, Args)]
#[command(after_long_help = COMPLETIONS_AFTER)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: Shell,
}

const COMPLETIONS_AFTER: &str = "\
EXAMPLES
  blockalloc completions bash > /etc/bash_completion.d/blockalloc
  blockalloc completions zsh > \"${fpath[1]}/_blockalloc\"
  blockalloc completions fish > ~/.config/fish/completions/blockalloc.fish";

/// Flags of `blockalloc man`.
#[derive(Debug, Args)]
#[command(after_long_help = MAN_AFTER)]
pub struct ManArgs {
    /// Write one page per command and subcommand into this directory
    /// (blockalloc.1, blockalloc-bench.1, blockalloc-trace-gen.1, ...)
    /// instead of the main page to stdout.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
}

const MAN_AFTER: &str = "\
EXAMPLES
  blockalloc man | man -l -
  blockalloc man --out-dir /usr/local/share/man/man1";
