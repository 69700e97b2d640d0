//! `blockalloc bench`: validated settings, then the action.

mod action;
mod settings;

pub use action::run;
pub use settings::BenchSettings;
