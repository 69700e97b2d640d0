//! [`Metrics`]: the server's Prometheus metrics (prometheus-client), and
//! the HTTP endpoint that serves them (`GET /metrics`, axum).
//!
//! Three sources:
//! * every Allocator call, counted by method and gRPC status code and timed
//!   by method — recorded by [`Observe`], a layer around the transport, so
//!   that no handler has to remember it;
//! * every journal sync of every store — its latency and the transactions
//!   it carried (group commit size), through the store's
//!   [`SyncObserver`] hook;
//! * the devices' space and lease counts, read at each scrape (a pass over
//!   each device's free extents, as Status does), and on a server with
//!   tenants each tenant's space on each device (counters its pool keeps:
//!   O(1) per tenant and device, no pass over extents).
//!
//! Device series carry a `tenant` label: empty for the whole device (an
//! empty label is the same as none to Prometheus), the tenant's name for
//! that tenant's share. So a sum over tenants is `{tenant!=""}`, and the
//! whole device is `{tenant=""}`.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use blockalloc_store::SyncObserver;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tonic::Code;

use crate::device::ServedDevice;
use crate::ownership::TenantUsage;
use crate::status::device_status;

/// The Allocator methods, as they appear in the `method` label; a call to
/// any other path of the service is counted as `unknown`, so that a client
/// cannot grow the label set.
const METHODS: &[&str] = &[
    "Allocate",
    "Free",
    "Status",
    "Lease",
    "Commit",
    "Renew",
    "Release",
    "WatchRecalls",
    "Calls",
];

/// The gRPC path prefix of the Allocator service.
const SERVICE_PREFIX: &str = "/blockalloc.v1.Allocator/";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: &'static str,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeviceLabels {
    device: String,
    /// Empty: the whole device.
    tenant: String,
}

impl DeviceLabels {
    fn device(d: &ServedDevice) -> Self {
        DeviceLabels {
            device: d.name.clone(),
            tenant: String::new(),
        }
    }
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Latencies from 10 µs to ~80 s.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-5, 2.0, 24))
}

/// Transactions per journal entry, 1 to 4096.
fn group_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 13))
}

