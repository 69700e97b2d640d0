//! [`ServiceError`], and the one place that maps errors to gRPC status
//! codes ([`ServiceError::to_status`]). The codes and their meaning are the
//! contract written in `crates/proto/proto/blockalloc/v1/allocator.proto`.

use blockalloc::ErrorClass;
use blockalloc_store::StoreError;
use tonic::{Code, Status};

use crate::{details, pb};

/// Why a lease can no longer be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseEnd {
    /// Not renewed within its time to live.
    Expired,
    /// Given back by its holder.
    Released,
    /// No longer in the table: it expired or was released earlier.
    Ended,
    /// Never granted by this server run (e.g. granted before a restart),
    /// where a live lease is required (an extension).
    Unknown,
}

impl std::fmt::Display for LeaseEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LeaseEnd::Expired => "expired (not renewed within its time to live)",
            LeaseEnd::Released => "was released",
            LeaseEnd::Ended => "has ended (it expired or was released)",
            LeaseEnd::Unknown => "is unknown to this server (granted before a restart?)",
        })
    }
}

/// Any error of a service request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// A malformed request (zero length, out of range, too large a batch).
    #[error("invalid request: {0}")]
    BadRequest(String),
    /// No device by that name or index.
    #[error("no device {0} on this server (see Status for the list)")]
    UnknownDevice(String),
    /// A lease id this server run never granted (e.g. one granted before a
    /// restart).
    #[error("lease {0} is unknown to this server (granted before a restart?); take a new lease")]
    UnknownLease(u64),
    /// A lease that expired or was released.
    #[error("lease {id} {end}; take a new lease")]
    LeaseEnded {
        /// The lease.
        id: u64,
        /// How it ended.
        end: LeaseEnd,
    },
    /// A commit's sequence number is neither the last committed one nor
    /// the next, or a resent sequence carries other contents.
    #[error("lease {id}: commit sequence {got} conflicts: {why}")]
    SequenceConflict {
        /// The lease.
        id: u64,
        /// The sequence number sent.
        got: u64,
        /// What was expected.
        why: String,
    },
    /// Too little unleased free space to grant a lease.
    #[error("no lease granted: {0}; allocate per call instead")]
    NoLease(String),
    /// A limit of the server or of the caller is reached (see
    /// [`crate::Limits`]); the message names it and its value.
    #[error("limit reached: {0}")]
    OverLimit(String),
    /// The caller has too many calls running or waiting; retry later.
    #[error("too busy: {0}; retry later")]
    Busy(String),
    /// The caller has seen a newer owner epoch of the device than this
    /// server's: this server is a stale owner.
    #[error(
        "fenced: device {device} has epoch {epoch} here, the caller has seen epoch {seen}: \
         another server took the device over; retry there"
    )]
    Fenced {
        /// The device.
        device: String,
        /// Its epoch on this server.
        epoch: u64,
        /// The epoch the caller has seen.
        seen: u64,
    },
    /// This server lost (or may have lost) its cluster ownership lease and
    /// acknowledges nothing until it renews it.
    #[error(
        "this server cannot renew its cluster lease and acknowledges nothing; \
         retry on the device's owner"
    )]
    SelfFenced,
    /// The caller's tenant may not use this device or extent, or the lease
    /// belongs to another tenant.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// The request would take the tenant past its quota on the device.
    #[error("quota of tenant {tenant} on device {device} is {quota_bytes} bytes: {held_bytes} held (allocated or leased), {asked_bytes} more asked")]
    QuotaExceeded {
        /// The tenant.
        tenant: String,
        /// The device.
        device: String,
        /// Its quota there.
        quota_bytes: u64,
        /// Bytes it holds: allocated plus leased and unused.
        held_bytes: u64,
        /// Bytes the request asked for.
        asked_bytes: u64,
    },
    /// The tenant's regions have no room and every region of the device is
    /// assigned.
    #[error("no space for tenant {tenant} on device {device}: its regions hold no {blocks} blocks of the shape asked and every region of the device is assigned")]
    TenantFull {
        /// The tenant.
        tenant: String,
        /// The device.
        device: String,
        /// Blocks asked.
        blocks: u64,
    },
    /// Region ownership could not be recorded durably (nothing was handed
    /// out).
    #[error("{0}")]
    Ownership(String),
    /// The server is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The store refused or failed the request.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ServiceError {
    /// The gRPC status for this error: the one mapping of the service. A
    /// quota refusal carries a [`pb::QuotaDetails`], so that clients tell
    /// it from a device without room (both are `RESOURCE_EXHAUSTED`).
    pub fn to_status(&self) -> Status {
        let status = Status::new(self.code(), self.to_string());
        match self {
            ServiceError::QuotaExceeded {
                tenant,
                device,
                quota_bytes,
                held_bytes,
                asked_bytes,
            } => details::with_quota(
                status,
                &pb::QuotaDetails {
                    tenant: tenant.clone(),
                    device: device.clone(),
                    quota_bytes: *quota_bytes,
                    held_bytes: *held_bytes,
                    asked_bytes: *asked_bytes,
                },
            ),
            _ => status,
        }
    }

    /// The gRPC status code for this error.
    pub fn code(&self) -> Code {
        code_of(self.class())
    }

    /// What kind of failure this is; see [`ErrorClass`].
    pub fn class(&self) -> ErrorClass {
        match self {
            ServiceError::BadRequest(_) => ErrorClass::InvalidInput,
            ServiceError::UnknownDevice(_) | ServiceError::UnknownLease(_) => ErrorClass::NotFound,
            ServiceError::LeaseEnded { .. } | ServiceError::SequenceConflict { .. } => {
                ErrorClass::Conflict
            }
            ServiceError::NoLease(_)
            | ServiceError::OverLimit(_)
            | ServiceError::QuotaExceeded { .. }
            | ServiceError::TenantFull { .. } => ErrorClass::NoSpace,
            ServiceError::PermissionDenied(_) => ErrorClass::Denied,
            ServiceError::ShuttingDown
            | ServiceError::Busy(_)
            | ServiceError::Fenced { .. }
            | ServiceError::SelfFenced
            | ServiceError::Ownership(_) => ErrorClass::Unavailable,
            ServiceError::Store(e) => e.class(),
        }
    }
}

