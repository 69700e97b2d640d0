//! [`Cluster`]: the servers of a cluster as one service — discovery from
//! seed addresses, each call routed to its device's owner of the moment,
//! and placement of new objects across the cluster's devices.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blockalloc::Extent;
use blockalloc_proto::pb;
use pb::call_reply::Result as Reply;
use pb::call_request::Call;
use tokio::sync::watch;
use tonic::Code;

use crate::calls::lock;
use crate::client::{
    contiguous, contiguous_request, reply_epoch, set_epoch, to_pb, Client, DeviceId,
    DEFAULT_RETRY_FOR,
};
use crate::connect::ConnectOptions;
use crate::error::{ClientError, Result};
use crate::retry::{random_u64, Backoff, Session};

/// A cluster's topology: live servers, owned devices with their owners,
/// epochs and published space (see `Topology` in the schema).
pub type Topology = pb::Topology;

/// A device with an owner, as the topology lists it.
pub type ClusterDevice = pb::ClusterDevice;

/// Where [`Cluster::allocate`] may put an object.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// Labels (`key=value`) the device must all have: its owner's labels
    /// (`serve --label`) and `server=NAME`. None: any device.
    pub labels: Vec<String>,
    /// Devices that this allocation would take above this used fraction
    /// are chosen only when no other device has room (default 0.95), so
    /// that a nearly full device is left alone while others have space.
    pub max_used: f64,
}

impl Default for Placement {
    fn default() -> Self {
        Placement {
            labels: Vec::new(),
            max_used: 0.95,
        }
    }
}

impl Placement {
    /// Any device that has the label `label` too.
    #[must_use]
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.labels.push(label.into());
        self
    }

    /// True when `d` has every label asked for.
    fn matches(&self, d: &ClusterDevice) -> bool {
        self.labels.iter().all(|l| d.labels.contains(l))
    }
}

/// Objects [`Cluster::allocate`] placed: on which device, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    /// The device's name (its name in the cluster; free the extents with
    /// it).
    pub device: String,
    /// The device's epoch in the reply.
    pub epoch: u64,
    /// One extent per object, in request order.
    pub extents: Vec<Extent>,
}

/// The servers of a cluster (`blockalloc serve --etcd … --cluster NAME`)
/// as one service. Cheap to clone; clones share everything.
///
/// It learns the cluster from any one server (`WatchTopology`, fed from
/// the servers' etcd watch: a client needs no etcd credentials), keeps that
/// stream open (on another server when one stops), and sends each call to
/// the device's owner of the moment. A call carries one request id for
/// all its tries: one that finds the owner unavailable, cut off, or
/// fenced (a stale owner's reply) waits for the topology to change (or a
/// backoff pause: 10 ms doubling to 1 s) and goes, with the same id, to
/// the device's owner then — never to another device, since the first try
/// may have allocated. A new owner replays the device's journal, request
/// ids included, so a resent call runs once across a failover. Tries end
/// after [`retry_for`](Self::with_retry_for) (30 s by default).
///
/// [`allocate`](Self::allocate) places objects itself: among the devices
/// that match the [`Placement`] and have room, it draws two at random in
/// proportion to their free blocks and takes the emptier (the larger free
/// fraction), so that devices of any size fill to the same fraction
/// without every client piling onto the emptiest one.
/// Free space is what owners publish (about once a second), or what the
/// device's last reply to this client said, whichever came later.
///
/// ```no_run
/// # async fn demo() -> Result<(), blockalloc_client::ClientError> {
/// use blockalloc_client::{Cluster, ConnectOptions, Placement};
///
/// let cluster = Cluster::connect(&["10.0.0.1:7878", "10.0.0.2:7878"], &ConnectOptions::default(), None).await?;
/// // Four 1 MiB objects, each one extent, on a device in zone a.
/// let placed = cluster.allocate(&Placement::default().with_label("zone=a"), 4, 256).await?;
/// cluster.free(&placed.device, &placed.extents).await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Cluster {
    inner: Arc<Inner>,
    retry_for: Duration,
}