/// The metrics of one server ([`Launch::metrics`](crate::Launch::metrics)).
/// Cheap to clone; clones share the values.
#[derive(Clone, Debug)]
pub struct Metrics {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Histograms<MethodLabels>,
    sync_latency: Histograms<DeviceLabels>,
    group_size: Histograms<DeviceLabels>,
    devices: Arc<OnceLock<Vec<Arc<ServedDevice>>>>,
    /// 1 while the server refuses calls because it cannot renew its
    /// cluster lease.
    fenced: Gauge,
    /// Times the server started refusing calls for its cluster lease.
    fenced_total: Counter,
    /// The last takeover: from taking the devices in etcd to serving them.
    takeover: Gauge<f64, AtomicU64>,
    /// Per (method, code), when its last failed-call line was logged and
    /// how many were left out since ([`Metrics::log_failure`]).
    log_windows: std::sync::Mutex<HashMap<(&'static str, i32), LogWindow>>,
}

/// The log lines of one (method, code) of failed calls.
#[derive(Debug)]
struct LogWindow {
    logged_at: Instant,
    suppressed: u64,
}

impl Metrics {
    /// Metrics with no device yet; the launch adds the devices of the
    /// server it serves.
    pub(crate) fn new() -> Metrics {
        let mut registry = Registry::with_prefix("blockalloc");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "Allocator calls by method and gRPC status code (OK or the error)",
            requests.clone(),
        );
        let latency: Histograms<MethodLabels> = Family::new_with_constructor(latency_histogram);
        registry.register(
            "request_duration_seconds",
            "Time from a call's arrival to its reply, by method",
            latency.clone(),
        );
        let sync_latency: Histograms<DeviceLabels> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "journal_sync_duration_seconds",
            "Time of each journal sync (fsync) of a device",
            sync_latency.clone(),
        );
        let group_size: Histograms<DeviceLabels> = Family::new_with_constructor(group_histogram);
        registry.register(
            "group_commit_transactions",
            "Transactions made durable by one journal sync (group commit size)",
            group_size.clone(),
        );
        let fenced = Gauge::default();
        registry.register(
            "cluster_fenced",
            "1 while the server refuses every call because it cannot renew its etcd lease in time",
            fenced.clone(),
        );
        let fenced_total = Counter::default();
        registry.register(
            "cluster_fenced_events",
            "Times the server started refusing calls because it could not renew its etcd lease",
            fenced_total.clone(),
        );
        let takeover = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "cluster_takeover_seconds",
            "The last takeover of this server's devices: from taking them in etcd to serving them (journal replay included)",
            takeover.clone(),
        );
        let devices = Arc::new(OnceLock::new());
        registry.register_collector(Box::new(DeviceCollector {
            devices: Arc::clone(&devices),
        }));
        Metrics {
            inner: Arc::new(Inner {
                registry,
                requests,
                latency,
                sync_latency,
                group_size,
                devices,
                fenced,
                fenced_total,
                takeover,
                log_windows: std::sync::Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Starts reporting `devices`: their space and leases at each scrape,
    /// and their journal syncs from now on. Only the first call counts.
    pub(crate) fn attach(&self, devices: &[Arc<ServedDevice>]) {
        if self.inner.devices.set(devices.to_vec()).is_err() {
            return;
        }
        for d in devices {
            let labels = DeviceLabels::device(d);
            d.store.observe_syncs(Arc::new(SyncHook {
                latency: self.inner.sync_latency.get_or_create(&labels).clone(),
                group: self.inner.group_size.get_or_create(&labels).clone(),
            }));
        }
    }

    /// Records whether the server refuses calls for its cluster lease.
    pub(crate) fn set_fenced(&self, fenced: bool) {
        if fenced && self.inner.fenced.set(1) == 0 {
            self.inner.fenced_total.inc();
        } else if !fenced {
            self.inner.fenced.set(0);
        }
    }

    /// Records a takeover of the server's devices in a cluster: `took`
    /// from taking them in etcd to serving them.
    pub fn record_takeover(&self, took: Duration) {
        self.inner.takeover.set(took.as_secs_f64());
    }

    /// Records one Allocator call.
    pub(crate) fn record(&self, method: &'static str, code: Code, took: Duration) {
        let i = &self.inner;
        i.requests
            .get_or_create(&RequestLabels {
                method,
                code: code_name(code),
            })
            .inc();
        i.latency
            .get_or_create(&MethodLabels { method })
            .observe(took.as_secs_f64());
    }

    /// Every metric in the OpenMetrics text format. Reads each device's
    /// status, which may wait for its journal writer: call it off the
    /// async reactor.
    pub fn encode(&self) -> String {
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, &self.inner.registry)
            .expect("writing to a String cannot fail");
        s
    }

    /// Serves `GET /metrics` on `listener` until `shutdown` completes.
    ///
    /// # Errors
    /// The listener's I/O errors.
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        use axum::http::header::CONTENT_TYPE;
        let m = self.clone();
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let m = m.clone();
                async move {
                    let body = tokio::task::spawn_blocking(move || m.encode())
                        .await
                        .unwrap_or_else(|e| format!("# metrics unavailable: {e}\n"));
                    (
                        [(
                            CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        body,
                    )
                }
            }),
        );
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
    }
}

/// The name of a gRPC code as Prometheus label value (`OK`,
/// `INVALID_ARGUMENT`, ...).
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Records journal syncs of one device.
struct SyncHook {
    latency: Histogram,
    group: Histogram,
}

impl SyncObserver for SyncHook {
    fn journal_synced(&self, txns: u32, took: Duration) {
        self.latency.observe(took.as_secs_f64());
        // Checkpoint announcements carry no transaction.
        if txns > 0 {
            self.group.observe(f64::from(txns));
        }
    }
}

/// Reads the devices' state at each scrape.
#[derive(Debug)]
struct DeviceCollector {
    devices: Arc<OnceLock<Vec<Arc<ServedDevice>>>>,
}

/// A whole-device value, read at a scrape.
enum Reading {
    Gauge(fn(&crate::pb::DeviceStatus) -> f64),
    Counter(fn(&ServedDevice) -> &AtomicU64),
    /// A counter read from the device's status.
    StatusCounter(fn(&crate::pb::DeviceStatus) -> u64),
    /// A gauge kept in the device's counters.
    Level(fn(&ServedDevice) -> &AtomicU64),
}

/// One (device, tenant) value, read at a scrape; `None` leaves the series
/// out.
type TenantReading = fn(&TenantUsage) -> Option<f64>;

