//! [`Config`]: the server's tunables, and [`ConfigFile`]: the TOML file of
//! `blockalloc serve --config FILE` (tunables in `[server]`, devices, the
//! listen address, `[[tenant]]` entries).
//!
//! Every field of [`Config`] can be set in `[server]` under its own name;
//! a missing key keeps its default. Durations are a number of seconds
//! (`30`, `0.25`) or a string with a unit (`"400ms"`, `"2m"`); sizes are a
//! number of bytes or a string with a unit as flags take them (`"64MiB"`,
//! `"1TiB"`). Unknown keys and bad values are errors naming the key and the
//! file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::limits::Limits;
use crate::tenants::TenantConfig;
use crate::tls::TlsFiles;
use crate::units::{bytes, seconds};

/// Tunables of a server. `Config::default()` suits devices of a few GiB and
/// up with 4 KiB blocks.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// How long a lease lives without a renewal or a commit.
    #[serde(deserialize_with = "seconds")]
    pub lease_ttl: Duration,
    /// A new client's first lease, in blocks (when it does not ask for a
    /// size).
    pub lease_initial_blocks: u64,
    /// The largest lease, in blocks; 0 (the default) picks it per device:
    /// 1/128 of the device, at least 2^18 blocks (1 GiB of 4 KiB blocks).
    pub lease_max_blocks: u64,
    /// A grant is at most `1 / grant_fraction_divisor` of the device's
    /// unleased free space.
    pub grant_fraction_divisor: u64,
    /// Renewals ask for leases back when the unleased free space is below
    /// `capacity / recall_below_divisor`.
    pub recall_below_divisor: u64,
    /// No lease is granted or extended while the unleased free space is
    /// below `per_call_objects` × the request's `min_blocks` (its largest
    /// object; at most `lease_initial_blocks`) × the live leases + 1; such a
    /// refusal starts a recall. The
    /// rest of the device is allocated per call, so that one engine packs
    /// the slivers every lease's engine hands back.
    pub per_call_objects: u64,
    /// Nor while it is below `per_call_fragments` × the fragments the
    /// leases' holders report (free blocks in runs of at most 1024 blocks
    /// inside their leases, `CommitRequest.fragment_blocks`): after the
    /// recall one engine places those fragments, and it needs long runs
    /// beside them to wait for requests that fit them. 0 ignores the
    /// reports. Larger values pack a device with frees more fully and send
    /// more of its last allocations per call.
    pub per_call_fragments: u64,
    /// Most objects per Allocate, extents per Free, and extents per Commit
    /// (allocations plus frees).
    pub max_batch: usize,
    /// How often the expiry task looks for expired leases.
    #[serde(deserialize_with = "seconds")]
    pub expiry_interval: Duration,
    /// Serve gRPC over TLS with these files; `None` serves plaintext.
    pub tls: Option<TlsFiles>,
    /// Refuse to start without [`tls`](Self::tls).
    pub require_tls: bool,
    /// Where `blockalloc serve` serves Prometheus metrics (`/metrics`);
    /// `None` serves none. [`Metrics::serve`](crate::Metrics::serve) takes a
    /// listener instead, so that a caller can bind port 0. In the file:
    /// `HOST:PORT` (see [`parse_listen_addr`]).
    #[serde(deserialize_with = "listen_addr")]
    pub metrics_addr: Option<SocketAddr>,
    /// On shutdown, how long the health service reports NOT_SERVING while
    /// the server still answers, so that load balancers stop sending work
    /// before the listener closes.
    #[serde(deserialize_with = "seconds")]
    pub drain_grace: Duration,
    /// On shutdown, after `drain_grace`: how long a `Calls` stream is kept
    /// open for its client to close its side (the server tells it to with
    /// a stop notice). Calls it sends meanwhile are answered UNAVAILABLE
    /// and do not run; past it the stream ends, and a call sent then may be
    /// left without a reply. Also bounds, with `request_timeout`, how long
    /// the stop waits for the transport to finish its calls.
    #[serde(deserialize_with = "seconds")]
    pub stop_grace: Duration,
    /// What one client may hold and ask for at once, and the transport's
    /// bounds.
    pub limits: Limits,
    /// With tenants: the size of the regions a device is cut into, in
    /// bytes (a tenant allocates only inside regions assigned to it); 0
    /// picks it from the capacity ([`crate::region_blocks_for`]). A device
    /// keeps the region size it was first served with.
    #[serde(deserialize_with = "bytes")]
    pub region_bytes: u64,
    /// Background zeroing of device files that `format` left unwritten
    /// (`blockalloc_store::zero`): the most of its time the zeroing thread
    /// of each such device spends writing, above 0 and at most 1; 0 does
    /// not zero.
    pub zero_share: f64,
}

