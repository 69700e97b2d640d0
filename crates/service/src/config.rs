//! [`Config`]: the server's tunables.

use std::net::SocketAddr;
use std::time::Duration;

use crate::tls::TlsFiles;
use crate::limits::Limits;

/// Tunables of a server. `Config::default()` suits devices of a few GiB and
/// up with 4 KiB blocks.
#[derive(Clone, Debug)]
pub struct Config {
    /// How long a lease lives without a renewal or a commit.
    pub lease_ttl: Duration,
    /// A new client's first lease, in blocks (when it does not ask for a
    /// size).
    pub lease_initial_blocks: u64,
    /// The largest lease, in blocks.
    pub lease_max_blocks: u64,
    /// A grant is at most `1 / grant_fraction_divisor` of the device's
    /// unleased free space.
    pub grant_fraction_divisor: u64,
    /// Renewals ask for leases back when the unleased free space is below
    /// `capacity / recall_below_divisor`.
    pub recall_below_divisor: u64,
    /// Most objects per Allocate, extents per Free, and extents per Commit
    /// (allocations plus frees).
    pub max_batch: usize,
    /// How often the expiry task looks for expired leases.
    pub expiry_interval: Duration,
    /// Serve gRPC over TLS with these files; `None` serves plaintext.
    pub tls: Option<TlsFiles>,
    /// Refuse to start without [`tls`](Self::tls).
    pub require_tls: bool,
    /// Where `blockalloc serve` serves Prometheus metrics (`/metrics`);
    /// `None` serves none. [`Metrics::serve`](crate::Metrics::serve) takes a
    /// listener instead, so that a caller can bind port 0.
    pub metrics_addr: Option<SocketAddr>,
    /// On shutdown, how long the health service reports NOT_SERVING while
    /// the server still answers, so that load balancers stop sending work
    /// before the listener closes.
    pub drain_grace: Duration,
    /// What one client may hold and ask for at once, and the transport's
    /// bounds.
    pub limits: Limits,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            lease_ttl: Duration::from_secs(10),
            lease_initial_blocks: 4096,
            lease_max_blocks: 1 << 18,
            grant_fraction_divisor: 8,
            recall_below_divisor: 16,
            max_batch: 4096,
            expiry_interval: Duration::from_millis(250),
            tls: None,
            require_tls: false,
            metrics_addr: None,
            drain_grace: Duration::ZERO,
            limits: Limits::default(),
        }
    }
}
