//! # blockalloc-service
//!
//! The blockalloc allocation service: a gRPC server (tonic) that owns one or
//! more durable stores and hands out their space, per call or through
//! leases. The schema, with every field and error case, is
//! `crates/proto/proto/blockalloc/v1/allocator.proto`; [`pb`] is its
//! generated code (client and server), from `blockalloc-proto`.
//!
//! * [`Server`] — the service over a list of [`ServedDevice`]s, with the
//!   `grpc.health.v1` health service and graceful shutdown (leases end,
//!   stores close).
//! * One owner thread per device (`dev:NAME`) alone changes the device's
//!   store, leases and tenant pools: calls send it commands, and it commits
//!   whatever queued during one sync with the next (group commit without
//!   locks across I/O); see `docs/design.md`.
//! * [`Launch`] — the transport listening before the stores are open
//!   (health NOT_SERVING while they recover and while draining), over TLS
//!   ([`TlsFiles`]) when configured.
//! * [`Metrics`] — Prometheus metrics of calls, journal syncs, devices and
//!   leases, served on `GET /metrics`.
//! * Leases are [`blockalloc_store::Reservation`]s with a deadline: space
//!   set aside in memory, never journaled, so a server crash frees every
//!   uncommitted lease; commits publish pieces of them durably.
//! * [`Limits`] — message size, calls and leases per client, streams per
//!   connection, timeouts; each a [`Config`] value.
//! * [`ServiceError`] — every request error, and the one mapping to gRPC
//!   status codes.
//! * Tenants ([`Server::with_tenants`]): every call carries a bearer token
//!   (`authorization: Bearer TOKEN`); each tenant allocates only inside
//!   regions of the device assigned to it, recorded durably in a sidecar
//!   ownership file, within a quota per device. [`ConfigFile`] reads the
//!   TOML file of `blockalloc serve --config`.

#![deny(unsafe_code)]

mod accept;
mod auth;
mod config;
mod device;
mod error;
mod launch;
mod leases;
mod limits;
mod metrics;
mod owner;
mod ownership;
mod records;
mod server;
mod status;
mod sync;
mod tenants;
pub mod tls;
mod units;

/// The generated protobuf messages, client and server of
/// `blockalloc.v1` (`crates/proto/proto/blockalloc/v1/allocator.proto`), from
/// [`blockalloc_proto`].
pub use blockalloc_proto::{details, pb};
pub use config::{parse_listen_addr, ClusterFile, Config, ConfigError, ConfigFile};
pub use device::ServedDevice;
pub use error::{LeaseEnd, ServiceError};
pub use launch::Launch;
pub use limits::{Identity, Limits, CLIENT_HEADER, MAX_IDENTITY};
pub use metrics::Metrics;
pub use ownership::{region_blocks_for, OwnershipError};
pub use server::{Fence, ServeError, Server};
pub use tenants::{new_token, to_hex, token_sha256, Tenant, TenantConfig, Tenants, TOKEN_PREFIX};
pub use tls::{TlsError, TlsFiles};
pub use units::parse_duration;
