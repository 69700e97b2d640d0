//! [`TraceError`]: everything that can go wrong reading or writing a trace.
//!
//! Bad bytes in a trace file are values, never panics: every error names
//! where it was found — a byte offset in a binary trace, a line in a CSV
//! trace, an operation number in either.

use std::fmt;
use std::io;
use std::path::PathBuf;

use blockalloc::ErrorClass;
/// Largest allocation a trace may hold: 2^63 - 1 bytes, the binary
/// format's limit for sizes that are not whole blocks.
pub const MAX_OBJECT_BYTES: u64 = (1 << 63) - 1;

/// Where in a trace something was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Position {
    /// A byte offset in a binary trace.
    Offset(u64),
    /// A 1-based line number in a CSV trace.
    Line(u64),
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Position::Offset(o) => write!(f, "byte offset {o}"),
            Position::Line(l) => write!(f, "line {l}"),
        }
    }
}

/// Why an operation is invalid in its stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidOpKind {
    /// A free of an object that is not live (never allocated, or already
    /// freed).
    FreeOfUnknownObject,
    /// An allocation of an id that is live.
    AllocOfLiveObject,
    /// An allocation larger than
    /// [`MAX_OBJECT_BYTES`].
    ObjectTooLarge {
        /// The size asked for.
        bytes: u64,
    },
}

/// Reading, writing or validating a trace failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The underlying file or stream failed.
    #[error("{}: {source}", path.as_ref().map_or_else(|| "trace".to_string(), |p| p.display().to_string()))]
    Io {
        /// The file, when known.
        path: Option<PathBuf>,
        /// The OS error.
        source: io::Error,
    },
    /// The file starts with the binary magic but a version this build cannot
    /// read.
    #[error("unsupported binary trace version {version} (this build reads version {supported})")]
    UnsupportedVersion {
        /// Version in the file.
        version: u16,
        /// Version this build reads and writes.
        supported: u16,
    },
    /// The binary trace is damaged: a checksum or a structural check failed.
    #[error("corrupt trace at byte offset {offset}: {what}")]
    Corrupt {
        /// Offset of the damaged header, chunk or record.
        offset: u64,
        /// What is wrong.
        what: String,
    },
    /// The binary trace ends before its end marker (an interrupted writer or
    /// a cut copy).
    #[error("trace is truncated at byte offset {offset}: {what}")]
    Truncated {
        /// Where the data stops.
        offset: u64,
        /// What was being read.
        what: &'static str,
    },
    /// A CSV line that does not parse.
    #[error("CSV trace line {line}: {message}")]
    Csv {
        /// 1-based line number.
        line: u64,
        /// What is wrong with it.
        message: String,
    },
    /// A well-formed operation that the stream does not allow.
    #[error("operation {op}{}: {}", at.map_or_else(String::new, |at| format!(" ({at})")), match kind {
        InvalidOpKind::FreeOfUnknownObject => format!("free of object {object}, which is not live"),
        InvalidOpKind::AllocOfLiveObject => format!("allocation of object {object}, which is already live"),
        InvalidOpKind::ObjectTooLarge { bytes } => format!(
            "allocation of {bytes} bytes for object {object}, more than a trace may hold ({} bytes)",
            MAX_OBJECT_BYTES
        ),
    })]
    InvalidOp {
        /// 1-based number of the operation in the stream (round markers
        /// count).
        op: u64,
        /// Where it is in the file, when known.
        at: Option<Position>,
        /// The object id.
        object: u64,
        /// What is wrong.
        kind: InvalidOpKind,
    },
    /// A header that cannot be written (bad metadata key or value, bad
    /// block size).
    #[error("bad trace header: {0}")]
    BadHeader(String),
    /// A value the binary format cannot hold.
    #[error("cannot encode {0}")]
    Unencodable(String),
}

impl TraceError {
    /// An I/O error on `path`.
    pub fn io(path: Option<PathBuf>, source: io::Error) -> Self {
        TraceError::Io { path, source }
    }

    /// What kind of failure this is: [`ErrorClass::Corrupt`] when the
    /// trace's content is at fault ([`is_bad_data`](Self::is_bad_data)),
    /// [`ErrorClass::InvalidInput`] for a header or value that cannot be
    /// written, [`ErrorClass::Io`] when the file failed.
    pub fn class(&self) -> ErrorClass {
        match self {
            TraceError::Io { .. } => ErrorClass::Io,
            TraceError::UnsupportedVersion { .. }
            | TraceError::Corrupt { .. }
            | TraceError::Truncated { .. }
            | TraceError::Csv { .. }
            | TraceError::InvalidOp { .. } => ErrorClass::Corrupt,
            TraceError::BadHeader(_) | TraceError::Unencodable(_) => ErrorClass::InvalidInput,
        }
    }

    /// True when the trace's content is at fault (corrupt, truncated,
    /// malformed, invalid), false for I/O and encoding errors.
    pub fn is_bad_data(&self) -> bool {
        self.class() == ErrorClass::Corrupt
    }
}
