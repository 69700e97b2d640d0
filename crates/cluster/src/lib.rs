//! blockalloc servers on etcd: membership, fenced device ownership and
//! self-fencing. No consensus of our own: etcd decides who owns what.
//!
//! Keys, under `/blockalloc/CLUSTER/`:
//! * `servers/NAME`: a server's [`ServerInfo`] (JSON), written under the
//!   server's etcd lease, so it disappears when the server stops renewing.
//! * `devices/DEVICE/owner`: the device's [`OwnerInfo`] (JSON), created by
//!   a transaction that succeeds only if the key does not exist, under the
//!   owner's lease. The key's create revision is the **fencing token**: etcd
//!   revisions only grow, so each new owner's token is above every earlier
//!   one. The server takes the device with the token as its owner epoch
//!   (written to the device before it serves; a device refuses an epoch at
//!   or below its recorded one).
//!
//! **Self-fencing.** A [`Member`] renews its lease every third of the TTL.
//! A renewal that etcd acknowledges proves the lease alive until at least
//! `sent + TTL`, where `sent` is when the renewal left this process (etcd
//! measures the TTL from when it received it, which is later). [`Fence`]
//! says the member may act as owner only until `sent + 2/3 TTL` of the
//! last acknowledged renewal: a third of the TTL is left between the moment
//! the owner stops acknowledging and the first moment another server can
//! create the owner key — room for the local clock to run slow against
//! etcd's and for an acknowledgement already past its check. A renewal that
//! finds the lease gone ends the membership for good ([`Fence::lost`]).
//!
//! ```no_run
//! # async fn f() -> Result<(), blockalloc_cluster::ClusterError> {
//! use blockalloc_cluster::{Member, MemberConfig};
//! let cfg = MemberConfig::new(vec!["127.0.0.1:2379".into()], "prod", "host-a", "10.0.0.1:7000");
//! let member = Member::join(cfg, vec!["nvme0".into()]).await?;
//! let token = member.claim("nvme0").await?; // the device's owner epoch
//! assert!(!member.fence().is_fenced());
//! # let _ = token;
//! member.leave().await?; // its keys go at once
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, LeaseKeepAliveStream, LeaseKeeper,
    PutOptions, Txn, TxnOp, WatchOptions,
};
use serde::{Deserialize, Serialize};

pub mod testkit;

/// What can go wrong talking to the cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// etcd could not be reached or refused the call.
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    /// Another live server has this name.
    #[error("server name {0:?} is already registered in the cluster by a live server")]
    NameTaken(String),
    /// The device is owned by a live server.
    #[error("device {device:?} is owned by server {owner:?} (token {token})")]
    Owned {
        /// The device.
        device: String,
        /// Its owner.
        owner: String,
        /// The owner's fencing token.
        token: u64,
    },
    /// No live server has this name.
    #[error("no live server named {0:?} in the cluster")]
    NoSuchServer(String),
    /// This member's etcd lease ended: it owns nothing any more.
    #[error("this server's etcd lease ended; it owns nothing in the cluster")]
    LeaseLost,
    /// A value in etcd is not what this version writes.
    #[error("bad value under {key}: {why}")]
    BadValue {
        /// The key.
        key: String,
        /// Why it was refused.
        why: String,
    },
    /// A setting is out of range.
    #[error("{0}")]
    Config(String),
}

/// A server as registered (`servers/NAME`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerInfo {
    /// Its name, unique in the cluster.
    pub name: String,
    /// The address clients reach it at.
    pub addr: String,
    /// The devices it can reach (by name).
    pub devices: Vec<String>,
    /// Its version.
    pub version: String,
    /// Its labels, `key=value` (none from a server of an older version).
    #[serde(default)]
    pub labels: Vec<String>,
}

/// A device's owner (`devices/DEVICE/owner`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerInfo {
    /// The owning server's name.
    pub server: String,
    /// Its address.
    pub addr: String,
}

/// A device's space as its owner publishes it (`devices/DEVICE/space`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSpace {
    /// Block size in bytes.
    pub block_size: u64,
    /// Blocks on the device, metadata included.
    pub capacity_blocks: u64,
    /// Blocks free to allocate or lease.
    pub free_blocks: u64,
    /// Unused blocks of live leases.
    pub leased_blocks: u64,
    /// The owner's epoch of the device.
    pub epoch: u64,
}