#[derive(Debug)]
struct Inner {
    opts: ConnectOptions,
    token: Option<String>,
    topology: watch::Receiver<Topology>,
    /// A connection per server address.
    clients: Mutex<HashMap<String, Client>>,
    /// Request ids, and the newest epoch seen per device.
    session: Session<String>,
    /// Free space per device as this client estimates it.
    estimates: Mutex<HashMap<String, Estimate>>,
    /// The state of the random draws.
    random: AtomicU64,
    /// The task that keeps the topology stream open.
    follower: tokio::task::JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.follower.abort();
    }
}

/// A device's free space: the figure its owner published (with the epoch
/// it came with), or the one in the device's last reply to this client
/// since.
#[derive(Clone, Copy, Debug)]
struct Estimate {
    published: (u64, u64),
    free: u64,
}

/// How long a server may take to send its first topology (it has none
/// before it read the cluster from etcd) before the next one is asked.
const FIRST_TOPOLOGY_WAIT: Duration = Duration::from_secs(5);

/// Opens `WatchTopology` on `addr` and returns the stream with its first
/// topology.
async fn watch_on(
    addr: &str,
    opts: &ConnectOptions,
    token: Option<&str>,
) -> Result<(tonic::Streaming<Topology>, Topology)> {
    let client = Client::connect_lazy(addr, opts)?.with_token(token)?;
    let open = async {
        let mut stream = client
            .rpc()
            .watch_topology(pb::WatchTopologyRequest {})
            .await?
            .into_inner();
        let first = stream.message().await?;
        Ok::<_, tonic::Status>((stream, first))
    };
    match tokio::time::timeout(FIRST_TOPOLOGY_WAIT, open).await {
        Ok(Ok((stream, Some(t)))) => Ok((stream, t)),
        Ok(Ok((_, None))) => Err(ClientError::Unavailable(format!(
            "{addr} ended the topology stream at once"
        ))),
        Ok(Err(s)) => Err(ClientError::from(s)),
        Err(_) => Err(ClientError::Unavailable(format!(
            "{addr} sent no topology within {FIRST_TOPOLOGY_WAIT:?}"
        ))),
    }
}

/// Keeps the topology stream open: reads it into `tx`, and when it ends
/// opens it again on a seed or a server of the last topology, in turn,
/// with backoff; until every receiver is gone.
async fn follow(
    mut stream: tonic::Streaming<Topology>,
    seeds: Vec<String>,
    opts: ConnectOptions,
    token: Option<String>,
    tx: watch::Sender<Topology>,
) {
    loop {
        while let Ok(Some(t)) = stream.message().await {
            tx.send_if_modified(|old| {
                let newer = t.revision >= old.revision && *old != t;
                if newer {
                    *old = t;
                }
                newer
            });
        }
        let mut backoff = Backoff::default();
        'reopen: loop {
            let mut addrs = seeds.clone();
            for s in &tx.borrow().servers {
                if !addrs.contains(&s.address) {
                    addrs.push(s.address.clone());
                }
            }
            for a in &addrs {
                if tx.is_closed() {
                    return;
                }
                if let Ok((s, t)) = watch_on(a, &opts, token.as_deref()).await {
                    tx.send_if_modified(|old| {
                        let newer = t.revision >= old.revision && *old != t;
                        if newer {
                            *old = t;
                        }
                        newer
                    });
                    stream = s;
                    break 'reopen;
                }
            }
            tokio::time::sleep(backoff.next_pause()).await;
        }
    }
}

