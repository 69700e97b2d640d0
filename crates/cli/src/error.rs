//! Error kinds the binary tells apart, and the one place that maps errors
//! to exit codes ([`exit_code_of`]), by their [`ErrorClass`].

use blockalloc::ErrorClass;

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

/// What the binary reports for an error: the class of a library error, or
/// one of the outcomes only the binary decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// A library error (or [`UsageError`], as [`ErrorClass::InvalidInput`]).
    Class(ErrorClass),
    /// [`EnginesFailed`].
    EnginesFailed,
    /// [`Inconsistent`].
    Inconsistent,
    /// [`TailDiscarded`].
    TailDiscarded,
}

/// The exit codes and what each means, as `blockalloc --help` prints them;
/// each line names the [`label`]s of the failures that exit with its code.
pub const EXIT_STATUS: &[(u8, &str)] = &[
    (0, "success"),
    (
        1,
        "the device, a file or the server failed or cannot serve now, or the request \
         conflicts with the state of the store, or the server refuses the caller \
         (io, unavailable, conflict, no_space, read_only, denied)",
    ),
    (
        2,
        "usage: bad flags or values, a device that is not a store, already is one or holds \
         other data, or is truncated, a name the server does not know \
         (usage, not_formatted, already_formatted, truncated, not_found)",
    ),
    (
        3,
        "an engine failed: a broken invariant, a refused valid request or a data \
         verification error (engine, bug)",
    ),
    (
        4,
        "a corrupt or inconsistent device, or a damaged or invalid trace \
         (corrupt, inconsistent)",
    ),
    (5, "the device is in use by another writer (busy)"),
    (
        6,
        "`check`: consistent, but recovery discarded a damaged last journal entry \
         of a format version 1 store (tail_discarded)",
    ),
];

/// The failure an error reports. The binary's own outcomes come first; then
/// a busy device anywhere in the chain (however it was wrapped), else the
/// class of the outermost library error in the chain, else I/O.
pub fn failure(err: &anyhow::Error) -> Failure {
    if err.downcast_ref::<UsageError>().is_some() {
        return Failure::Class(ErrorClass::InvalidInput);
    }
    if err.downcast_ref::<EnginesFailed>().is_some() {
        return Failure::EnginesFailed;
    }
    if err.downcast_ref::<Inconsistent>().is_some() {
        return Failure::Inconsistent;
    }
    if err.downcast_ref::<TailDiscarded>().is_some() {
        return Failure::TailDiscarded;
    }
    let mut classes = err.chain().filter_map(class_of);
    let first = classes.next();
    if first == Some(ErrorClass::Busy) || classes.any(|c| c == ErrorClass::Busy) {
        return Failure::Class(ErrorClass::Busy);
    }
    Failure::Class(first.unwrap_or(ErrorClass::Io))
}

