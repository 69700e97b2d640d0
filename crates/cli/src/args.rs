//! Raw flag types that several subcommands share (clap derive, no I/O);
//! `flags` and the subcommands' own `args` modules build on them.

use clap::ValueEnum;

/// `contiguous` or `scattered`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// One extent per object (`allocate`).
    Contiguous,
    /// Any number of extents per object (`allocate_scattered`).
    Scattered,
}