impl Cluster {
    /// Connects to the cluster through `seeds` (`host:port` of any of its
    /// servers, tried in order) and waits for its topology. `token` is
    /// sent as `authorization: Bearer TOKEN` on every call (servers with
    /// tenants); a tenant sees only the devices it may use.
    ///
    /// # Errors
    /// [`ClientError::Unavailable`] when no seed gives the topology;
    /// [`ClientError::Refused`] (`FailedPrecondition`) from a server that
    /// is not in a cluster; [`ClientError::Config`] for a bad address.
    pub async fn connect(
        seeds: &[impl AsRef<str>],
        opts: &ConnectOptions,
        token: Option<&str>,
    ) -> Result<Cluster> {
        let seeds: Vec<String> = seeds.iter().map(|s| s.as_ref().to_owned()).collect();
        if seeds.is_empty() {
            return Err(ClientError::Config("no seed address".into()));
        }
        let mut why = Vec::new();
        for a in &seeds {
            match watch_on(a, opts, token).await {
                Ok((stream, first)) => {
                    let (tx, rx) = watch::channel(first);
                    let follower = tokio::spawn(follow(
                        stream,
                        seeds.clone(),
                        opts.clone(),
                        token.map(str::to_owned),
                        tx,
                    ));
                    return Ok(Cluster {
                        inner: Arc::new(Inner {
                            opts: opts.clone(),
                            token: token.map(str::to_owned),
                            topology: rx,
                            clients: Mutex::default(),
                            session: Session::default(),
                            estimates: Mutex::default(),
                            random: AtomicU64::new(random_u64()),
                            follower,
                        }),
                        retry_for: DEFAULT_RETRY_FOR,
                    });
                }
                Err(e @ (ClientError::Refused { .. } | ClientError::Config(_))) => return Err(e),
                Err(e) => why.push(format!("{a}: {e}")),
            }
        }
        Err(ClientError::Unavailable(format!(
            "no seed gave the cluster's topology ({})",
            why.join("; ")
        )))
    }

    /// This cluster handle, resending a failed call for at most
    /// `retry_for` instead (zero: each call is sent once, without a
    /// request id).
    pub fn with_retry_for(&self, retry_for: Duration) -> Cluster {
        Cluster {
            inner: Arc::clone(&self.inner),
            retry_for,
        }
    }

    /// A [`Client`] of `device` whose connection follows the device's
    /// owner: each time the topology names a new owner, calls go to it
    /// (until then, to the last one). Name the device as
    /// `DeviceId::Name(device)`. What it is for: a [`LeasingAllocator`]
    /// whose lease moves with the device ([`leasing`](Self::leasing)),
    /// since a new owner restores the device's journaled leases.
    ///
    /// # Errors
    /// [`ClientError::Refused`] (`NotFound`) for a device no server of
    /// the cluster has; [`ClientError::Config`] for a bad address.
    ///
    /// [`LeasingAllocator`]: crate::LeasingAllocator
    pub fn device_client(&self, device: &str) -> Result<Client> {
        self.owner(device)?;
        let (channel, tx) = tonic::transport::Channel::balance_channel::<String>(4);
        let mut topology = self.inner.topology.clone();
        let opts = self.inner.opts.clone();
        let device = device.to_owned();
        tokio::spawn(async move {
            let mut current: Option<String> = None;
            loop {
                let owner = topology
                    .borrow_and_update()
                    .devices
                    .iter()
                    .find(|d| d.name == device)
                    .map(|d| d.address.clone());
                if let Some(addr) = owner.filter(|a| current.as_ref() != Some(a)) {
                    let Ok(endpoint) = crate::connect::endpoint(&addr, &opts) else {
                        return;
                    };
                    use tonic::transport::channel::Change;
                    let mut changes = vec![Change::Insert(addr.clone(), endpoint)];
                    changes.extend(current.replace(addr).map(Change::Remove));
                    for c in changes {
                        // The client is gone.
                        if tx.send(c).await.is_err() {
                            return;
                        }
                    }
                }
                tokio::select! {
                    r = topology.changed() => if r.is_err() { return },
                    () = tx.closed() => return,
                }
            }
        });
        Client::over(channel, None, &self.inner.opts).with_token(self.inner.token.as_deref())
    }

