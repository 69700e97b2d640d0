//! The public options and counters of a [`LeasingAllocator`](crate::LeasingAllocator),
//! and how the server says a lease is gone.

use std::time::Duration;

use tonic::Code;

use crate::client::DeviceId;
use crate::error::ClientError;
use crate::rpc::BearerToken;

/// Every refusal of the server for a lease that ended or is unknown
/// contains this phrase (see `crates/proto/proto/blockalloc/v1/allocator.proto`).
pub const LEASE_GONE_PHRASE: &str = "take a new lease";

/// How a [`LeasingAllocator`](crate::LeasingAllocator) leases and commits.
#[derive(Clone, Debug)]
pub struct LeaseOptions {
    /// The device to allocate on.
    pub device: DeviceId,
    /// Smallest useful lease, in blocks (at least the largest object).
    pub min_blocks: u64,
    /// Lease size to ask for; 0 lets the server size leases from this
    /// client's rate.
    pub want_blocks: u64,
    /// How long pending allocations wait for the background commit when
    /// nobody calls [`LeasingAllocator::commit`](crate::LeasingAllocator::commit).
    pub commit_interval: Duration,
    /// This client's id for the server's lease sizing.
    pub client_id: String,
    /// The bearer token to send instead of the client's own (a server with
    /// tenants wants one), checked when made ([`BearerToken::new`]); `None`
    /// keeps the client's.
    pub token: Option<BearerToken>,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            device: DeviceId::default(),
            min_blocks: 1024,
            want_blocks: 0,
            commit_interval: Duration::from_millis(5),
            client_id: format!("pid-{}", std::process::id()),
            token: None,
        }
    }
}

/// Counters of a [`LeasingAllocator`](crate::LeasingAllocator).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseStats {
    /// Allocations served from a lease, locally.
    pub local_allocations: u64,
    /// Allocations that fell back to a per-call `Allocate`.
    pub remote_allocations: u64,
    /// Leases granted.
    pub leases: u64,
    /// Grants added to the serving lease.
    pub extensions: u64,
    /// Serving leases retired because their unused space had become
    /// slivers that could not serve a request.
    pub rotations: u64,
    /// `Commit` calls sent (resends included).
    pub commit_calls: u64,
    /// Allocations reported lost.
    pub lost: u64,
}

/// True for refusals that mean the lease no longer exists on the server:
/// NOT_FOUND, or FAILED_PRECONDITION with the phrase the schema promises
/// for ended leases.
pub(super) fn lease_gone(e: &ClientError) -> bool {
    match e {
        ClientError::Refused { code, reason } => {
            *code == Code::NotFound
                || (*code == Code::FailedPrecondition && reason.contains(LEASE_GONE_PHRASE))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: Code, reason: &str) -> ClientError {
        ClientError::Refused {
            code,
            reason: reason.into(),
        }
    }

    #[test]
    fn a_lease_is_gone_when_not_found_or_ended_with_the_phrase() {
        assert!(lease_gone(&refused(Code::NotFound, "no lease 7")));
        assert!(lease_gone(&refused(
            Code::FailedPrecondition,
            &format!("lease 7 expired; {LEASE_GONE_PHRASE}")
        )));
    }

    #[test]
    fn other_refusals_leave_the_lease_alone() {
        // A failed precondition without the phrase is about the batch
        // (a double free), not the lease.
        assert!(!lease_gone(&refused(
            Code::FailedPrecondition,
            "double free"
        )));
        assert!(!lease_gone(&refused(
            Code::ResourceExhausted,
            LEASE_GONE_PHRASE
        )));
        assert!(!lease_gone(&ClientError::Unavailable(
            LEASE_GONE_PHRASE.into()
        )));
        assert!(!lease_gone(&ClientError::OutcomeUnknown("cut off".into())));
    }

    #[test]
    fn default_options_lease_at_least_a_thousand_blocks_and_commit_soon() {
        let o = LeaseOptions::default();
        assert_eq!(o.device, DeviceId::Index(0));
        assert_eq!((o.min_blocks, o.want_blocks), (1024, 0));
        assert_eq!(o.commit_interval, Duration::from_millis(5));
        assert_eq!(o.client_id, format!("pid-{}", std::process::id()));
        assert!(o.token.is_none());
    }
}