/// How a member joins.
#[derive(Clone, Debug)]
pub struct MemberConfig {
    /// etcd endpoints, `HOST:PORT` or URLs.
    pub endpoints: Vec<String>,
    /// The cluster's name (the key prefix).
    pub cluster: String,
    /// This server's name, unique in the cluster.
    pub server: String,
    /// The address clients reach this server at.
    pub addr: String,
    /// The etcd lease TTL: how long after this server stops renewing its
    /// devices can be taken over. Whole seconds, at least 2.
    pub ttl: Duration,
    /// TLS to etcd (none: plaintext).
    pub tls: Option<EtcdTls>,
    /// The server's labels, `key=value` (for example `zone=a`): clients
    /// can restrict placement to devices whose owner has them.
    pub labels: Vec<String>,
}

/// TLS to etcd: the CA that signed etcd's certificates and, for etcd's
/// `--client-cert-auth`, this client's certificate and key (PEM).
#[derive(Clone, Default)]
pub struct EtcdTls {
    /// The CA's certificate.
    pub ca: Vec<u8>,
    /// This client's certificate and key.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls")
            .field("identity", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

impl EtcdTls {
    /// Reads the CA and, when both are given, the client certificate and
    /// key from PEM files.
    ///
    /// # Errors
    /// [`ClusterError::Config`] naming a file that cannot be read, or a
    /// certificate without its key.
    pub fn from_files(
        ca: &std::path::Path,
        cert: Option<&std::path::Path>,
        key: Option<&std::path::Path>,
    ) -> Result<EtcdTls, ClusterError> {
        let read = |p: &std::path::Path| {
            std::fs::read(p)
                .map_err(|e| ClusterError::Config(format!("cannot read {}: {e}", p.display())))
        };
        let identity = match (cert, key) {
            (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
            (None, None) => None,
            _ => {
                return Err(ClusterError::Config(
                    "a client certificate for etcd needs its key, and a key its certificate".into(),
                ))
            }
        };
        Ok(EtcdTls {
            ca: read(ca)?,
            identity,
        })
    }
}

impl MemberConfig {
    /// A configuration with the default TTL of 5 s.
    pub fn new(
        endpoints: Vec<String>,
        cluster: impl Into<String>,
        server: impl Into<String>,
        addr: impl Into<String>,
    ) -> Self {
        MemberConfig {
            endpoints,
            cluster: cluster.into(),
            server: server.into(),
            addr: addr.into(),
            ttl: Duration::from_secs(5),
            tls: None,
            labels: Vec::new(),
        }
    }
}

/// The key prefix of cluster `cluster`.
pub fn prefix(cluster: &str) -> String {
    format!("/blockalloc/{cluster}/")
}

fn server_key(cluster: &str, server: &str) -> String {
    format!("{}servers/{server}", prefix(cluster))
}

fn drain_key(cluster: &str, server: &str) -> String {
    format!("{}drain/{server}", prefix(cluster))
}

fn owner_key(cluster: &str, device: &str) -> String {
    format!("{}devices/{device}/owner", prefix(cluster))
}

fn space_key(cluster: &str, device: &str) -> String {
    format!("{}devices/{device}/space", prefix(cluster))
}

/// Names are path elements of keys: no `/`, no control characters, not empty.
fn check_name(what: &str, name: &str) -> Result<(), ClusterError> {
    if name.is_empty()
        || name.len() > 128
        || name.contains('/')
        || name.chars().any(char::is_control)
    {
        return Err(ClusterError::Config(format!(
            "bad {what} name {name:?}: 1-128 characters, no '/' and no control characters"
        )));
    }
    Ok(())
}

/// Checks a label: `key=value`, the key 1-63 ASCII letters, digits, `-`,
/// `_` or `.`, the value at most 63 characters, no `,`, `=` or control
/// characters.
///
/// # Errors
/// [`ClusterError::Config`] naming the label.
pub fn check_label(label: &str) -> Result<(), ClusterError> {
    let ok = label.split_once('=').is_some_and(|(k, v)| {
        (1..=63).contains(&k.len())
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && v.chars().count() <= 63
            && !v.chars().any(|c| c.is_control() || c == ',' || c == '=')
    });
    if ok {
        Ok(())
    } else {
        Err(ClusterError::Config(format!(
            "bad label {label:?}: key=value, the key 1-63 letters, digits, '-', '_' or '.', \
             the value at most 63 characters without ',', '=' or control characters"
        )))
    }
}

/// True when `e` says the call never reached etcd: the channel picked a
/// member it could not connect to (one that is down, while others are up).
fn not_sent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            s.code() == tonic::Code::Unavailable && s.message().contains("connect")
        }
        etcd_client::Error::TransportError(_) => true,
        _ => false,
    }
}