/// A metric of the devices: its whole-device series (label `tenant=""`)
/// and its per-tenant series, each where it has one.
struct DeviceMetric {
    name: &'static str,
    help: &'static str,
    device: Option<Reading>,
    tenant: Option<TenantReading>,
}

const fn gauge(
    name: &'static str,
    help: &'static str,
    device: fn(&crate::pb::DeviceStatus) -> f64,
    tenant: Option<TenantReading>,
) -> DeviceMetric {
    DeviceMetric {
        name,
        help,
        device: Some(Reading::Gauge(device)),
        tenant,
    }
}

const fn counter(
    name: &'static str,
    help: &'static str,
    device: fn(&ServedDevice) -> &AtomicU64,
) -> DeviceMetric {
    DeviceMetric {
        name,
        help,
        device: Some(Reading::Counter(device)),
        tenant: None,
    }
}

const fn per_tenant(name: &'static str, help: &'static str, f: TenantReading) -> DeviceMetric {
    DeviceMetric {
        name,
        help,
        device: None,
        tenant: Some(f),
    }
}

const DEVICE_METRICS: &[DeviceMetric] = &[
    gauge(
        "device_capacity_blocks",
        "Blocks on the device, metadata included",
        |s| s.capacity_blocks as f64,
        None,
    ),
    gauge(
        "device_used_blocks",
        "Blocks allocated (metadata included), leases' unused parts excluded; per tenant: its allocations",
        |s| s.used_blocks as f64,
        Some(|u| Some(u.used as f64)),
    ),
    gauge(
        "device_free_blocks",
        "Blocks free to allocate or lease; per tenant: free inside its regions, outside its leases",
        |s| s.free_blocks as f64,
        Some(|u| Some(u.free as f64)),
    ),
    gauge(
        "device_leased_blocks",
        "Blocks inside live leases, not committed yet; per tenant: inside its leases",
        |s| s.leased_unused_blocks as f64,
        Some(|u| Some(u.leased as f64)),
    ),
    gauge(
        "device_leased_fragment_blocks",
        "Blocks in free runs of at most 1024 blocks inside live leases, as their holders report them",
        |s| s.leased_fragment_blocks as f64,
        None,
    ),
    gauge(
        "device_free_extents",
        "Maximal runs of free blocks; per tenant: inside its regions",
        |s| s.free_extents as f64,
        Some(|u| Some(u.free_extents as f64)),
    ),
    gauge(
        "device_largest_free_extent_blocks",
        "The longest free run, in blocks",
        |s| s.largest_free_extent as f64,
        None,
    ),
    gauge(
        "device_fragmentation",
        "Fragmentation score of the free space, 0 (every run holds a 4 MiB object) to 1",
        |s| s.fragmentation,
        None,
    ),
    per_tenant(
        "tenant_quota_blocks",
        "The tenant's quota on the device, in blocks (no series: no quota)",
        |u| (u.quota > 0).then_some(u.quota as f64),
    ),
    per_tenant(
        "tenant_regions",
        "Regions of the device assigned to the tenant",
        |u| Some(u.regions as f64),
    ),
    gauge(
        "device_removed_tenant_regions",
        "Regions still assigned to tenants no longer configured, because they hold allocations",
        |s| s.removed_tenant_regions as f64,
        None,
    ),
    gauge(
        "device_zeroed_through_blocks",
        "Background zeroing has passed every block below this one (the capacity once done; 0: nothing to zero)",
        |s| s.zeroed_through as f64,
        None,
    ),
    DeviceMetric {
        name: "device_zeroed_bytes",
        help: "Bytes of zeros written over never-used space in the background",
        device: Some(Reading::StatusCounter(|s| s.zeroed_bytes)),
        tenant: None,
    },
    gauge(
        "device_removed_tenant_blocks",
        "Blocks allocated in regions of tenants no longer configured",
        |s| s.removed_tenant_blocks as f64,
        None,
    ),
    gauge(
        "leases",
        "Live leases (outstanding)",
        |s| s.leases as f64,
        None,
    ),
    DeviceMetric {
        name: "device_queued_calls",
        help: "Calls sent to the device's owner thread and not yet taken by it",
        device: Some(Reading::Level(|d| &d.queued)),
        tenant: None,
    },
    counter("lease_grants", "Leases granted", |d| &d.events.grants),
    counter(
        "lease_extensions",
        "Grants added to a live lease of the caller",
        |d| &d.events.extensions,
    ),
    counter(
        "lease_recycled_blocks",
        "Freed blocks that commits handed back to their leases",
        |d| &d.events.recycled_blocks,
    ),
    counter(
        "lease_releases",
        "Leases given back by their holders or ended at shutdown",
        |d| &d.events.releases,
    ),
    counter(
        "lease_expiries",
        "Leases that expired (not renewed within their time to live)",
        |d| &d.events.expiries,
    ),
    counter(
        "lease_recalls",
        "Renewals that asked the holder to give its lease back",
        |d| &d.events.recalls,
    ),
];

