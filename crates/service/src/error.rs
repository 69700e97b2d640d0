//! [`ServiceError`], and the one place that maps errors to gRPC status
//! codes ([`ServiceError::to_status`]). The codes and their meaning are the
//! contract written in `proto/blockalloc/v1/allocator.proto`.

use blockalloc::{AllocError, FreeError};
use blockalloc_store::StoreError;
use tonic::{Code, Status};

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
}

impl std::fmt::Display for LeaseEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LeaseEnd::Expired => "expired (not renewed within its time to live)",
            LeaseEnd::Released => "was released",
            LeaseEnd::Ended => "has ended (it expired or was released)",
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
    /// The gRPC status for this error: the one mapping of the service.
    pub fn to_status(&self) -> Status {
        Status::new(self.code(), self.to_string())
    }

    /// The gRPC status code for this error.
    pub fn code(&self) -> Code {
        match self {
            ServiceError::BadRequest(_) => Code::InvalidArgument,
            ServiceError::UnknownDevice(_) | ServiceError::UnknownLease(_) => Code::NotFound,
            ServiceError::LeaseEnded { .. } | ServiceError::SequenceConflict { .. } => {
                Code::FailedPrecondition
            }
            ServiceError::NoLease(_)
            | ServiceError::QuotaExceeded { .. }
            | ServiceError::TenantFull { .. } => Code::ResourceExhausted,
            ServiceError::PermissionDenied(_) => Code::PermissionDenied,
            ServiceError::Ownership(_) => Code::Unavailable,
            ServiceError::ShuttingDown => Code::Unavailable,
            ServiceError::Store(e) => store_code(e),
        }
    }
}

fn store_code(e: &StoreError) -> Code {
    match e {
        StoreError::Alloc(AllocError::NoSpace { .. }) => Code::ResourceExhausted,
        StoreError::Alloc(_) => Code::InvalidArgument,
        StoreError::Free(FreeError::OutOfRange { .. }) => Code::InvalidArgument,
        StoreError::Free(_)
        | StoreError::FreeConflict { .. }
        | StoreError::FreeMetadata { .. }
        | StoreError::NotReserved { .. } => Code::FailedPrecondition,
        StoreError::TxnTooLarge { .. } => Code::InvalidArgument,
        StoreError::JournalFull { .. } | StoreError::Poisoned { .. } | StoreError::Io { .. } => {
            Code::Unavailable
        }
        _ => Code::Internal,
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
    use blockalloc::Extent;

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
        let ended = ServiceError::LeaseEnded {
            id: 3,
            end: LeaseEnd::Expired,
        };
        assert_eq!(ended.code(), Code::FailedPrecondition);
        assert!(ended.to_string().contains("expired"), "{ended}");
    }
}
