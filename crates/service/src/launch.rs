//! [`Launch`]: the transport of a server, listening before its devices are
//! open, and the order of a graceful stop.
//!
//! Opening a store replays its journal, which can take a while after a
//! crash. Listening first lets an operator (and a load balancer) see the
//! server: `grpc.health.v1` answers NOT_SERVING and Allocator calls get
//! UNAVAILABLE until [`Launch::serve`] hands over the opened server.
//!
//! A stop goes: health NOT_SERVING → `drain_grace` (calls are still
//! answered, so that balancers move away first) → the listener closes, each
//! `Calls` stream gets the stop notice and is read on until its client
//! closes its side (`stop_grace` at most; the calls read meanwhile are
//! answered UNAVAILABLE and do not run), and the calls in flight finish
//! (commits included) → every lease ends → every store closes, so that the
//! next open replays nothing. The transport gets `request_timeout` plus
//! `stop_grace` to finish; past that its connections are dropped (a call
//! still running then is refused by the closed store if it writes).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::TcpIncoming;
use tonic::Status;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;
use tower::Service;

use crate::accept::Accepted;
use crate::auth::Authenticate;
use crate::config::Config;
use crate::metrics::{Metrics, ObserveLayer};
use crate::pb::allocator_server::AllocatorServer;
use crate::server::{ServeError, Server};

/// The health service names whose status the server sets: the whole
/// server ("") and the Allocator service.
fn health_names() -> [&'static str; 2] {
    ["", <AllocatorServer<Server> as NamedService>::NAME]
}

/// A listening transport whose Allocator service is not open yet.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use blockalloc_service::{Config, Launch, ServedDevice, Server};
/// use blockalloc_store::{device::MemDevice, FormatOptions, Store};
///
/// let cfg = Config::default();
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// // Health checks answer NOT_SERVING from here on...
/// let launch = Launch::start(listener, &cfg).await?;
/// let store = Store::format(MemDevice::new(256 << 20), FormatOptions::default())?;
/// let server = Server::new(vec![ServedDevice::new("mem0", Arc::new(store))], cfg)?;
/// // ...and SERVING from here until the shutdown signal.
/// launch.serve(server, async { let _ = tokio::signal::ctrl_c().await; }).await?;
/// # Ok(()) }
/// ```
pub struct Launch {
    reporter: HealthReporter,
    gate: Gate,
    metrics: Metrics,
    stop: Option<oneshot::Sender<()>>,
    transport: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl std::fmt::Debug for Launch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launch")
            .field("open", &self.gate.0.get().is_some())
            .finish_non_exhaustive()
    }
}

impl Launch {
    /// Starts serving on `listener` (over TLS when `cfg.tls` is set) with
    /// the health service reporting NOT_SERVING and Allocator calls
    /// answered UNAVAILABLE.
    ///
    /// # Errors
    /// [`ServeError::Tls`] for unusable TLS files, [`ServeError::TlsRequired`]
    /// when `cfg.require_tls` is set without them, [`ServeError::Transport`].
    pub async fn start(listener: TcpListener, cfg: &Config) -> Result<Launch, ServeError> {
        Self::start_open(listener, cfg, None).await
    }

