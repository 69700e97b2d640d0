//! Flags for running a server in production and for reaching one: TLS,
//! metrics and draining of `serve`, and the connection flags of the
//! commands that call a server (`bench --remote`, `status --remote`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use blockalloc_client::{Client, ConnectOptions, TlsOptions};
use blockalloc_service::{Config, TlsFiles};
use clap::Args;

use crate::error::UsageError;

/// `serve`'s TLS, metrics and shutdown flags.
#[derive(Debug, Args)]
pub struct ServeOpsArgs {
    /// Serve over TLS with this certificate chain (PEM, leaf first).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Require client certificates signed by this CA (PEM): mutual TLS.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Refuse to start without --tls-cert and --tls-key.
    #[arg(long)]
    pub require_tls: bool,

    /// Serve Prometheus metrics on ADDR (`http://ADDR/metrics`); port 0
    /// picks a free port, printed on stdout as `metrics on URL`. HOST:PORT,
    /// as --listen.
    #[arg(long, value_name = "HOST:PORT", value_parser = blockalloc_service::parse_listen_addr)]
    pub metrics: Option<SocketAddr>,

    /// On SIGTERM/SIGINT, report NOT_SERVING to health checks for this many
    /// seconds while still answering, before closing the listener
    /// [default: 0].
    ///
    /// Seconds, or a duration with a unit: `400ms`, `2m`.
    #[arg(long, value_name = "DURATION", value_parser = crate::checks::seconds)]
    pub drain_grace: Option<f64>,
}

impl ServeOpsArgs {
    /// `cfg` with these flags applied.
    ///
    /// # Errors
    /// [`UsageError`] for --require-tls without a certificate, or a bad
    /// --drain-grace.
    pub fn apply(&self, cfg: Config) -> Result<Config, UsageError> {
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_client_ca.clone(),
            }),
            _ => cfg.tls.clone(),
        };
        let require_tls = self.require_tls || cfg.require_tls;
        if require_tls && tls.is_none() {
            return Err(UsageError::new(
                "--require-tls: give the server's certificate and key with --tls-cert and --tls-key",
            ));
        }
        let drain_grace = match self.drain_grace {
            Some(s) if !(s.is_finite() && (0.0..=3600.0).contains(&s)) => {
                return Err(UsageError::new(format!(
                    "--drain-grace {s} must be between 0 and 3600 seconds"
                )))
            }
            Some(s) => Duration::from_secs_f64(s),
            None => cfg.drain_grace,
        };
        Ok(Config {
            tls,
            require_tls,
            metrics_addr: self.metrics.or(cfg.metrics_addr),
            drain_grace,
            ..cfg
        })
    }
}

/// How a command reaches a server.
#[derive(Clone, Debug, Default, Args)]
pub struct ConnectArgs {
    /// Trust this CA (PEM) for the server's certificate; implies TLS.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,

    /// Present this client certificate (PEM) to a server that requires
    /// one; implies TLS.
    #[arg(
        long = "tls-client-cert",
        value_name = "FILE",
        requires = "tls_client_key"
    )]
    pub tls_client_cert: Option<PathBuf>,

    /// The private key of --tls-client-cert (PEM).
    #[arg(
        long = "tls-client-key",
        value_name = "FILE",
        requires = "tls_client_cert"
    )]
    pub tls_client_key: Option<PathBuf>,

    /// The name the server's certificate must carry, when it differs from
    /// the address's host (e.g. connecting by IP address).
    #[arg(long, value_name = "NAME")]
    pub tls_domain: Option<String>,

    /// Refuse to connect without TLS.
    #[arg(long = "require-tls")]
    pub require_tls: bool,

    /// Send per-call allocations and frees as unary calls, not on the one
    /// `Calls` stream per connection (for a proxy that does not pass
    /// bidirectional streams, or to compare the two).
    #[arg(long = "unary-calls")]
    pub unary_calls: bool,

    /// Read the tenant's bearer token from this file (a server with
    /// tenants wants one on every call); else from the BLOCKALLOC_TOKEN
    /// environment variable, if set. Never on the command line, where other
    /// users could read it.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

impl ConnectArgs {
    /// The bearer token to send, if any.
    ///
    /// # Errors
    /// [`UsageError`] for an unreadable or empty token file.
    pub fn token(&self) -> Result<Option<String>, UsageError> {
        match &self.token_file {
            Some(p) => {
                let t = std::fs::read_to_string(p).map_err(|e| {
                    UsageError::new(format!("cannot read --token-file {}: {e}", p.display()))
                })?;
                let t = t.trim();
                if t.is_empty() {
                    return Err(UsageError::new(format!(
                        "--token-file {} is empty",
                        p.display()
                    )));
                }
                Ok(Some(t.to_string()))
            }
            None => Ok(std::env::var("BLOCKALLOC_TOKEN")
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())),
        }
    }

    /// The client's connection options; reads the TLS files.
    ///
    /// # Errors
    /// [`UsageError`] naming an unreadable or malformed file.
    pub fn options(&self) -> Result<ConnectOptions, UsageError> {
        let any_tls =
            self.tls_ca.is_some() || self.tls_client_cert.is_some() || self.tls_domain.is_some();
        let tls = if any_tls {
            Some(
                TlsOptions::from_files(
                    self.tls_ca.as_deref(),
                    self.tls_client_cert.as_deref(),
                    self.tls_client_key.as_deref(),
                    self.tls_domain.clone(),
                )
                .map_err(|e| UsageError::new(e.to_string()))?,
            )
        } else {
            None
        };
        Ok(ConnectOptions {
            tls,
            require_tls: self.require_tls,
            unary_calls: self.unary_calls,
        })
    }

    /// Connects to `addr`.
    ///
    /// # Errors
    /// Usage errors for the flags; the server unreachable.
    pub async fn connect(&self, addr: &str) -> anyhow::Result<Client> {
        let opts = self.options()?;
        let token = self.token()?;
        match Client::connect_with(addr, &opts).await {
            Ok(c) => c
                .with_token(token.as_deref())
                .map_err(|e| UsageError::new(format!("the bearer token: {e}")).into()),
            Err(blockalloc_client::ClientError::Config(m)) => Err(UsageError::new(m).into()),
            Err(e) => {
                Err(anyhow::Error::new(e).context(format!("cannot reach the server at {addr}")))
            }
        }
    }
}