/// The largest `per_call_fragments`: beyond it the per-call end would start
/// while most of the free space is still leased.
pub const MAX_PER_CALL_FRAGMENTS: u64 = 64;

/// The largest `stop_grace`, in seconds.
pub const MAX_STOP_GRACE_SECS: f64 = 3600.0;

impl Default for Config {
    fn default() -> Self {
        Config {
            lease_ttl: Duration::from_secs(10),
            lease_initial_blocks: 4096,
            lease_max_blocks: 0,
            grant_fraction_divisor: 8,
            recall_below_divisor: 16,
            per_call_objects: 8,
            per_call_fragments: 2,
            max_batch: 4096,
            expiry_interval: Duration::from_millis(250),
            tls: None,
            require_tls: false,
            metrics_addr: None,
            drain_grace: Duration::ZERO,
            stop_grace: Duration::from_secs(2),
            limits: Limits::default(),
            region_bytes: 0,
            zero_share: 0.1,
        }
    }
}

/// A lease's margin is `1 / LEASE_MARGIN_DIVISOR` of its TTL.
const LEASE_MARGIN_DIVISOR: u32 = 20;

impl Config {
    /// A lease's margin: clients stop writing into a lease's uncommitted
    /// space this long before its TTL runs out (counted from when they
    /// sent the request that last extended it), and the server keeps an
    /// expired lease's space out of use for as long after. A twentieth of
    /// the TTL: far above any clock's rate drift, and it scales with the
    /// TTL an operator picks.
    pub fn lease_margin(&self) -> Duration {
        self.lease_ttl / LEASE_MARGIN_DIVISOR
    }

    /// Checks the values; the error names the first bad key and why.
    ///
    /// # Errors
    /// `(key, reason)` of the first bad value.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        let secs = |d: Duration| d.as_secs_f64();
        if !(0.05..=86_400.0).contains(&secs(self.lease_ttl)) {
            return Err(("lease_ttl", "must be between 0.05 and 86400 seconds".into()));
        }
        if !(0.001..=60.0).contains(&secs(self.expiry_interval)) {
            return Err((
                "expiry_interval",
                "must be between 0.001 and 60 seconds".into(),
            ));
        }
        if self.limits.max_connections == 0 {
            return Err(("limits.max_connections", "must be at least 1".into()));
        }
        if !(0.001..=3600.0).contains(&secs(self.limits.handshake_timeout)) {
            return Err((
                "limits.handshake_timeout",
                "must be between 0.001 and 3600 seconds".into(),
            ));
        }
        if secs(self.stop_grace) > MAX_STOP_GRACE_SECS {
            return Err((
                "stop_grace",
                format!("must be at most {MAX_STOP_GRACE_SECS} seconds"),
            ));
        }
        for (key, v) in [
            ("lease_initial_blocks", self.lease_initial_blocks),
            ("grant_fraction_divisor", self.grant_fraction_divisor),
            ("recall_below_divisor", self.recall_below_divisor),
            ("per_call_objects", self.per_call_objects),
            ("max_batch", self.max_batch as u64),
        ] {
            if v == 0 {
                return Err((key, "must be at least 1".into()));
            }
        }
        if self.per_call_fragments > MAX_PER_CALL_FRAGMENTS {
            return Err((
                "per_call_fragments",
                format!("must be at most {MAX_PER_CALL_FRAGMENTS} (0 ignores the fragments)"),
            ));
        }
        if !(0.0..=1.0).contains(&self.zero_share) {
            return Err((
                "zero_share",
                format!("{} is not from 0 to 1", self.zero_share),
            ));
        }
        if self.region_bytes != 0 && !self.region_bytes.is_power_of_two() {
            return Err((
                "region_bytes",
                format!(
                    "{} is not a power of two (or 0 for automatic)",
                    self.region_bytes
                ),
            ));
        }
        Ok(())
    }
}

