//! `blockalloc completions SHELL` and `blockalloc man`: shell completion
//! scripts (clap_complete) and manual pages in roff (clap_mangen), both made
//! from the same clap definition as `--help`, so they never disagree with it.

use anyhow::Context;

pub use args::{CompletionsArgs, ManArgs};

use crate::out::outln;

pub mod args;

/// Prints the completion script of the command line `cli`.
///
/// # Errors
/// When stdout cannot be written.
pub fn completions(a: &CompletionsArgs, mut cli: clap::Command) -> anyhow::Result<()> {
    // Into a buffer first: clap_complete panics when its writer fails (a
    // closed pipe), `outln!` reports it.
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut cli, "blockalloc", &mut script);
    outln!("{}", String::from_utf8_lossy(&script).trim_end())?;
    Ok(())
}

/// Writes the manual page(s) of the command line `cli`.
///
/// # Errors
/// When a page cannot be written.
pub fn man(a: &ManArgs, cli: clap::Command) -> anyhow::Result<()> {
    // `help` is clap's subcommand, documented by every page's own text.
    let cmd = cli.disable_help_subcommand(true);
    match &a.out_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            clap_mangen::generate_to(cmd, dir)
                .with_context(|| format!("cannot write the pages into {}", dir.display()))?;
        }
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(cmd).render(&mut page)?;
            outln!("{}", String::from_utf8_lossy(&page).trim_end())?;
        }
    }
    Ok(())
}
