//! # blockalloc-client
//!
//! The client of the blockalloc allocation service (`blockalloc serve`).
//!
//! * [`Client`] — a connection: per-call [`allocate`](Client::allocate),
//!   [`free`](Client::free) and [`status`](Client::status), each durable on
//!   return (about one round trip each; allocations, frees and leases'
//!   commits travel on one `Calls` stream per connection, about two thirds
//!   of a unary call's time).
//! * [`LeasingAllocator`] — holds one lease of the device and allocates
//!   inside it locally with the segfit engine, committing in the
//!   background in batches; the lease grows by extensions and takes back
//!   the space its commits free, so nothing is stranded between leases;
//!   the way to allocate at local speed.
//! * [`Cluster`] — the servers of a cluster on etcd as one service: learns
//!   the topology from any seed server, routes each call to its device's
//!   owner of the moment (and again, with the same request id, to the next
//!   owner after a failover), and places new objects across the devices
//!   ([`Placement`]: labels, a fullness cap).
//! * [`ClusterLeasing`] — leased allocation across a cluster: a lease per
//!   device in use, each following its device's owner through failovers,
//!   moving to another device when one fills.
//! * [`ConnectOptions`] — TLS ([`TlsOptions`]: CA, client certificate,
//!   server name) and refusing plaintext.
//! * Tokens: a server with tenants wants `authorization: Bearer TOKEN` on
//!   every call: [`Client::connect_with_token`], or
//!   [`LeaseOptions::token`] for a leasing allocator.
//! * [`ClientError`] — typed errors: [`ClientError::Unavailable`] (the
//!   call did not run), [`ClientError::OutcomeUnknown`] (cut off after it
//!   was sent: it may have run), [`ClientError::NoSpace`] (with the device's state at the refusal,
//!   [`NoSpaceDetails`], when no free run could hold the object),
//!   [`ClientError::Quota`] (the call would take the caller's tenant past
//!   its quota on the device: [`QuotaDetails`] names tenant, device and
//!   quota),
//!   [`ClientError::Refused`] (with the gRPC code and the server's reason),
//!   [`ClientError::Lost`] (uncommitted allocations whose lease ended),
//!   [`ClientError::Fenced`] (a reply from a stale owner of the device).
//!
//! Through cuts and restarts: every `allocate` and `free` carries a request
//! id and is resent with it after a failure a resend may cure (UNAVAILABLE,
//! DEADLINE_EXCEEDED, CANCELLED, a broken connection, a stale owner's
//! reply), with backoff, for [`Client::with_retry_for`] (30 s by default);
//! the server runs a resent id once. A leasing allocator resends its
//! commits and renewals until the lease's deadline, so a server restart
//! within the lease's TTL loses nothing.
//!
//! The writer's rule: an allocation from a lease is the caller's to write
//! into, uncommitted, until its lease's deadline
//! ([`LeasingAllocator::deadline`], [`LeasingAllocator::allocate_with_deadline`]);
//! after it, commit first. The deadline counts from when the request that
//! last extended the lease was sent, minus a margin the server keeps, so a
//! writer that keeps the rule never writes into space anyone else holds,
//! however late replies come or long the process pauses:
//!
//! ```no_run
//! # async fn demo(alloc: &blockalloc_client::LeasingAllocator) -> Result<(), blockalloc_client::ClientError> {
//! # fn write(_: blockalloc_client::Extent) {}
//! let (e, deadline) = alloc.allocate_with_deadline(64).await?;
//! if deadline.is_some_and(|t| std::time::Instant::now() >= t) {
//!     alloc.commit().await?; // too late to write uncommitted: commit first
//! }
//! write(e);
//! alloc.commit().await?;
//! # Ok(()) }
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), blockalloc_client::ClientError> {
//! use blockalloc_client::{Client, DeviceId, LeaseOptions, LeasingAllocator};
//!
//! let client = Client::connect("127.0.0.1:7878").await?;
//!
//! // Per call: one round trip, durable on return.
//! let objs = client.allocate(&DeviceId::Index(0), 4, 256, None).await?;
//! client.free(&DeviceId::Index(0), &objs).await?;
//!
//! // Leased: local allocation, batched commits.
//! let alloc = LeasingAllocator::new(client.clone(), LeaseOptions::default());
//! let mut mine = Vec::new();
//! for _ in 0..1000 {
//!     mine.push(alloc.allocate(16).await?);
//! }
//! alloc.commit().await?; // all 1000 durable, in a few Commit calls
//! alloc.close().await?; // the unused rest of the lease goes back
//! # Ok(()) }
//! ```
//!
//! Every type the API takes or returns is exported here, so that a caller
//! depends on this crate alone: [`Extent`] (and [`ExtentError`] from
//! [`Extent::new`]), [`ErrorClass`] from [`ClientError::class`], [`Code`],
//! [`NoSpaceDetails`], [`DeviceStatus`], and the generated messages in
//! [`pb`].
//!
//! ```
//! use blockalloc_client::{ClientError, Code, ErrorClass, Extent, ExtentError, NoSpaceDetails};
//!
//! // Extents kept by the caller (in its own metadata) are rebuilt to free them.
//! let kept = Extent::new(4096, 256)?;
//! assert_eq!(kept.end(), 4352);
//! assert!(matches!(Extent::new(7, 0), Err(ExtentError::ZeroLength { start: 7 })));
//!
//! // A refusal for want of space, with the device's state at the refusal.
//! let refusal = ClientError::NoSpace {
//!     reason: "no free run of 256 blocks".into(),
//!     details: Some(NoSpaceDetails { requested_blocks: 256, largest_free_extent: 64, ..Default::default() }),
//! };
//! assert_eq!(refusal.class(), ErrorClass::NoSpace);
//! match refusal.no_space_details() {
//!     Some(d) => assert!(d.largest_free_extent < d.requested_blocks),
//!     None => unreachable!("the refusal carries its details"),
//! }
//! let conflict = ClientError::Refused { code: Code::FailedPrecondition, reason: "double free".into() };
//! assert_eq!(conflict.class(), ErrorClass::Conflict);
//! # Ok::<(), ExtentError>(())
//! ```

#![deny(unsafe_code)]

mod calls;
mod client;
mod cluster;
mod cluster_leasing;
mod connect;
mod error;
mod leasing;
mod retry;
mod rpc;

pub use client::{Client, DeviceId, DeviceStatus, DEFAULT_RETRY_FOR};
pub use cluster::{Cluster, ClusterDevice, Placed, Placement, Topology};
pub use cluster_leasing::ClusterLeasing;
pub use connect::{ConnectOptions, TlsOptions};
pub use error::{ClientError, NoSpaceDetails, QuotaDetails, Result};
pub use leasing::{LeaseOptions, LeaseStats, LeasingAllocator, LEASE_GONE_PHRASE};
pub use rpc::{BearerToken, Rpc};
/// gRPC status codes, as [`ClientError::Refused`] carries them.
pub use tonic::Code;

/// What kind of failure a [`ClientError`] is ([`ClientError::class`]).
pub use blockalloc::ErrorClass;
/// The blocks of an allocation, `[start, start + len)`, as the client hands
/// them out and takes them back.
pub use blockalloc::Extent;
/// Why [`Extent::new`] or [`Extent::from_range`] refused its arguments.
pub use blockalloc::ExtentError;
/// The generated protobuf messages and gRPC client of the service's schema
/// (`blockalloc.v1`): [`Client::rpc`] and [`Client::status_with_leases`]
/// speak them.
pub use blockalloc_proto::pb;