    /// As [`start`](Self::start); with `open`, the Allocator service is
    /// open and health SERVING before the first connection is accepted.
    pub(crate) async fn start_open(
        listener: TcpListener,
        cfg: &Config,
        open: Option<&Server>,
    ) -> Result<Launch, ServeError> {
        let tls = match (&cfg.tls, cfg.require_tls) {
            (Some(files), _) => Some(files.server_config()?),
            (None, true) => return Err(ServeError::TlsRequired),
            (None, false) => None,
        };
        let (reporter, health) = tonic_health::server::health_reporter();
        let metrics = Metrics::new();
        let gate = Gate(Arc::new(OnceLock::new()));
        set_health(&reporter, ServingStatus::NotServing).await;
        let mut builder = cfg.limits.transport();
        let tls_on = tls.is_some();
        if let Some(t) = tls {
            builder = builder.tls_config(t)?;
        }
        let router = builder
            .layer(ObserveLayer(metrics.clone()))
            .add_service(health)
            .add_service(gate.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let transport = tokio::spawn(router.serve_with_incoming_shutdown(
            // Without TCP_NODELAY a small reply waits for the client's
            // delayed acknowledgement: tens of milliseconds per call.
            Accepted::new(
                TcpIncoming::from(listener).with_nodelay(Some(true)),
                cfg.limits.max_connections,
                cfg.limits.handshake_timeout,
                tls_on,
            ),
            async {
                let _ = stopped.await;
            },
        ));
        let launch = Launch {
            reporter,
            gate,
            metrics,
            stop: Some(stop),
            transport: Some(transport),
        };
        if let Some(server) = open {
            launch.open(server).await;
        }
        Ok(launch)
    }

    /// Opens the Allocator service with `server` and reports SERVING;
    /// [`serve`](Self::serve) does it when it was not done before. Only the
    /// first server given counts.
    pub async fn open(&self, server: &Server) {
        if self.gate.0.get().is_none() {
            self.metrics.attach(server.devices());
            server.observe(self.metrics.clone());
            let _ = self.gate.0.set(InterceptedService::new(
                server
                    .limits()
                    .service(AllocatorServer::new(server.clone())),
                server.authenticator(),
            ));
        }
        set_health(&self.reporter, ServingStatus::Serving).await;
    }

    /// The server's metrics (serve them with [`Metrics::serve`]).
    pub fn metrics(&self) -> Metrics {
        self.metrics.clone()
    }

    /// Opens the Allocator service with `server` (unless
    /// [`open`](Self::open) did) and serves until `shutdown` completes, then stops gracefully (see the module docs).
    ///
    /// # Errors
    /// [`ServeError::Transport`], [`ServeError::Close`].
    pub async fn serve(
        mut self,
        server: Server,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        self.open(&server).await;
        tracing::info!(devices = server.devices().len(), "serving");
        let mut transport = self.transport.take().expect("taken only here");
        let early = tokio::select! {
            () = shutdown => None,
            r = &mut transport => Some(r),
            () = health_follows_fence(&self.reporter, &self.metrics, &server) => None,
        };
        set_health(&self.reporter, ServingStatus::NotServing).await;
        let r = match early {
            Some(r) => r,
            None => {
                let grace = server.config().drain_grace;
                tracing::info!(grace_ms = grace.as_millis() as u64, "draining");
                tokio::time::sleep(grace).await;
                server.end_watches();
                if let Some(stop) = self.stop.take() {
                    let _ = stop.send(());
                }
                let bound = server.limits().request_timeout + server.config().stop_grace;
                match tokio::time::timeout(bound, &mut transport).await {
                    Ok(r) => r,
                    Err(_) => {
                        tracing::warn!(
                            bound_ms = bound.as_millis() as u64,
                            "shutdown: connections still open past request_timeout + stop_grace are dropped"
                        );
                        transport.abort();
                        Ok(Ok(()))
                    }
                }
            }
        };
        let closed = server.close().await;
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e.into()),
            Err(e) => {
                return Err(ServeError::Devices(format!(
                    "the transport task failed: {e}"
                )))
            }
        }
        closed?;
        tracing::info!("stopped");
        Ok(())
    }
}

/// While the server has a fence ([`Server::fence_with`]): health
/// NOT_SERVING whenever it refuses calls, SERVING again when it lifts,
/// checked every 100 ms. Never ends.
async fn health_follows_fence(reporter: &HealthReporter, metrics: &Metrics, server: &Server) {
    if !server.has_fence() {
        return std::future::pending().await;
    }
    let mut fenced = false;
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let now = server.is_fenced();
        if now != fenced {
            fenced = now;
            metrics.set_fenced(now);
            if now {
                tracing::warn!(
                    "cannot renew the cluster lease: refusing every call (health NOT_SERVING)"
                );
                set_health(reporter, ServingStatus::NotServing).await;
            } else {
                tracing::info!("the cluster lease is renewed again: serving");
                set_health(reporter, ServingStatus::Serving).await;
            }
        }
    }
}

impl Drop for Launch {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn set_health(reporter: &HealthReporter, status: ServingStatus) {
    for name in health_names() {
        reporter.set_service_status(name, status).await;
    }
}

/// The Allocator service once it is open; UNAVAILABLE before.
#[derive(Clone)]
struct Gate(Arc<OnceLock<InterceptedService<AllocatorServer<Server>, Authenticate>>>);

impl NamedService for Gate {
    const NAME: &'static str = <AllocatorServer<Server> as NamedService>::NAME;
}

impl Service<http::Request<Body>> for Gate {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The generated service is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        match self.0.get() {
            Some(svc) => {
                let mut svc = svc.clone();
                Box::pin(async move {
                    let r = svc.call(req).await?;
                    Ok(r.map(Body::new))
                })
            }
            None => Box::pin(async {
                Ok(Status::unavailable(
                    "the server is opening its devices (replaying their journals); retry shortly",
                )
                .into_http())
            }),
        }
    }
}

impl Server {
    /// Serves on `listener` until `shutdown` completes, with the health
    /// service (`grpc.health.v1`) reporting SERVING meanwhile. Then stops
    /// gracefully: ends every lease (their unused parts were never durable)
    /// and checkpoints every store, so the next open replays nothing. To
    /// listen while the stores are still opening, see [`Launch`].
    ///
    /// # Errors
    /// As [`Launch::start`] and [`Launch::serve`].
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        let launch = Launch::start_open(listener, self.config(), Some(&self)).await?;
        launch.serve(self, shutdown).await
    }
}