/// What every listen address looks like, for the errors that refuse one.
const HOST_PORT: &str =
    "give HOST:PORT, e.g. 127.0.0.1:7878 (this host only) or 0.0.0.0:7878 (every interface)";

/// A listening address from `HOST:PORT`: an IP address (`[…]` around
/// IPv6) or a host name, and a port. A host name is resolved now; its
/// first IPv4 address is taken, else its first address (`localhost:7878`
/// listens on 127.0.0.1). A bare port is refused rather than guessed:
/// this host only and every interface are both plausible, and the wrong
/// one either hides the server or exposes it.
///
/// ```
/// use blockalloc_service::parse_listen_addr;
/// assert_eq!(parse_listen_addr("0.0.0.0:7878").unwrap().to_string(), "0.0.0.0:7878");
/// assert!(parse_listen_addr("localhost:7878").unwrap().ip().is_loopback());
/// assert!(parse_listen_addr("7878").unwrap_err().contains("HOST:PORT"));
/// ```
///
/// # Errors
/// A message naming the value and the form wanted.
pub fn parse_listen_addr(s: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    if s.parse::<u16>().is_ok() {
        return Err(format!("{s:?} is a port without a host; {HOST_PORT}"));
    }
    let port_ok = s
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !port_ok {
        return Err(format!("{s:?} is not HOST:PORT; {HOST_PORT}"));
    }
    let addrs: Vec<SocketAddr> = s
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {s:?}: {e}; {HOST_PORT}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("{s:?} resolves to no address; {HOST_PORT}"))
}

/// An optional listen address given as `HOST:PORT` ([`parse_listen_addr`]).
fn listen_addr<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    match Option::<String>::deserialize(d)? {
        Some(s) => parse_listen_addr(&s)
            .map(Some)
            .map_err(serde::de::Error::custom),
        None => Ok(None),
    }
}

/// The configuration file of `blockalloc serve --config FILE`.
///
/// ```
/// use blockalloc_service::ConfigFile;
/// let f = ConfigFile::parse(r#"
/// listen = "127.0.0.1:7878"
/// devices = ["/srv/dev0.img"]
///
/// [server]
/// lease_ttl = 30
///
/// [[tenant]]
/// name = "alice"
/// token_sha256 = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
/// quota_bytes = 1073741824
/// "#, "serve.toml".as_ref())?;
/// assert_eq!(f.server.lease_ttl.as_secs(), 30);
/// assert_eq!(f.tenants[0].name, "alice");
/// # Ok::<(), blockalloc_service::ConfigError>(())
/// ```
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// The address to listen on: `HOST:PORT` (see [`parse_listen_addr`]).
    #[serde(default, deserialize_with = "listen_addr")]
    pub listen: Option<SocketAddr>,
    /// The devices to serve, in index order.
    #[serde(default)]
    pub devices: Vec<PathBuf>,
    /// The directory of the region ownership files (`NAME.owners`, one per
    /// device); unset: the directory of each device file.
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// The server's tunables.
    #[serde(default)]
    pub server: Config,
    /// The tenants; none keeps the server open to every caller.
    #[serde(default, rename = "tenant")]
    pub tenants: Vec<TenantConfig>,
    /// Membership of a cluster on etcd (`[cluster]`); `serve`'s flags of
    /// the same names override each key.
    #[serde(default)]
    pub cluster: Option<ClusterFile>,
}

