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

/// `check` found the device consistent, but recovery discarded a damaged
/// entry at the journal's end: exit code 6. After a crash that is the write
/// in flight; it is also what a committed entry damaged later looks like.
#[derive(Debug, thiserror::Error)]
#[error("consistent, but the journal's last entry ({entry}) was damaged and discarded: the write in flight at a crash, or a committed transaction lost to later damage")]
pub struct TailDiscarded {
    /// The discarded entry, as reported.
    pub entry: String,
}

/// Exit code of a device that another writer holds.
pub const EXIT_BUSY: u8 = 5;
/// Exit code of `check` when the journal's damaged tail was discarded.
pub const EXIT_TAIL_DISCARDED: u8 = 6;

/// True when `err` says another writer holds the device: a
/// [`blockalloc_store::StoreError::Busy`], or the device layer's
/// [`blockalloc_store::device::DeviceBusy`] anywhere in the chain.
fn is_busy(err: &anyhow::Error) -> bool {
    use blockalloc_store::device::DeviceBusy;
    use blockalloc_store::StoreError;
    err.chain().any(|e| {
        matches!(
            e.downcast_ref::<StoreError>(),
            Some(StoreError::Busy { .. })
        ) || e.downcast_ref::<DeviceBusy>().is_some()
            || matches!(
                e.downcast_ref::<blockalloc_bench::CheckError>(),
                Some(blockalloc_bench::CheckError::Busy { .. })
            )
            || e.downcast_ref::<std::io::Error>()
                .and_then(DeviceBusy::from_io)
                .is_some()
    })
}

/// Exit status for an error: 2 usage (including a device that is not a
/// store, or already is one or holds other data, or is truncated, a size the
/// file system cannot hold, or object data asked of blocks too small for it),
/// 3 engine failure (data verification included), 4 corrupt or inconsistent
/// device, or a damaged or invalid trace, 5 device in use by another writer,
/// 6 `check` discarded a damaged journal tail, 1 anything else (I/O).
pub fn exit_code(err: &anyhow::Error) -> u8 {
    use blockalloc_store::StoreError;
    if err.downcast_ref::<UsageError>().is_some() {
        2
    } else if err.downcast_ref::<EnginesFailed>().is_some() {
        3
    } else if err.downcast_ref::<Inconsistent>().is_some() {
        4
    } else if err.downcast_ref::<TailDiscarded>().is_some() {
        EXIT_TAIL_DISCARDED
    } else if is_busy(err) {
        EXIT_BUSY
    } else if let Some(e) = err.downcast_ref::<blockalloc_trace::TraceError>() {
        if e.is_bad_data() {
            4
        } else {
            1
        }
    } else if let Some(blockalloc_bench::durable::DurableError::BlocksTooSmall { .. }) =
        err.downcast_ref()
    {
        2
    } else if let Some(e) = err.downcast_ref::<blockalloc_store::device::CreateError>() {
        if e.is_refusal() {
            2
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

/// A one-word class of an error, for JSON output: `usage`, `engine`,
/// `inconsistent`, `tail_discarded`, `busy`, `corrupt`, `not_formatted`,
/// `truncated`, `already_formatted`, `read_only`, `bad_trace` or `io`.
pub fn error_class(err: &anyhow::Error) -> &'static str {
    use blockalloc_store::StoreError;
    if err.downcast_ref::<UsageError>().is_some() {
        "usage"
    } else if err.downcast_ref::<EnginesFailed>().is_some() {
        "engine"
    } else if err.downcast_ref::<Inconsistent>().is_some() {
        "inconsistent"
    } else if err.downcast_ref::<TailDiscarded>().is_some() {
        "tail_discarded"
    } else if is_busy(err) {
        "busy"
    } else if let Some(e) = err.downcast_ref::<blockalloc_trace::TraceError>() {
        if e.is_bad_data() {
            "bad_trace"
        } else {
            "io"
        }
    } else if let Some(e) = err.downcast_ref::<StoreError>() {
        match e {
            StoreError::Corrupt { .. } => "corrupt",
            StoreError::NotFormatted { .. } => "not_formatted",
            StoreError::DeviceTooSmall { .. } => "truncated",
            StoreError::AlreadyFormatted { .. } => "already_formatted",
            StoreError::BadOptions(_) => "usage",
            StoreError::ReadOnly { .. } => "read_only",
            _ => "io",
        }
    } else {
        "io"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockalloc_store::device::{DeviceBusy, LockHolder};
    use blockalloc_store::StoreError;

    #[test]
    fn a_busy_device_has_its_own_exit_code_however_it_is_wrapped() {
        let busy = || DeviceBusy {
            path: "d.img".into(),
            holder: LockHolder::Process(4242),
        };
        let direct = anyhow::Error::new(StoreError::Busy {
            device: "d.img".into(),
            holder: LockHolder::Process(4242),
        });
        let io = std::io::Error::new(std::io::ErrorKind::ResourceBusy, busy());
        let wrapped = anyhow::Error::new(io).context("cannot open the device d.img");
        for e in [direct, wrapped] {
            assert_eq!(exit_code(&e), EXIT_BUSY, "{e:#}");
            assert_eq!(error_class(&e), "busy");
        }
        let other = anyhow::Error::new(std::io::Error::other("disk on fire"));
        assert_eq!(exit_code(&other), 1);
        assert_eq!(error_class(&other), "io");
        let t = anyhow::Error::new(TailDiscarded { entry: "7".into() });
        assert_eq!(exit_code(&t), EXIT_TAIL_DISCARDED);
        let tr = anyhow::Error::new(StoreError::DeviceTooSmall {
            expected: 1 << 20,
            actual: 4096,
        });
        assert_eq!((exit_code(&tr), error_class(&tr)), (2, "truncated"));
    }
}