/// The class of one error of the chain, when it is a library error.
fn class_of(e: &(dyn std::error::Error + 'static)) -> Option<ErrorClass> {
    use blockalloc_store::device::{CreateError, DeviceBusy};
    if e.downcast_ref::<DeviceBusy>().is_some() {
        return Some(ErrorClass::Busy);
    }
    if let Some(e) = e.downcast_ref::<std::io::Error>() {
        return Some(DeviceBusy::class_of_io(e));
    }
    /// The `class()` of the first of these types `e` is.
    macro_rules! classified {
        ($($ty:ty),+ $(,)?) => {
            $(if let Some(e) = e.downcast_ref::<$ty>() {
                return Some(e.class());
            })+
        };
    }
    classified!(
        blockalloc_store::StoreError,
        blockalloc_store::ReconcileError,
        CreateError,
        blockalloc_trace::TraceError,
        blockalloc_trace::UnknownFormat,
        blockalloc_bench::ReplayError,
        blockalloc_bench::RunError,
        blockalloc_bench::CheckError,
        blockalloc_bench::DurableError,
        blockalloc_bench::PlotError,
        blockalloc_bench::EngineListError,
        blockalloc_bench::SizeSpecError,
        blockalloc_bench::AgingSpecError,
        blockalloc_bench::ChurnSpecError,
        blockalloc_bench::UnknownWorkload,
        blockalloc_bench::UnknownMode,
        blockalloc_bench::RemoteError,
        blockalloc_bench::RemoteConfigError,
        blockalloc_client::ClientError,
        blockalloc::Error,
        blockalloc::GeometryError,
        blockalloc::BuildError,
        blockalloc::VerifyError,
    );
    None
}

/// The exit status of a failure; see [`EXIT_STATUS`].
pub fn exit_code_of(f: Failure) -> u8 {
    match f {
        Failure::Class(c) => match c {
            ErrorClass::InvalidInput
            | ErrorClass::NotFound
            | ErrorClass::NotFormatted
            | ErrorClass::AlreadyExists
            | ErrorClass::Truncated => 2,
            ErrorClass::Bug => 3,
            ErrorClass::Corrupt => 4,
            ErrorClass::Busy => 5,
            ErrorClass::Io
            | ErrorClass::Unavailable
            | ErrorClass::Conflict
            | ErrorClass::Denied
            | ErrorClass::NoSpace
            | ErrorClass::ReadOnly => 1,
            // A class added later is reported as a failure of the run.
            _ => 1,
        },
        Failure::EnginesFailed => 3,
        Failure::Inconsistent => 4,
        Failure::TailDiscarded => 6,
    }
}

/// Exit status for an error; see [`EXIT_STATUS`].
pub fn exit_code(err: &anyhow::Error) -> u8 {
    exit_code_of(failure(err))
}

/// A one-word name of a failure, for JSON output (`"class"`): `usage`,
/// `engine`, `inconsistent`, `tail_discarded`, `already_formatted`, or the
/// [`ErrorClass::name`] of the others (`busy`, `corrupt`, `not_formatted`,
/// `truncated`, `read_only`, `io`, ...).
pub fn label(f: Failure) -> &'static str {
    match f {
        Failure::Class(ErrorClass::InvalidInput) => "usage",
        Failure::Class(ErrorClass::AlreadyExists) => "already_formatted",
        Failure::Class(c) => c.name(),
        Failure::EnginesFailed => "engine",
        Failure::Inconsistent => "inconsistent",
        Failure::TailDiscarded => "tail_discarded",
    }
}

/// The exit status section of `blockalloc --help`, from [`EXIT_STATUS`].
pub fn exit_status_help() -> String {
    let mut s = String::from("EXIT STATUS\n");
    for (code, meaning) in EXIT_STATUS {
        s.push_str(&format!("  {code}  {meaning}\n"));
    }
    s
}

