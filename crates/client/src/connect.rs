//! [`ConnectOptions`]: how a [`Client`](crate::Client) reaches its server —
//! plaintext or TLS (rustls with ring), an optional client certificate for
//! servers that ask for one, and a switch that refuses plaintext.

use std::path::Path;
use std::time::Duration;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::error::{ClientError, Result};

/// TLS settings of a connection.
#[derive(Clone, Debug, Default)]
pub struct TlsOptions {
    /// CA certificates (PEM) that sign the server's certificate; `None`
    /// trusts the public web roots built into the client.
    pub ca_pem: Option<Vec<u8>>,
    /// The client's certificate chain and private key (PEM), for servers
    /// that require client certificates.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name the server's certificate must carry; `None` uses the
    /// address's host.
    pub domain: Option<String>,
}

impl TlsOptions {
    /// Reads the PEM files: a CA, and a client certificate with its key
    /// (both or neither).
    ///
    /// # Errors
    /// [`ClientError::Config`] naming the file that is missing or holds no
    /// certificate or key.
    pub fn from_files(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
        domain: Option<String>,
    ) -> Result<TlsOptions> {
        use blockalloc_proto::tls::{read_certificates, read_key, TlsError};
        let config = |e: TlsError| ClientError::Config(e.to_string());
        let ca_pem = ca
            .map(|p| read_certificates("CA", p))
            .transpose()
            .map_err(config)?;
        let identity = match (cert, key) {
            (Some(c), Some(k)) => Some((
                read_certificates("client certificate", c).map_err(config)?,
                read_key(k).map_err(config)?,
            )),
            (None, None) => None,
            _ => {
                return Err(ClientError::Config(
                    "a client certificate needs its key, and a key its certificate".into(),
                ))
            }
        };
        Ok(TlsOptions {
            ca_pem,
            identity,
            domain,
        })
    }
}

/// How to connect.
#[derive(Clone, Debug, Default)]
pub struct ConnectOptions {
    /// TLS settings; TLS is used for `https://` addresses, and for bare
    /// `host:port` addresses when this is set.
    pub tls: Option<TlsOptions>,
    /// Refuse to connect without TLS.
    pub require_tls: bool,
    /// Send per-call `Allocate` and `Free` as unary calls instead of on
    /// the connection's `Calls` stream: for a proxy that does not pass
    /// bidirectional streams, or to compare the two.
    pub unary_calls: bool,
}

/// The endpoint for `addr` (`host:port`, `http://…` or `https://…`).
pub(crate) fn endpoint(addr: &str, opts: &ConnectOptions) -> Result<Endpoint> {
    let uri = if addr.contains("://") {
        addr.to_string()
    } else if opts.tls.is_some() {
        format!("https://{addr}")
    } else {
        format!("http://{addr}")
    };
    let tls = uri.starts_with("https://");
    if !tls && opts.require_tls {
        return Err(ClientError::Config(format!(
            "{addr} is a plaintext address and TLS is required; use https:// (with a CA \
             certificate if the server's is not publicly signed)"
        )));
    }
    if !tls && opts.tls.is_some() {
        return Err(ClientError::Config(format!(
            "TLS settings were given for the plaintext address {addr}; use https://"
        )));
    }
    let mut ep = Endpoint::from_shared(uri)
        .map_err(|e| ClientError::Config(format!("bad address {addr:?}: {e}")))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    if tls {
        let o = opts.tls.clone().unwrap_or_default();
        let mut cfg = ClientTlsConfig::new();
        cfg = match o.ca_pem {
            Some(ca) => cfg.ca_certificate(Certificate::from_pem(ca)),
            None => cfg.with_webpki_roots(),
        };
        if let Some((cert, key)) = o.identity {
            cfg = cfg.identity(Identity::from_pem(cert, key));
        }
        if let Some(d) = o.domain {
            cfg = cfg.domain_name(d);
        }
        ep = ep
            .tls_config(cfg)
            .map_err(|e| ClientError::Config(format!("TLS settings for {addr}: {e}")))?;
    }
    Ok(ep)
}