/// What one scrape reads of one device.
struct DeviceReading<'a> {
    labels: DeviceLabels,
    status: crate::pb::DeviceStatus,
    device: &'a ServedDevice,
    /// Per configured tenant (none on an open server).
    tenants: Vec<(DeviceLabels, TenantUsage)>,
}

impl<'a> DeviceReading<'a> {
    fn read(i: usize, d: &'a ServedDevice) -> Self {
        let tenants = d.owners.get().map_or_else(Vec::new, |o| {
            o.usages()
                .map(|(t, u)| {
                    let labels = DeviceLabels {
                        device: d.name.clone(),
                        tenant: t.name.clone(),
                    };
                    (labels, u)
                })
                .collect()
        });
        DeviceReading {
            labels: DeviceLabels::device(d),
            status: device_status(i, d),
            device: d,
            tenants,
        }
    }
}

impl Collector for DeviceCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(devices) = self.devices.get() else {
            return Ok(());
        };
        let readings: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(i, d)| DeviceReading::read(i, d))
            .collect();
        for m in DEVICE_METRICS {
            let kind = match m.device {
                Some(Reading::Counter(_) | Reading::StatusCounter(_)) => {
                    ConstCounter::new(0u64).metric_type()
                }
                _ => ConstGauge::new(0.0).metric_type(),
            };
            let mut family = encoder.encode_descriptor(m.name, m.help, None, kind)?;
            for r in &readings {
                match &m.device {
                    Some(Reading::Gauge(f)) => {
                        ConstGauge::new(f(&r.status)).encode(family.encode_family(&r.labels)?)?
                    }
                    Some(Reading::Counter(f)) => {
                        ConstCounter::new(f(r.device).load(Ordering::Relaxed))
                            .encode(family.encode_family(&r.labels)?)?
                    }
                    Some(Reading::StatusCounter(f)) => {
                        ConstCounter::new(f(&r.status)).encode(family.encode_family(&r.labels)?)?
                    }
                    Some(Reading::Level(f)) => {
                        ConstGauge::new(f(r.device).load(Ordering::Relaxed) as f64)
                            .encode(family.encode_family(&r.labels)?)?
                    }
                    None => {}
                }
                let Some(f) = m.tenant else { continue };
                for (labels, u) in &r.tenants {
                    if let Some(v) = f(u) {
                        ConstGauge::new(v).encode(family.encode_family(labels)?)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// The path's Allocator method, if it is one of the service's.
fn method_of(path: &str) -> Option<&'static str> {
    let name = path.strip_prefix(SERVICE_PREFIX)?;
    Some(
        METHODS
            .iter()
            .find(|m| **m == name)
            .copied()
            .unwrap_or("unknown"),
    )
}

/// A tower layer that counts, times and logs the Allocator calls passing
/// through the transport.
#[derive(Clone, Debug)]
pub(crate) struct ObserveLayer(pub Metrics);

impl<S> tower::Layer<S> for ObserveLayer {
    type Service = Observe<S>;
    fn layer(&self, inner: S) -> Observe<S> {
        Observe {
            inner,
            metrics: self.0.clone(),
        }
    }
}

/// See [`ObserveLayer`].
#[derive(Clone, Debug)]
pub(crate) struct Observe<S> {
    inner: S,
    metrics: Metrics,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for Observe<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = method_of(req.uri().path());
        let t = Instant::now();
        let fut = self.inner.call(req);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let resp = fut.await?;
            if let Some(method) = method {
                // A failed unary call answers with its status in the
                // headers (trailers-only); a successful one has none there.
                let status = tonic::Status::from_header_map(resp.headers());
                let code = status.as_ref().map_or(Code::Ok, |s| s.code());
                metrics.record(method, code, t.elapsed());
                if let Some(s) = status.filter(|s| s.code() != Code::Ok) {
                    metrics.log_failure(method, &s);
                }
            }
            Ok(resp)
        })
    }
}