/// The gRPC status code of each class, as `allocator.proto` documents them.
/// The server opens its devices before it serves, so a request meets a
/// device that is not a store, busy, truncated or corrupt only when the
/// device changed under it: `Internal`, like a broken invariant.
fn code_of(class: ErrorClass) -> Code {
    match class {
        ErrorClass::InvalidInput => Code::InvalidArgument,
        ErrorClass::NotFound => Code::NotFound,
        ErrorClass::Conflict => Code::FailedPrecondition,
        ErrorClass::NoSpace => Code::ResourceExhausted,
        ErrorClass::Denied => Code::PermissionDenied,
        ErrorClass::Unavailable | ErrorClass::Io => Code::Unavailable,
        ErrorClass::NotFormatted
        | ErrorClass::AlreadyExists
        | ErrorClass::Truncated
        | ErrorClass::Busy
        | ErrorClass::ReadOnly
        | ErrorClass::Corrupt
        | ErrorClass::Bug => Code::Internal,
        // A class added later is a failure the contract does not name yet.
        _ => Code::Internal,
    }
}

/// Most characters of a caller's string quoted back in an error message:
/// a reply's message travels in an HTTP/2 header, which clients cap (16 KiB
/// by default), so a long name echoed whole would turn a clear refusal into
/// a protocol error.
const QUOTED_CHARS: usize = 64;

/// `s` for an error message: debug-quoted, cut after [`QUOTED_CHARS`]
/// characters.
pub(crate) fn quoted(s: &str) -> String {
    match s.char_indices().nth(QUOTED_CHARS) {
        None => format!("{s:?}"),
        Some((i, _)) => format!("{:?}... ({} bytes)", &s[..i], s.len()),
    }
}

impl From<ServiceError> for Status {
    fn from(e: ServiceError) -> Self {
        e.to_status()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockalloc::{AllocError, Extent, FreeError};

    #[test]
    fn store_errors_map_to_the_documented_codes() {
        let x = Extent::new(5, 1).unwrap();
        let cases = [
            (
                StoreError::Alloc(AllocError::ZeroLength),
                Code::InvalidArgument,
            ),
            (
                StoreError::Alloc(AllocError::NoSpace {
                    requested: 1,
                    free: 0,
                    largest_free: 0,
                }),
                Code::ResourceExhausted,
            ),
            (
                StoreError::Free(FreeError::OutOfRange {
                    extent: x,
                    capacity: 1,
                }),
                Code::InvalidArgument,
            ),
            (
                StoreError::NotReserved { extent: x },
                Code::FailedPrecondition,
            ),
            (
                StoreError::FreeMetadata {
                    extent: x,
                    meta_blocks: 9,
                },
                Code::FailedPrecondition,
            ),
            (
                StoreError::Poisoned {
                    cause: "disk".into(),
                },
                Code::Unavailable,
            ),
        ];
        for (e, code) in cases {
            let s = ServiceError::from(e).to_status();
            assert_eq!(s.code(), code, "{}", s.message());
            assert!(!s.message().is_empty());
        }
        assert_eq!(ServiceError::UnknownLease(3).code(), Code::NotFound);
        assert_eq!(quoted("dev0"), "\"dev0\"");
        let long = quoted(&"n".repeat(1 << 20));
        assert!(
            long.len() < 100 && long.ends_with("(1048576 bytes)"),
            "{long}"
        );
        let ended = ServiceError::LeaseEnded {
            id: 3,
            end: LeaseEnd::Expired,
        };
        assert_eq!(ended.code(), Code::FailedPrecondition);
        assert!(ended.to_string().contains("expired"), "{ended}");
    }

    #[test]
    fn every_error_class_has_the_code_the_schema_documents() {
        for class in ErrorClass::ALL {
            let want = match class {
                ErrorClass::InvalidInput => Code::InvalidArgument,
                ErrorClass::NotFound => Code::NotFound,
                ErrorClass::Conflict => Code::FailedPrecondition,
                ErrorClass::NoSpace => Code::ResourceExhausted,
                ErrorClass::Denied => Code::PermissionDenied,
                ErrorClass::Unavailable | ErrorClass::Io => Code::Unavailable,
                _ => Code::Internal,
            };
            assert_eq!(code_of(class), want, "{class}");
        }
        let journal_full = ServiceError::from(StoreError::JournalFull { reason: "x".into() });
        assert_eq!(journal_full.code(), Code::Unavailable);
        assert_eq!(ServiceError::ShuttingDown.code(), Code::Unavailable);
        assert_eq!(
            ServiceError::NoLease("x".into()).code(),
            Code::ResourceExhausted
        );
    }
}