/// The `[cluster]` table of a configuration file (see `serve --etcd`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// etcd endpoints, `HOST:PORT`.
    #[serde(default)]
    pub etcd: Vec<String>,
    /// The cluster's name.
    pub name: String,
    /// This server's name (default: the advertised address).
    #[serde(default)]
    pub server_name: Option<String>,
    /// The address clients reach this server at (default: the bound
    /// listen address).
    #[serde(default)]
    pub advertise: Option<String>,
    /// The etcd lease's TTL in whole seconds (default 5; 2–3 600).
    #[serde(default)]
    pub etcd_ttl: Option<u64>,
    /// Wait for devices owned elsewhere and take them over.
    #[serde(default)]
    pub standby: bool,
    /// This server's labels, `key=value` (e.g. `zone=a`), which clients
    /// can restrict placement to.
    #[serde(default)]
    pub labels: Vec<String>,
    /// TLS to etcd: the CA of its certificates (PEM).
    #[serde(default)]
    pub etcd_ca: Option<PathBuf>,
    /// This server's client certificate for etcd (PEM).
    #[serde(default)]
    pub etcd_cert: Option<PathBuf>,
    /// The key of `etcd_cert` (PEM).
    #[serde(default)]
    pub etcd_key: Option<PathBuf>,
}