/// At most one log line per (method, code) of failed calls in this time.
const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Messages of the statuses the transport answers for a malformed or
/// abandoned request (undecodable body, bad framing, a stream the client
/// reset): the client's doing, whatever their code.
const CLIENT_FAULTS: [&str; 6] = [
    "failed to decode Protobuf message",
    "protocol error:",
    "h2 protocol error:",
    "Unexpected EOF decoding stream",
    "Error decompressing:",
    "Missing request message",
];

/// How loud a failed call is: ERROR only for the server's own faults (a
/// store's I/O, a broken invariant), WARN for refusals an operator may
/// act on (no space, quotas and limits, credentials, overload), INFO for
/// the client's own mistakes (malformed requests, unknown leases,
/// conflicts, cancelled or reset calls).
fn level_of(s: &tonic::Status) -> tracing::Level {
    use tracing::Level;
    let m = s.message();
    match s.code() {
        Code::Internal | Code::Unknown | Code::DataLoss
            if CLIENT_FAULTS.iter().any(|p| m.starts_with(p)) =>
        {
            Level::INFO
        }
        Code::Unavailable if m.starts_with("too busy") || m.contains("shutting down") => {
            Level::WARN
        }
        Code::Internal | Code::Unknown | Code::DataLoss | Code::Unavailable => Level::ERROR,
        Code::ResourceExhausted | Code::Unauthenticated | Code::PermissionDenied => Level::WARN,
        _ => Level::INFO,
    }
}

impl Metrics {
    /// Logs a failed call at its level ([`level_of`]), at most one line per
    /// (method, code) each [`LOG_INTERVAL`], with the count of lines left
    /// out since the last one: a client repeating a mistake cannot flood
    /// the log.
    pub(crate) fn log_failure(&self, method: &'static str, s: &tonic::Status) {
        let now = Instant::now();
        let suppressed = {
            let mut w = crate::sync::lock(&self.inner.log_windows);
            match w.entry((method, s.code() as i32)) {
                std::collections::hash_map::Entry::Occupied(mut e) => {
                    let e = e.get_mut();
                    if now.saturating_duration_since(e.logged_at) < LOG_INTERVAL {
                        e.suppressed += 1;
                        return;
                    }
                    e.logged_at = now;
                    std::mem::take(&mut e.suppressed)
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(LogWindow {
                        logged_at: now,
                        suppressed: 0,
                    });
                    0
                }
            }
        };
        let code = code_name(s.code());
        let message = s.message();
        match level_of(s) {
            tracing::Level::ERROR => {
                tracing::error!(method, code, message, suppressed, "call failed")
            }
            tracing::Level::WARN => {
                tracing::warn!(method, code, message, suppressed, "call refused")
            }
            _ => tracing::info!(method, code, message, suppressed, "call refused"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_server_faults_are_errors() {
        use tracing::Level;
        let at = |code, m: &str| level_of(&tonic::Status::new(code, m));
        assert_eq!(at(Code::Internal, "store is corrupt"), Level::ERROR);
        assert_eq!(at(Code::Unavailable, "device I/O error"), Level::ERROR);
        assert_eq!(
            at(Code::Internal, "failed to decode Protobuf message: x"),
            Level::INFO
        );
        assert_eq!(at(Code::Internal, "h2 protocol error: reset"), Level::INFO);
        assert_eq!(at(Code::Cancelled, "client cancelled"), Level::INFO);
        assert_eq!(at(Code::InvalidArgument, "bad"), Level::INFO);
        assert_eq!(at(Code::ResourceExhausted, "no space"), Level::WARN);
        assert_eq!(
            at(Code::Unavailable, "too busy: x; retry later"),
            Level::WARN
        );
    }

    #[test]
    fn unknown_paths_share_one_method_label() {
        assert_eq!(method_of("/blockalloc.v1.Allocator/Commit"), Some("Commit"));
        assert_eq!(method_of("/blockalloc.v1.Allocator/Nope1"), Some("unknown"));
        assert_eq!(method_of("/blockalloc.v1.Allocator/Nope2"), Some("unknown"));
        assert_eq!(method_of("/grpc.health.v1.Health/Check"), None);
    }
}