/// An etcd call's outcome.
type EtcdResult<T> = Result<T, etcd_client::Error>;

/// etcd calls as futures that own their client, for [`until_sent`].
trait Owned {
    async fn lease_grant_owned(self, ttl: i64) -> EtcdResult<etcd_client::LeaseGrantResponse>;
    async fn txn_owned(self, txn: Txn) -> EtcdResult<etcd_client::TxnResponse>;
    async fn get_owned(self, key: String) -> EtcdResult<etcd_client::GetResponse>;
    async fn get_prefix(self, prefix: String) -> EtcdResult<etcd_client::GetResponse>;
    async fn revoke_owned(self, lease: i64) -> EtcdResult<etcd_client::LeaseRevokeResponse>;
}

impl Owned for Client {
    async fn lease_grant_owned(mut self, ttl: i64) -> EtcdResult<etcd_client::LeaseGrantResponse> {
        self.lease_grant(ttl, None).await
    }
    async fn txn_owned(mut self, txn: Txn) -> EtcdResult<etcd_client::TxnResponse> {
        self.txn(txn).await
    }
    async fn get_owned(mut self, key: String) -> EtcdResult<etcd_client::GetResponse> {
        self.get(key, None).await
    }
    async fn get_prefix(mut self, prefix: String) -> EtcdResult<etcd_client::GetResponse> {
        self.get(prefix, Some(GetOptions::new().with_prefix()))
            .await
    }
    async fn revoke_owned(mut self, lease: i64) -> EtcdResult<etcd_client::LeaseRevokeResponse> {
        self.lease_revoke(lease).await
    }
}

/// Runs the etcd call `f` again while it did not reach etcd, backing off
/// from 20 ms, for about 5 s: the channel moves to a live member. Only
/// calls that were not sent are repeated, so no call runs twice.
async fn until_sent<T, F, Fut>(mut f: F) -> Result<T, etcd_client::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let mut wait = Duration::from_millis(20);
    for _ in 0..8 {
        match f().await {
            Err(e) if not_sent(&e) => {
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
            r => return r,
        }
    }
    f().await
}

async fn connect(endpoints: &[String], tls: Option<&EtcdTls>) -> Result<Client, ClusterError> {
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(2));
    let mut endpoints = endpoints.to_vec();
    if let Some(t) = tls {
        let mut c = etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(&t.ca));
        if let Some((cert, key)) = &t.identity {
            c = c.identity(etcd_client::Identity::from_pem(cert, key));
        }
        opts = opts.with_tls(c);
        for e in &mut endpoints {
            if !e.contains("://") {
                *e = format!("https://{e}");
            }
        }
    }
    Ok(Client::connect(endpoints, Some(opts)).await?)
}

/// Whether this member may still act as an owner (see the module docs).
#[derive(Debug)]
pub struct Fence {
    base: Instant,
    /// Nanoseconds after `base` until which the member may act.
    until: AtomicU64,
    lost: AtomicBool,
}

impl Fence {
    fn new(until: Instant) -> Self {
        let base = Instant::now();
        let f = Fence {
            base,
            until: AtomicU64::new(0),
            lost: AtomicBool::new(false),
        };
        f.extend(until);
        f
    }

    fn extend(&self, until: Instant) {
        let ns = until.saturating_duration_since(self.base).as_nanos();
        self.until
            .fetch_max(u64::try_from(ns).unwrap_or(u64::MAX), Ordering::SeqCst);
    }

    /// True when the member must not acknowledge anything as an owner: its
    /// last acknowledged renewal is too old, or its lease ended.
    pub fn is_fenced(&self) -> bool {
        if self.lost.load(Ordering::SeqCst) {
            return true;
        }
        let now = Instant::now()
            .saturating_duration_since(self.base)
            .as_nanos();
        u128::from(self.until.load(Ordering::SeqCst)) <= now
    }

    /// True once a renewal found the lease gone: the member owns nothing.
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }
}

/// A server's membership: its etcd lease, kept alive in the background.
pub struct Member {
    cfg: MemberConfig,
    client: Client,
    lease: i64,
    fence: Arc<Fence>,
    renewals: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("cluster", &self.cfg.cluster)
            .field("server", &self.cfg.server)
            .field("lease", &self.lease)
            .finish()
    }
}