/// The [`label`] of an error's failure.
pub fn error_class(err: &anyhow::Error) -> &'static str {
    label(failure(err))
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockalloc_store::device::{DeviceBusy, LockHolder};
    use blockalloc_store::StoreError;

    fn every_failure() -> Vec<Failure> {
        let mut all: Vec<Failure> = ErrorClass::ALL.into_iter().map(Failure::Class).collect();
        all.extend([
            Failure::EnginesFailed,
            Failure::Inconsistent,
            Failure::TailDiscarded,
        ]);
        all
    }

    #[test]
    fn every_error_class_has_one_documented_exit_code() {
        let codes: Vec<u8> = EXIT_STATUS.iter().map(|&(c, _)| c).collect();
        let mut distinct = codes.clone();
        distinct.dedup();
        assert_eq!(distinct, codes, "each exit code is documented once");
        let labels: Vec<&str> = every_failure().into_iter().map(label).collect();
        let mut unique = labels.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), labels.len(), "distinct labels: {labels:?}");
        for f in every_failure() {
            let name = label(f);
            let lines: Vec<u8> = EXIT_STATUS
                .iter()
                .filter(|(_, meaning)| {
                    meaning
                        .split(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                        .any(|w| w == name)
                })
                .map(|&(c, _)| c)
                .collect();
            assert_eq!(lines, [exit_code_of(f)], "{f:?} ({name})");
        }
        assert!(exit_status_help().contains("  5  the device is in use by another writer"));
    }

    #[test]
    fn library_errors_keep_their_exit_codes_and_labels() {
        use blockalloc::{AllocError, Extent, FreeError};
        use blockalloc_store::ReconcileError;
        let x = Extent::new(5, 1).unwrap();
        let cases: Vec<(anyhow::Error, u8, &str)> = vec![
            (
                StoreError::Corrupt {
                    structure: blockalloc_store::Structure::Checkpoint { slot: 1 },
                    offset: 8192,
                    reason: "bad crc".into(),
                }
                .into(),
                4,
                "corrupt",
            ),
            (
                StoreError::NotFormatted { device: "d".into() }.into(),
                2,
                "not_formatted",
            ),
            (
                StoreError::AlreadyFormatted { device: "d".into() }.into(),
                2,
                "already_formatted",
            ),
            (StoreError::BadOptions("x".into()).into(), 2, "usage"),
            (
                StoreError::ReadOnly {
                    device: "d".into(),
                    action: "commit",
                }
                .into(),
                1,
                "read_only",
            ),
            (
                StoreError::Reconcile(ReconcileError::NotAllocated {
                    index: 1,
                    extent: x,
                    free: x,
                })
                .into(),
                4,
                "corrupt",
            ),
            (
                StoreError::Reconcile(ReconcileError::OutOfOrder {
                    index: 2,
                    extent: x,
                    previous: x,
                })
                .into(),
                2,
                "usage",
            ),
            (
                StoreError::Alloc(AllocError::NoSpace {
                    requested: 1,
                    free: 0,
                    largest_free: 0,
                })
                .into(),
                1,
                "no_space",
            ),
            (
                StoreError::Free(FreeError::NotAllocated {
                    extent: x,
                    overlap: x,
                })
                .into(),
                1,
                "conflict",
            ),
            (
                blockalloc_trace::TraceError::Corrupt {
                    offset: 8,
                    what: "crc".into(),
                }
                .into(),
                4,
                "corrupt",
            ),
            (
                blockalloc_trace::TraceError::io(None, std::io::Error::other("eio")).into(),
                1,
                "io",
            ),
            (
                blockalloc_bench::DurableError::BlocksTooSmall { block_size: 512 }.into(),
                2,
                "usage",
            ),
            (UsageError::new("bad flag").into(), 2, "usage"),
            (
                blockalloc_bench::ReplayError::Trace(blockalloc_trace::TraceError::Corrupt {
                    offset: 8,
                    what: "crc".into(),
                })
                .into(),
                4,
                "corrupt",
            ),
            (
                blockalloc_bench::ReplayError::Trace(blockalloc_trace::TraceError::io(
                    Some("t.trace".into()),
                    std::io::Error::from(std::io::ErrorKind::NotFound),
                ))
                .into(),
                1,
                "io",
            ),
            (
                blockalloc_bench::ReplayError::Free {
                    engine: "segfit",
                    op: 3,
                    object: 1,
                    source: FreeError::NotAllocated {
                        extent: x,
                        overlap: x,
                    },
                }
                .into(),
                3,
                "bug",
            ),
            (
                blockalloc_bench::RunError::Unsupported { what: "this" }.into(),
                2,
                "usage",
            ),
            (
                EnginesFailed {
                    count: 1,
                    first: "x".into(),
                }
                .into(),
                3,
                "engine",
            ),
        ];
        for (e, code, name) in cases {
            assert_eq!((exit_code(&e), error_class(&e)), (code, name), "{e:#}");
        }
    }

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
            assert_eq!(exit_code(&e), 5, "{e:#}");
            assert_eq!(error_class(&e), "busy");
        }
        let other = anyhow::Error::new(std::io::Error::other("disk on fire"));
        assert_eq!(exit_code(&other), 1);
        assert_eq!(error_class(&other), "io");
        let t = anyhow::Error::new(TailDiscarded { entry: "7".into() });
        assert_eq!(exit_code(&t), 6);
        let tr = anyhow::Error::new(StoreError::DeviceTooSmall {
            expected: 1 << 20,
            actual: 4096,
        });
        assert_eq!((exit_code(&tr), error_class(&tr)), (2, "truncated"));
    }
}
