//! Error kinds the binary tells apart, and the one place that maps errors
//! to exit codes.

/// Bad flags or values, or a request that cannot run at all: exit code 2
/// (clap uses 2 for the flags it refuses itself).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(String);

impl UsageError {
    /// An error with this message.
    pub fn new(msg: impl Into<String>) -> Self {
        UsageError(msg.into())
    }
}

/// One or more engines failed (a broken invariant or a refused valid
/// request): exit code 3.
#[derive(Debug, thiserror::Error)]
#[error("{count} engine run(s) failed; first: {first}")]
pub struct EnginesFailed {
    /// How many engines failed.
    pub count: usize,
    /// The first failure's message.
    pub first: String,
}

/// Exit status for an error: 2 usage, 3 engine failure, 1 anything else
/// (I/O).
pub fn exit_code(err: &anyhow::Error) -> u8 {
    if err.downcast_ref::<UsageError>().is_some() {
        2
    } else if err.downcast_ref::<EnginesFailed>().is_some() {
        3
    } else {
        1
    }
}