impl Member {
    /// Joins the cluster: takes an etcd lease and registers the server
    /// under it (refused while another live server has the name).
    ///
    /// # Errors
    /// [`ClusterError::NameTaken`], a bad setting, or etcd's error.
    pub async fn join(cfg: MemberConfig, devices: Vec<String>) -> Result<Member, ClusterError> {
        check_name("cluster", &cfg.cluster)?;
        check_name("server", &cfg.server)?;
        for d in &devices {
            check_name("device", d)?;
        }
        for l in &cfg.labels {
            check_label(l)?;
        }
        let ttl = cfg.ttl.as_secs();
        if ttl < 2 || Duration::from_secs(ttl) != cfg.ttl {
            return Err(ClusterError::Config(format!(
                "the etcd lease TTL must be whole seconds, at least 2 (got {:?})",
                cfg.ttl
            )));
        }
        let mut client = connect(&cfg.endpoints, cfg.tls.as_ref()).await?;
        let sent = Instant::now();
        let lease = until_sent(|| client.clone().lease_grant_owned(ttl as i64))
            .await?
            .id();
        let info = ServerInfo {
            name: cfg.server.clone(),
            addr: cfg.addr.clone(),
            devices,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            labels: cfg.labels.clone(),
        };
        let key = server_key(&cfg.cluster, &cfg.server);
        let value = serde_json::to_vec(&info).expect("plain struct");
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease))),
                // A drain request left from an earlier run is not for this one.
                TxnOp::delete(drain_key(&cfg.cluster, &cfg.server), None),
            ]);
        if !until_sent(|| client.clone().txn_owned(txn.clone()))
            .await?
            .succeeded()
        {
            let _ = client.lease_revoke(lease).await;
            return Err(ClusterError::NameTaken(cfg.server.clone()));
        }
        let fence = Arc::new(Fence::new(sent + cfg.ttl * 2 / 3));
        let renewals = tokio::spawn(renew(client.clone(), lease, cfg.ttl, fence.clone()));
        Ok(Member {
            cfg,
            client,
            lease,
            fence,
            renewals,
        })
    }

    /// The member's fence: check it before acknowledging anything as an
    /// owner.
    pub fn fence(&self) -> Arc<Fence> {
        self.fence.clone()
    }

    /// The member's configuration.
    pub fn config(&self) -> &MemberConfig {
        &self.cfg
    }

    /// Takes `device` ([`claim_all`](Self::claim_all) of one).
    ///
    /// # Errors
    /// As [`claim_all`](Self::claim_all).
    pub async fn claim(&self, device: &str) -> Result<u64, ClusterError> {
        self.claim_all(&[device.to_owned()]).await
    }

    /// Takes every device of `devices` in one etcd transaction, all or
    /// none: creates their owner keys under this member's lease if no live
    /// server owns any of them, and returns the fencing token (the keys'
    /// create revision), to be the devices' owner epoch. Devices this
    /// member already owns give their current token.
    ///
    /// # Errors
    /// [`ClusterError::Owned`] naming the first device another live server
    /// owns, [`ClusterError::LeaseLost`], a bad name, or etcd's error.
    pub async fn claim_all(&self, devices: &[String]) -> Result<u64, ClusterError> {
        for d in devices {
            check_name("device", d)?;
        }
        if self.fence.lost() {
            return Err(ClusterError::LeaseLost);
        }
        let value = serde_json::to_vec(&OwnerInfo {
            server: self.cfg.server.clone(),
            addr: self.cfg.addr.clone(),
        })
        .expect("plain struct");
        let keys: Vec<String> = devices
            .iter()
            .map(|d| owner_key(&self.cfg.cluster, d))
            .collect();
        let put = PutOptions::new().with_lease(self.lease);
        let txn = Txn::new()
            .when(
                keys.iter()
                    .map(|k| Compare::create_revision(k.clone(), CompareOp::Equal, 0))
                    .collect::<Vec<_>>(),
            )
            .and_then(
                keys.iter()
                    .map(|k| TxnOp::put(k.clone(), value.clone(), Some(put.clone())))
                    .collect::<Vec<_>>(),
            )
            .or_else(
                keys.iter()
                    .map(|k| TxnOp::get(k.clone(), None))
                    .collect::<Vec<_>>(),
            );
        let r = until_sent(|| self.client.clone().txn_owned(txn.clone())).await?;
        if r.succeeded() {
            let rev = r.header().map_or(0, |h| h.revision());
            return u64::try_from(rev).map_err(|_| ClusterError::BadValue {
                key: keys.first().cloned().unwrap_or_default(),
                why: format!("revision {rev}"),
            });
        }
        // Refused: each device is free, this member's, or another's.
        let mut mine = 0u64;
        let mut free = Vec::new();
        for ((op, key), device) in r.op_responses().into_iter().zip(&keys).zip(devices) {
            let etcd_client::TxnOpResponse::Get(g) = op else {
                continue;
            };
            let Some(kv) = g.kvs().first() else {
                free.push(device.clone());
                continue;
            };
            let token = u64::try_from(kv.create_revision()).unwrap_or(0);
            if kv.lease() == self.lease {
                mine = mine.max(token);
                continue;
            }
            let owner: OwnerInfo = parse(key, kv.value())?;
            return Err(ClusterError::Owned {
                device: device.clone(),
                owner: owner.server,
                token,
            });
        }
        if free.len() == devices.len() {
            // Owner keys went between the compare and the reads: again.
            return Box::pin(self.claim_all(devices)).await;
        }
        // Some are this member's already: take the free ones. One epoch
        // for all, the highest token: revisions are global, so any later
        // owner of any of them has a higher one still.
        if free.is_empty() {
            return Ok(mine);
        }
        Ok(mine.max(Box::pin(self.claim_all(&free)).await?))
    }

    /// Waits until no other live server owns any of `devices` (a standby
    /// waiting for its owner's lease to end or for a handoff), following
    /// the owner keys with an etcd watch.
    ///
    /// # Errors
    /// [`ClusterError::LeaseLost`], or etcd's error.
    pub async fn wait_free(&self, devices: &[String]) -> Result<(), ClusterError> {
        let mut client = self.client.clone();
        let p = format!("{}devices/", prefix(&self.cfg.cluster));
        loop {
            if self.fence.lost() {
                return Err(ClusterError::LeaseLost);
            }
            let r = until_sent(|| client.clone().get_prefix(p.clone())).await?;
            let busy = r.kvs().iter().any(|kv| {
                kv.lease() != self.lease
                    && devices
                        .iter()
                        .any(|d| kv.key() == owner_key(&self.cfg.cluster, d).as_bytes())
            });
            if !busy {
                return Ok(());
            }
            // Any change under the prefix (or a second, as a safety net)
            // sends us back to read the owners again.
            changed_after(&mut client, &p, true, &r, Duration::from_secs(1)).await?;
        }
    }

    /// Follows the cluster: sends `tx` the view now and after every change
    /// under the cluster's prefix (read again in full, from the revision
    /// the watch saw), until `tx` has no receiver left. While etcd is
    /// unreachable it keeps trying (the last view stays).
    pub fn follow(
        &self,
        tx: tokio::sync::watch::Sender<View>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut client = self.client.clone();
        let p = prefix(&self.cfg.cluster);
        async move {
            while !tx.is_closed() {
                let r = match until_sent(|| client.clone().get_prefix(p.clone())).await {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot read the cluster from etcd; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                match View::from_kvs(&p, &r) {
                    // Only a newer revision replaces the view.
                    Ok(v) => {
                        tx.send_if_modified(|old| {
                            let newer = v.revision > old.revision;
                            if newer {
                                *old = v;
                            }
                            newer
                        });
                    }
                    Err(e) => tracing::warn!(error = %e, "an unreadable cluster record in etcd"),
                }
                if changed_after(&mut client, &p, true, &r, Duration::from_secs(5))
                    .await
                    .is_err()
                {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// A handle that publishes this member's devices' space, for a task
    /// of its own.
    pub fn publisher(&self) -> Publisher {
        Publisher {
            client: self.client.clone(),
            cluster: self.cfg.cluster.clone(),
            lease: self.lease,
        }
    }

    /// Completes once an operator asked this server to drain
    /// ([`request_drain`]): hand its devices over and stop. While etcd is
    /// unreachable it keeps asking.
    pub fn drain_requested(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut client = self.client.clone();
        let key = drain_key(&self.cfg.cluster, &self.cfg.server);
        async move {
            loop {
                // etcd unreachable: ask again in a second.
                let Ok(r) = until_sent(|| client.clone().get_owned(key.clone())).await else {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                };
                if !r.kvs().is_empty() {
                    return;
                }
                if changed_after(&mut client, &key, false, &r, Duration::from_secs(5))
                    .await
                    .is_err()
                {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// Leaves the cluster at once: revokes the lease, so that the server's
    /// key and every owner key it holds go now rather than after the TTL.
    /// Stop acknowledging before calling it.
    ///
    /// # Errors
    /// etcd's error (the lease then ends by itself after its TTL).
    pub async fn leave(self) -> Result<(), ClusterError> {
        self.renewals.abort();
        self.fence.lost.store(true, Ordering::SeqCst);
        let mut client = self.client.clone();
        until_sent(|| client.clone().revoke_owned(self.lease)).await?;
        client
            .delete(drain_key(&self.cfg.cluster, &self.cfg.server), None)
            .await?;
        Ok(())
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.renewals.abort();
    }
}

/// Publishes an owner's devices' space ([`Member::publisher`]).
#[derive(Clone)]
pub struct Publisher {
    client: Client,
    cluster: String,
    lease: i64,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("cluster", &self.cluster)
            .field("lease", &self.lease)
            .finish()
    }
}

impl Publisher {
    /// Publishes `space` for `device` under this member's lease, only while
    /// this member still owns the device: the write is conditional on the
    /// device's owner key being under this member's lease. `Ok(false)`
    /// when it is not.
    ///
    /// # Errors
    /// A bad name, or etcd's error.
    pub async fn publish_space(
        &self,
        device: &str,
        space: &DeviceSpace,
    ) -> Result<bool, ClusterError> {
        check_name("device", device)?;
        let value = serde_json::to_vec(space).expect("plain struct");
        let txn = Txn::new()
            .when([Compare::lease(
                owner_key(&self.cluster, device),
                CompareOp::Equal,
                self.lease,
            )])
            .and_then([TxnOp::put(
                space_key(&self.cluster, device),
                value,
                Some(PutOptions::new().with_lease(self.lease)),
            )]);
        Ok(until_sent(|| self.client.clone().txn_owned(txn.clone()))
            .await?
            .succeeded())
    }
}

/// Returns once `key` (with `prefix`, every key under it) changed after
/// the read `r`, or after `limit` at most: a watch from the revision after
/// `r`'s.
async fn changed_after(
    client: &mut Client,
    key: &str,
    prefix: bool,
    r: &etcd_client::GetResponse,
    limit: Duration,
) -> Result<(), etcd_client::Error> {
    let from = r.header().map_or(0, |h| h.revision()) + 1;
    let mut opts = WatchOptions::new().with_start_revision(from);
    if prefix {
        opts = opts.with_prefix();
    }
    let mut w = client.watch(key, Some(opts)).await?;
    let _ = tokio::time::timeout(limit, async {
        loop {
            match w.message().await {
                Ok(Some(m)) if m.events().is_empty() => continue,
                _ => break,
            }
        }
    })
    .await;
    Ok(())
}

/// Renews `lease` every third of `ttl` on one keep-alive stream (opened
/// again after an error), extending `fence` by each acknowledged renewal;
/// marks it lost when etcd says the lease is gone.
async fn renew(mut client: Client, lease: i64, ttl: Duration, fence: Arc<Fence>) {
    let every = ttl / 3;
    let mut chan: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
    loop {
        let sent = Instant::now();
        let outcome = tokio::time::timeout(every, async {
            match chan.as_mut() {
                // Opening the stream renews once and checks the answer.
                None => chan = Some(client.lease_keep_alive(lease).await?),
                Some((keeper, stream)) => {
                    keeper.keep_alive().await?;
                    match stream.message().await? {
                        Some(r) if r.ttl() > 0 => {}
                        Some(_) => return Ok(false),
                        None => {
                            return Err(etcd_client::Error::LeaseKeepAliveError(
                                "the keep-alive stream ended".into(),
                            ))
                        }
                    }
                }
            }
            Ok::<_, etcd_client::Error>(true)
        })
        .await;
        let alive = match outcome {
            Ok(Ok(alive)) => alive,
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(m))) if m.contains("not found") => false,
            Ok(Err(e)) => {
                tracing::warn!(lease, error = %e, "an etcd lease renewal failed; retrying");
                chan = None;
                true
            }
            Err(_) => {
                tracing::warn!(lease, "an etcd lease renewal timed out; retrying");
                chan = None;
                true
            }
        };
        if !alive {
            tracing::error!(
                lease,
                "the etcd lease ended: this server owns nothing in the cluster any more"
            );
            fence.lost.store(true, Ordering::SeqCst);
            return;
        }
        if chan.is_some() {
            fence.extend(sent + ttl * 2 / 3);
        }
        tokio::time::sleep_until((sent + every).into()).await;
    }
}

fn parse<T: for<'de> Deserialize<'de>>(key: &str, v: &[u8]) -> Result<T, ClusterError> {
    serde_json::from_slice(v).map_err(|e| ClusterError::BadValue {
        key: key.to_owned(),
        why: e.to_string(),
    })
}

/// Asks live server `server` of `cluster` to drain: it stops taking calls,
/// answers those it has, closes its devices and leaves the cluster, so that
/// their standbys take them over at once (`blockalloc cluster drain`).
///
/// # Errors
/// [`ClusterError::NoSuchServer`], or etcd's error.
pub async fn request_drain(
    endpoints: &[String],
    tls: Option<&EtcdTls>,
    cluster: &str,
    server: &str,
) -> Result<(), ClusterError> {
    check_name("cluster", cluster)?;
    check_name("server", server)?;
    let client = connect(endpoints, tls).await?;
    let key = server_key(cluster, server);
    // Only for a live server: the request is written only while its key is.
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Greater, 0)])
        .and_then([TxnOp::put(drain_key(cluster, server), "drain", None)]);
    if !until_sent(|| client.clone().txn_owned(txn.clone()))
        .await?
        .succeeded()
    {
        return Err(ClusterError::NoSuchServer(server.to_owned()));
    }
    Ok(())
}

/// A device's owner as read from etcd.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceOwner {
    /// The device.
    pub device: String,
    /// The owner.
    pub owner: OwnerInfo,
    /// The fencing token (the device's owner epoch).
    pub token: u64,
    /// Its space, as the owner last published it (none yet just after a
    /// takeover).
    pub space: Option<DeviceSpace>,
}

/// The cluster as etcd holds it at one revision.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct View {
    /// The etcd revision read.
    pub revision: u64,
    /// Live servers, by name.
    pub servers: Vec<ServerInfo>,
    /// Owned devices, by name.
    pub owners: Vec<DeviceOwner>,
}

