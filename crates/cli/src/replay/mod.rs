//! `blockalloc replay`: flags in [`args`], validated settings (which need
//! the trace's header for their defaults), then the action.

mod action;
pub mod args;
mod settings;

pub use action::run;
