//! `blockalloc bench`: validated settings, then the action.

mod action;
pub mod args;
mod settings;

pub use action::run;
pub use settings::BenchSettings;