    /// A [`LeasingAllocator`] on `device` whose lease follows the
    /// device's owner ([`device_client`](Self::device_client)): after a
    /// failover its commits and renewals, resent until the lease's
    /// deadline, reach the new owner, which restored the lease. `opts`'s
    /// device is replaced by `device`, its token by this handle's.
    ///
    /// # Errors
    /// As [`device_client`](Self::device_client).
    ///
    /// [`LeasingAllocator`]: crate::LeasingAllocator
    pub fn leasing(
        &self,
        device: &str,
        opts: &crate::LeaseOptions,
    ) -> Result<crate::LeasingAllocator> {
        let opts = crate::LeaseOptions {
            device: crate::DeviceId::Name(device.to_owned()),
            token: None,
            ..opts.clone()
        };
        Ok(crate::LeasingAllocator::new(
            self.device_client(device)?,
            opts,
        ))
    }

    /// The topology now.
    pub fn topology(&self) -> Topology {
        self.inner.topology.borrow().clone()
    }

    /// Waits until the topology changes; returns it.
    ///
    /// # Errors
    /// [`ClientError::Closed`] once the handle's task ended.
    pub async fn changed(&self) -> Result<Topology> {
        let mut rx = self.inner.topology.clone();
        rx.changed().await.map_err(|_| ClientError::Closed)?;
        let t = rx.borrow_and_update().clone();
        Ok(t)
    }

    /// Allocates `count` objects of `blocks` contiguous blocks each, all on
    /// one device that `place` allows (see [`Cluster`]), all or nothing;
    /// durable on return. A device that refuses for want of space is left
    /// out and another one chosen.
    ///
    /// # Errors
    /// [`ClientError::NoSpace`] when no device that `place` allows has
    /// room; otherwise as [`allocate_on`](Self::allocate_on).
    pub async fn allocate(&self, place: &Placement, count: u32, blocks: u64) -> Result<Placed> {
        let need = u64::from(count)
            .checked_mul(blocks)
            .filter(|&n| n > 0)
            .ok_or_else(|| ClientError::Refused {
                code: Code::InvalidArgument,
                reason: format!("{count} objects of {blocks} blocks"),
            })?;
        let mut tried = HashSet::new();
        loop {
            let Some(device) = self.choose(place, need, &tried) else {
                let labels = if place.labels.is_empty() {
                    String::new()
                } else {
                    format!(" with labels {}", place.labels.join(","))
                };
                return Err(ClientError::NoSpace {
                    reason: format!(
                        "no device of the cluster{labels} has room for {count} objects of {blocks} \
                         blocks ({} tried)",
                        tried.len()
                    ),
                    details: None,
                });
            };
            tried.insert(device.clone());
            match self.allocate_call(&device, count, blocks, None).await {
                Ok((extents, epoch)) => {
                    return Ok(Placed {
                        device,
                        epoch,
                        extents,
                    })
                }
                Err(ClientError::NoSpace { .. }) => self.estimate(&device, |_| 0),
                Err(e) => return Err(e),
            }
        }
    }

    /// Allocates `count` objects of `blocks` contiguous blocks each on
    /// `device` (its name in the cluster), near `hint`, all or nothing;
    /// durable on return.
    ///
    /// # Errors
    /// [`ClientError::Refused`] (`NotFound`) for a device no server of the
    /// cluster has; [`ClientError::Unavailable`] when it has no owner for
    /// longer than the retries; otherwise as [`Client::allocate`].
    pub async fn allocate_on(
        &self,
        device: &str,
        count: u32,
        blocks: u64,
        hint: Option<u64>,
    ) -> Result<Vec<Extent>> {
        Ok(self.allocate_call(device, count, blocks, hint).await?.0)
    }

    /// Frees `extents` on `device`, all or nothing; durable on return.
    /// Returns the blocks freed.
    ///
    /// # Errors
    /// As [`Client::free`], and as [`allocate_on`](Self::allocate_on) for
    /// the device.
    pub async fn free(&self, device: &str, extents: &[Extent]) -> Result<u64> {
        let req = pb::FreeRequest {
            device: Some(DeviceId::Name(device.to_owned()).to_pb()),
            extents: extents.iter().copied().map(to_pb).collect(),
            request_id: self.request_id(),
            epoch: 0,
        };
        match self.call(device, Call::Free(req)).await? {
            Reply::Free(r) => {
                self.estimate(device, |_| r.free_blocks);
                Ok(r.blocks)
            }
            _ => Err(ClientError::BadReply(
                "a Free answered as another call".into(),
            )),
        }
    }