/// Why a configuration file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the configuration file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Not TOML, an unknown key, or a value of the wrong type.
    #[error("{path}: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The parser's message (with the key, line and column).
        message: String,
    },
    /// A value of the right type that is not allowed.
    #[error("{path}: {key}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The key, e.g. `server.lease_ttl` or `tenant[1].token_sha256`.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl ConfigFile {
    /// Reads and checks `path`.
    ///
    /// # Errors
    /// [`ConfigError`].
    pub fn load(path: &Path) -> Result<ConfigFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        ConfigFile::parse(&text, path)
    }

    /// Parses and checks `text`, read from `path` (for messages).
    ///
    /// # Errors
    /// [`ConfigError::Syntax`], [`ConfigError::Invalid`].
    pub fn parse(text: &str, path: &Path) -> Result<ConfigFile, ConfigError> {
        let f: ConfigFile = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })?;
        let invalid = |key: String, reason: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            key,
            reason,
        };
        f.server
            .validate()
            .map_err(|(k, why)| invalid(format!("server.{k}"), why))?;
        crate::tenants::validate(&f.tenants).map_err(|(k, why)| invalid(k, why))?;
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";
    const TOKEN_B: &str = "fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9";

    #[test]
    fn sizes_and_durations_take_units_or_plain_numbers() {
        let text = format!(
            "[server]\nlease_ttl = \"400ms\"\nexpiry_interval = \"10ms\"\n\
             drain_grace = \"1.5s\"\nregion_bytes = \"4MiB\"\n\
             [server.limits]\nmax_message_bytes = \"8MiB\"\nrequest_timeout = \"2m\"\n\
             keepalive_interval = 20\nkeepalive_timeout = 2.5\n\
             [[tenant]]\nname = \"a\"\ntoken_sha256 = \"{TOKEN}\"\nquota_bytes = \"1TiB\"\n\
             [[tenant]]\nname = \"b\"\ntoken_sha256 = \"{TOKEN_B}\"\nquota_bytes = 1073741824\n"
        );
        let f = ConfigFile::parse(&text, Path::new("c.toml")).unwrap();
        assert_eq!(f.server.lease_ttl, Duration::from_millis(400));
        assert_eq!(f.server.expiry_interval, Duration::from_millis(10));
        assert_eq!(f.server.drain_grace, Duration::from_millis(1500));
        assert_eq!(f.server.region_bytes, 4 << 20);
        assert_eq!(f.server.limits.max_message_bytes, 8 << 20);
        assert_eq!(f.server.limits.request_timeout, Duration::from_secs(120));
        assert_eq!(f.server.limits.keepalive_interval, Duration::from_secs(20));
        assert_eq!(
            f.server.limits.keepalive_timeout,
            Duration::from_millis(2500)
        );
        assert_eq!(f.tenants[0].quota_bytes, Some(1 << 40));
        assert_eq!(f.tenants[1].quota_bytes, Some(1 << 30));
        let f = ConfigFile::parse("[server]\nlease_ttl = 30\n", Path::new("c.toml")).unwrap();
        assert_eq!(f.server.lease_ttl, Duration::from_secs(30));
        assert_eq!(f.server.region_bytes, 0);
    }

    #[test]
    fn a_bad_unit_is_a_syntax_error_naming_the_key_and_the_value() {
        for (text, key, value) in [
            ("[server]\nlease_ttl = \"400parsecs\"\n", "lease_ttl", "400parsecs"),
            ("[server]\ndrain_grace = \"soon\"\n", "drain_grace", "soon"),
            ("[server]\nregion_bytes = \"4MB?\"\n", "region_bytes", "4MB?"),
            ("[server]\nregion_bytes = 1.5\n", "region_bytes", "1.5"),
            (
                "[server.limits]\nmax_message_bytes = \"-1\"\n",
                "max_message_bytes",
                "-1",
            ),
            (
                &format!("[[tenant]]\nname = \"a\"\ntoken_sha256 = \"{TOKEN}\"\nquota_bytes = \"1 parsec\"\n"),
                "quota_bytes",
                "1 parsec",
            ),
        ] {
            let e = ConfigFile::parse(text, Path::new("c.toml")).unwrap_err();
            assert!(matches!(e, ConfigError::Syntax { .. }), "{e:?}");
            let e = e.to_string();
            assert!(
                e.contains("c.toml") && e.contains(key) && e.contains(value),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn stop_grace_and_connection_limits_are_read_and_bounded() {
        let f = ConfigFile::parse(
            "[server]\nstop_grace = 0.5\n[server.limits]\nmax_connections = 64\nhandshake_timeout = 3\n",
            Path::new("c.toml"),
        )
        .unwrap();
        assert_eq!(f.server.stop_grace, Duration::from_millis(500));
        assert_eq!(f.server.limits.max_connections, 64);
        assert_eq!(f.server.limits.handshake_timeout, Duration::from_secs(3));
        for (text, key) in [
            ("[server]\nstop_grace = 3601\n", "server.stop_grace"),
            (
                "[server.limits]\nmax_connections = 0\n",
                "server.limits.max_connections",
            ),
            (
                "[server.limits]\nhandshake_timeout = 0\n",
                "server.limits.handshake_timeout",
            ),
        ] {
            let e = ConfigFile::parse(text, Path::new("c.toml"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
    }

    #[test]
    fn per_call_fragments_is_bounded_and_named_when_bad() {
        let ok = |n| Config {
            per_call_fragments: n,
            ..Config::default()
        };
        assert!(ok(0).validate().is_ok());
        assert!(ok(MAX_PER_CALL_FRAGMENTS).validate().is_ok());
        let (key, why) = ok(MAX_PER_CALL_FRAGMENTS + 1).validate().unwrap_err();
        assert_eq!(key, "per_call_fragments");
        assert!(why.contains("at most 64"), "{why}");
    }

    #[test]
    fn listen_and_metrics_addr_take_host_names_and_refuse_a_bare_port() {
        let f = ConfigFile::parse(
            "listen = \"localhost:7878\"\n[server]\nmetrics_addr = \"0.0.0.0:9187\"\n",
            Path::new("c.toml"),
        )
        .unwrap();
        assert_eq!(f.listen, Some(SocketAddr::from(([127, 0, 0, 1], 7878))));
        assert_eq!(f.server.metrics_addr.unwrap().to_string(), "0.0.0.0:9187");
        assert_eq!(
            parse_listen_addr("[::1]:7878").unwrap().to_string(),
            "[::1]:7878"
        );
        for text in [
            "listen = \"7878\"\n",
            "listen = \"localhost\"\n",
            "[server]\nmetrics_addr = \"9187\"\n",
        ] {
            let e = ConfigFile::parse(text, Path::new("c.toml"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("c.toml") && e.contains("HOST:PORT") && e.contains("127.0.0.1:7878"),
                "{text}: {e}"
            );
        }
    }
}
