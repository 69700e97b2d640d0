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

/// `check` found problems: exit code 4.
#[derive(Debug, thiserror::Error)]
#[error("the device is inconsistent: {count} problem(s); first: {first}")]
pub struct Inconsistent {
    /// How many problems.
    pub count: usize,
    /// The first one.
    pub first: String,
}

/// Exit status for an error: 2 usage (including a device that is not a
/// store, or already is one), 3 engine failure (data verification included),
/// 4 corrupt or inconsistent device, or a damaged or invalid trace, 1
/// anything else (I/O).
pub fn exit_code(err: &anyhow::Error) -> u8 {
    use blockalloc_store::StoreError;
    if err.downcast_ref::<UsageError>().is_some() {
        2
    } else if err.downcast_ref::<EnginesFailed>().is_some() {
        3
    } else if err.downcast_ref::<Inconsistent>().is_some() {
        4
    } else if let Some(e) = err.downcast_ref::<blockalloc_trace::TraceError>() {
        if e.is_bad_data() {
            4
        } else {
            1
        }
    } else if let Some(e) = err.downcast_ref::<StoreError>() {
        match e {
            StoreError::Corrupt { .. } => 4,
            StoreError::NotFormatted { .. }
            | StoreError::AlreadyFormatted { .. }
            | StoreError::BadOptions(_)
            | StoreError::DeviceTooSmall { .. } => 2,
            StoreError::Reconcile(r) if r.is_bad_input() => 2,
            StoreError::Reconcile(blockalloc_store::ReconcileError::NotAllocated { .. }) => 4,
            _ => 1,
        }
    } else {
        1
    }
}