    fn request_id(&self) -> u64 {
        if self.retry_for.is_zero() {
            0
        } else {
            self.inner.session.request_id()
        }
    }

    /// An Allocate on `device`; the extents and the reply's epoch.
    async fn allocate_call(
        &self,
        device: &str,
        count: u32,
        blocks: u64,
        hint: Option<u64>,
    ) -> Result<(Vec<Extent>, u64)> {
        let id = DeviceId::Name(device.to_owned());
        let req = contiguous_request(&id, count, blocks, hint, self.request_id());
        let r = match self.call(device, Call::Allocate(req)).await? {
            Reply::Allocate(r) => r,
            _ => {
                return Err(ClientError::BadReply(
                    "an Allocate answered as another call".into(),
                ))
            }
        };
        let out = contiguous(&r, count)?;
        self.estimate(device, |_| r.free_blocks);
        Ok((out, r.epoch))
    }

    /// Sends `call` about `device` to its owner, and again (same request
    /// id) to its owner of the moment after a failure a resend may cure,
    /// for at most `retry_for`.
    async fn call(&self, device: &str, mut call: Call) -> Result<Reply> {
        let started = Instant::now();
        let mut backoff = Backoff::default();
        let mut topology = self.inner.topology.clone();
        let session = &self.inner.session;
        loop {
            topology.mark_unchanged();
            let r = match self.owner(device)? {
                Some((addr, epoch)) => {
                    // The topology's epoch is the owner's: no older owner
                    // may answer (an older topology changes nothing).
                    let _ = session.observe(&device.to_owned(), epoch);
                    set_epoch(&mut call, session.epoch(&device.to_owned()));
                    match self.client(&addr) {
                        Ok(c) => c.send(call.clone()).await.and_then(|r| {
                            session.observe(&device.to_owned(), reply_epoch(&r))?;
                            Ok(r)
                        }),
                        Err(e) => return Err(e),
                    }
                }
                None => Err(ClientError::Unavailable(format!(
                    "device {device:?} has no owner in the cluster now"
                ))),
            };
            match r {
                Err(e) if e.retryable() && !self.retry_for.is_zero() => {
                    let pause = backoff.next_pause();
                    if started.elapsed() + pause > self.retry_for {
                        return Err(e);
                    }
                    // A new owner (or any change) sends it at once.
                    let _ = tokio::time::timeout(pause, topology.changed()).await;
                }
                r => return r,
            }
        }
    }

    /// The address and epoch of `device`'s owner; `None` while it has
    /// none.
    ///
    /// # Errors
    /// [`ClientError::Refused`] (`NotFound`) when no server of the cluster
    /// has the device.
    fn owner(&self, device: &str) -> Result<Option<(String, u64)>> {
        let t = self.inner.topology.borrow();
        if let Some(d) = t.devices.iter().find(|d| d.name == device) {
            return Ok(Some((d.address.clone(), d.epoch)));
        }
        if t.servers
            .iter()
            .any(|s| s.devices.iter().any(|d| d == device))
        {
            return Ok(None);
        }
        Err(ClientError::Refused {
            code: Code::NotFound,
            reason: format!("no server of cluster {:?} has device {device:?}", t.cluster),
        })
    }

    /// The connection to `addr`, made at first use.
    fn client(&self, addr: &str) -> Result<Client> {
        let mut m = lock(&self.inner.clients);
        if let Some(c) = m.get(addr) {
            return Ok(c.clone());
        }
        let c = Client::connect_lazy(addr, &self.inner.opts)?
            .with_token(self.inner.token.as_deref())?;
        m.insert(addr.to_owned(), c.clone());
        Ok(c)
    }