impl View {
    /// Reads cluster `cluster`.
    ///
    /// # Errors
    /// etcd's error, or [`ClusterError::BadValue`] for a value this version
    /// cannot read.
    pub async fn read(
        endpoints: &[String],
        tls: Option<&EtcdTls>,
        cluster: &str,
    ) -> Result<View, ClusterError> {
        check_name("cluster", cluster)?;
        let client = connect(endpoints, tls).await?;
        let p = prefix(cluster);
        let r = until_sent(|| client.clone().get_prefix(p.clone())).await?;
        View::from_kvs(&p, &r)
    }

    /// The view that read `r` of the keys under `p` gives.
    fn from_kvs(p: &str, r: &etcd_client::GetResponse) -> Result<View, ClusterError> {
        let mut view = View {
            revision: r
                .header()
                .map_or(0, |h| u64::try_from(h.revision()).unwrap_or(0)),
            ..View::default()
        };
        let mut spaces = Vec::new();
        for kv in r.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let rest = &key[p.len()..];
            if let Some(device) = rest
                .strip_prefix("devices/")
                .and_then(|d| d.strip_suffix("/space"))
            {
                spaces.push((device.to_owned(), parse::<DeviceSpace>(&key, kv.value())?));
                continue;
            }
            if let Some(name) = rest.strip_prefix("servers/") {
                let s: ServerInfo = parse(&key, kv.value())?;
                if s.name != name {
                    return Err(ClusterError::BadValue {
                        key,
                        why: format!("names server {:?}", s.name),
                    });
                }
                view.servers.push(s);
            } else if let Some(device) = rest
                .strip_prefix("devices/")
                .and_then(|d| d.strip_suffix("/owner"))
            {
                view.owners.push(DeviceOwner {
                    device: device.to_owned(),
                    owner: parse(&key, kv.value())?,
                    token: u64::try_from(kv.create_revision()).unwrap_or(0),
                    space: None,
                });
            }
        }
        for (device, space) in spaces {
            if let Some(o) = view.owners.iter_mut().find(|o| o.device == device) {
                o.space = Some(space);
            }
        }
        Ok(view)
    }
}