    /// Changes this client's estimate of `device`'s free space by `f`.
    fn estimate(&self, device: &str, f: impl FnOnce(u64) -> u64) {
        if let Some(e) = lock(&self.inner.estimates).get_mut(device) {
            e.free = f(e.free);
        }
    }

    /// Sets this client's estimate of `device`'s free space to `free`
    /// (until the next figure its owner publishes or a reply gives).
    pub(crate) fn set_free_estimate(&self, device: &str, free: u64) {
        self.estimate(device, |_| free);
    }

    /// 64 random bits (splitmix64 over a shared counter).
    fn random(&self) -> u64 {
        let mut z = self
            .inner
            .random
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The device for `need` blocks: of those `place` allows with room
    /// (and not in `tried`), preferring those that stay within
    /// `place.max_used`, the emptier (by free fraction) of two drawn in
    /// proportion to their free blocks. The draw alone fills each device in
    /// proportion to its free space, which keeps used fractions level; the
    /// second choice pulls back any device that got ahead. Devices whose
    /// space is not published yet (just taken over) come last: one at
    /// random when no other has room.
    pub(crate) fn choose(
        &self,
        place: &Placement,
        need: u64,
        tried: &HashSet<String>,
    ) -> Option<String> {
        let t = self.inner.topology.borrow().clone();
        let mut est = lock(&self.inner.estimates);
        let mut room = Vec::new();
        // Devices whose space is not published yet (just taken over).
        let mut unknown = Vec::new();
        for d in &t.devices {
            if !d.space_known {
                if place.matches(d) && !tried.contains(&d.name) {
                    unknown.push(d.name.clone());
                }
                continue;
            }
            if d.capacity_blocks == 0 {
                continue;
            }
            let published = (d.free_blocks, d.epoch);
            let e = est.entry(d.name.clone()).or_insert(Estimate {
                published,
                free: d.free_blocks,
            });
            if e.published != published {
                *e = Estimate {
                    published,
                    free: d.free_blocks,
                };
            }
            if e.free >= need && place.matches(d) && !tried.contains(&d.name) {
                let used_after = (d.capacity_blocks - e.free + need) as f64;
                let within = used_after <= place.max_used * d.capacity_blocks as f64;
                room.push((
                    d.name.clone(),
                    e.free,
                    within,
                    e.free as f64 / d.capacity_blocks as f64,
                ));
            }
        }
        drop(est);
        if room.iter().any(|r| r.2) {
            room.retain(|r| r.2);
        }
        let total: u64 = room.iter().map(|r| r.1).sum();
        if total == 0 {
            // The last resort: a device that may have room (its owner
            // refuses if not).
            if unknown.is_empty() {
                return None;
            }
            let i = (self.random() % unknown.len() as u64) as usize;
            return Some(unknown.swap_remove(i));
        }
        let draw = || {
            let mut x = self.random() % total;
            for r in &room {
                if x < r.1 {
                    return r;
                }
                x -= r.1;
            }
            room.last().expect("not empty")
        };
        let (a, b) = (draw(), draw());
        Some(if b.3 > a.3 { b.0.clone() } else { a.0.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str, capacity: u64, free: u64, labels: &[&str]) -> ClusterDevice {
        ClusterDevice {
            name: name.into(),
            server: "s".into(),
            address: "127.0.0.1:1".into(),
            epoch: 1,
            space_known: true,
            block_size: 4096,
            capacity_blocks: capacity,
            free_blocks: free,
            labels: labels.iter().map(|l| l.to_string()).collect(),
            ..Default::default()
        }
    }

    /// A handle over a fixed topology, with a fixed random start.
    fn over(devices: Vec<ClusterDevice>) -> Cluster {
        over_with(devices, &[])
    }

    /// [`over`], its server listing `unowned` devices too.
    fn over_with(devices: Vec<ClusterDevice>, unowned: &[&str]) -> Cluster {
        let mut listed: Vec<String> = devices.iter().map(|d| d.name.clone()).collect();
        listed.extend(unowned.iter().map(|d| d.to_string()));
        let (tx, rx) = watch::channel(Topology {
            revision: 1,
            cluster: "c".into(),
            servers: vec![pb::ClusterServer {
                name: "s".into(),
                devices: listed,
                ..Default::default()
            }],
            devices,
        });
        Cluster {
            inner: Arc::new(Inner {
                opts: ConnectOptions::default(),
                token: None,
                topology: rx,
                clients: Mutex::default(),
                session: Session::default(),
                estimates: Mutex::default(),
                random: AtomicU64::new(7),
                follower: tokio::spawn(async move { tx.closed().await }),
            }),
            retry_for: DEFAULT_RETRY_FOR,
        }
    }

    /// Shares of `n` choices for `need` blocks.
    fn shares(c: &Cluster, place: &Placement, need: u64, n: u32) -> HashMap<String, f64> {
        let mut m = HashMap::new();
        for _ in 0..n {
            let d = c.choose(place, need, &HashSet::new()).unwrap();
            *m.entry(d).or_insert(0.0) += 1.0 / f64::from(n);
        }
        m
    }

    #[tokio::test]
    async fn placement_takes_the_emptier_by_fraction_of_two_draws_by_free_blocks() {
        const M: u64 = 1 << 20;
        // Weights 1/8, 1/2, 3/8; free fractions 0.5, 0.5, 0.75.
        let c = over(vec![
            device("a", M, M / 2, &[]),
            device("b", 4 * M, 2 * M, &[]),
            device("c", 2 * M, 3 * M / 2, &[]),
        ]);
        let got = shares(&c, &Placement::default(), 1, 100_000);
        // c when either draw is c; a and b tie on fraction: the first draw.
        let want = [
            ("a", 0.125 * 0.625),
            ("b", 0.5 * 0.625),
            ("c", 1.0 - 0.625 * 0.625),
        ];
        for (d, p) in want {
            // Six standard deviations and more.
            assert!((got[d] - p).abs() < 0.01, "{d}: {} against {p}", got[d]);
        }
    }

    #[tokio::test]
    async fn placement_keeps_to_labels_and_the_fullness_cap_and_uses_unknown_space_last() {
        let mut unknown = device("new", 1000, 0, &["zone=a"]);
        unknown.space_known = false;
        let c = over(vec![
            device("a1", 1000, 600, &["zone=a"]),
            // Past the cap once 10 blocks are taken: 0.951 used.
            device("a2", 1000, 59, &["zone=a"]),
            device("b1", 1000, 1000, &["zone=b"]),
            device("empty", 0, 0, &["zone=a"]),
            unknown,
        ]);
        let zone_a = Placement::default().with_label("zone=a");
        let got = shares(&c, &zone_a, 10, 1000);
        assert_eq!(got.keys().collect::<Vec<_>>(), ["a1"], "{got:?}");
        // Without room under the cap elsewhere, the capped device serves.
        let tried: HashSet<String> = ["a1".to_owned()].into();
        assert_eq!(c.choose(&zone_a, 10, &tried).as_deref(), Some("a2"));
        // No device with known space has room: the one not published yet.
        assert_eq!(
            c.choose(&zone_a, 700, &HashSet::new()).as_deref(),
            Some("new")
        );
        let tried: HashSet<String> = ["new".to_owned()].into();
        assert_eq!(c.choose(&zone_a, 700, &tried), None);
        assert_eq!(
            c.choose(
                &Placement::default().with_label("zone=c"),
                1,
                &HashSet::new()
            ),
            None
        );
    }

    #[tokio::test]
    async fn a_device_no_server_has_is_not_found_and_one_between_owners_waits() {
        let c = over(vec![device("a", 1000, 1000, &[])]);
        assert_eq!(c.owner("a").unwrap(), Some(("127.0.0.1:1".into(), 1)));
        assert!(matches!(
            c.owner("nope"),
            Err(ClientError::Refused {
                code: Code::NotFound,
                ..
            })
        ));
        let c = over_with(vec![], &["a"]);
        assert_eq!(c.owner("a").unwrap(), None);
    }
}
