//! [`ConnectOptions`]: how a [`Client`](crate::Client) reaches its server —
//! plaintext or TLS (rustls with ring), an optional client certificate for
//! servers that ask for one, and a switch that refuses plaintext.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
    let bare = !addr.contains("://");
    // Without a scheme a URI's port defaults to 80 or 443: never the
    // server's, so a missing port is a mistake to report, not to guess.
    if bare
        && !addr
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
    {
        let what = if addr.parse::<u16>().is_ok() {
            "is a port without a host"
        } else {
            "is not HOST:PORT"
        };
        return Err(ClientError::Config(format!(
            "the server address {addr:?} {what}; give HOST:PORT, e.g. 127.0.0.1:7878 or \
             localhost:7878 (or an http:// or https:// URI)"
        )));
    }
    let uri = if !bare {
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

/// What to ask a server whose connection failed, to tell a settings
/// mistake from an outage (see `Client::fail`).
#[derive(Debug)]
pub(crate) enum Probe {
    /// A plaintext connection to `host:port`: does the server serve TLS?
    Plaintext(String),
    /// A TLS connection without a client certificate: does the server
    /// demand one?
    Anonymous {
        /// `host:port`.
        addr: String,
        /// The name the server's certificate must carry.
        name: String,
        /// The CA to trust (`None`: the public web roots).
        ca_pem: Option<Vec<u8>>,
    },
}

impl Probe {
    /// The probe for a connection to `ep` with `opts`; `None` when there is
    /// nothing to ask (a TLS connection with a client certificate).
    pub(crate) fn of(ep: &Endpoint, opts: &ConnectOptions) -> Option<Probe> {
        let uri = ep.uri();
        let tls = uri.scheme_str() == Some("https");
        let a = uri.authority()?;
        let port = a.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let addr = format!("{}:{port}", a.host());
        if !tls {
            return Some(Probe::Plaintext(addr));
        }
        let o = opts.tls.clone().unwrap_or_default();
        if o.identity.is_some() {
            return None;
        }
        let host = a.host().trim_start_matches('[').trim_end_matches(']');
        Some(Probe::Anonymous {
            name: o.domain.unwrap_or_else(|| host.to_string()),
            addr,
            ca_pem: o.ca_pem,
        })
    }

    /// The error that names the mistake, when the server shows one.
    pub(crate) async fn ask(&self) -> Option<ClientError> {
        let ask = async {
            match self {
                Probe::Plaintext(addr) => serves_tls(addr).await.then(|| {
                    ClientError::Config(format!(
                        "the server at {addr} serves TLS and this connection is plaintext: \
                         connect to https://{addr}, trusting the CA that signed the server's \
                         certificate if no public root does (blockalloc: --tls-ca FILE)"
                    ))
                }),
                Probe::Anonymous { addr, name, ca_pem } => {
                    let alert = alert_to_anonymous(addr, name, ca_pem.as_deref()).await?;
                    crate::error::refused_for_certificate(alert)
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(5), ask)
            .await
            .ok()
            .flatten()
    }
}

/// The first bytes an HTTP/2 client sends: the preface and an empty
/// SETTINGS frame. An HTTP/2 server answers them with its SETTINGS.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// The TLS alert the server at `addr` ends a connection without a client
/// certificate with, if it does. TLS 1.3 finishes the handshake before
/// the server checks the client's certificate, so the alert comes with the
/// first read; a call on a tonic channel often sees only the connection
/// closing, so this asks on a connection of its own.
async fn alert_to_anonymous(
    addr: &str,
    name: &str,
    ca_pem: Option<&[u8]>,
) -> Option<rustls::AlertDescription> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    match ca_pem {
        Some(pem) => {
            for c in CertificateDer::pem_slice_iter(pem).flatten() {
                roots.add(c).ok()?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .ok()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = ServerName::try_from(name.to_string()).ok()?;
    let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let alert = |e: std::io::Error| match e.get_ref()?.downcast_ref::<rustls::Error>()? {
        rustls::Error::AlertReceived(a) => Some(*a),
        _ => None,
    };
    let mut tls = match connector.connect(name, tcp).await {
        Ok(t) => t,
        Err(e) => return alert(e),
    };
    if let Err(e) = tls.write_all(H2_PREFACE).await {
        return alert(e);
    }
    let mut first = [0u8; 1];
    match tls.read(&mut first).await {
        Err(e) => alert(e),
        Ok(_) => None,
    }
}

/// True when the server at `addr` answers a TLS ClientHello with a TLS
/// record (a handshake or an alert): it serves TLS. An HTTP/2 server
/// answers with a SETTINGS frame instead, or nothing answers at all.
pub(crate) async fn serves_tls(addr: &str) -> bool {
    let probe = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(&CLIENT_HELLO).await.ok()?;
        let mut head = [0u8; 2];
        s.read_exact(&mut head).await.ok()?;
        Some(matches!(head, [0x15 | 0x16, 0x03]))
    };
    tokio::time::timeout(Duration::from_secs(2), probe)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// A TLS 1.2/1.3 ClientHello with common suites and no key share: a TLS
/// server answers it with a ServerHello, a HelloRetryRequest or an alert,
/// each a TLS record.
const CLIENT_HELLO: [u8; 95] = {
    const BODY: [u8; 86] = [
        0x03, 0x03, // client version TLS 1.2
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // random
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,    //
        0x00, // no session id
        0x00, 0x0a, 0x13, 0x01, 0x13, 0x02, 0x13, 0x03, 0xc0, 0x2f, 0xc0, 0x2b, // suites
        0x01, 0x00, // no compression
        0x00, 0x23, // extensions: 35 bytes
        0x00, 0x0a, 0x00, 0x06, 0x00, 0x04, 0x00, 0x1d, 0x00, 0x17, // groups
        0x00, 0x0d, 0x00, 0x06, 0x00, 0x04, 0x04, 0x03, 0x08, 0x04, // signatures
        0x00, 0x2b, 0x00, 0x05, 0x04, 0x03, 0x04, 0x03, 0x03, // versions 1.3, 1.2
        0x00, 0x33, 0x00, 0x02, 0x00, 0x00, // no key shares
    ];
    let mut m = [0u8; 95];
    // Record header: handshake, TLS 1.0 record version, length.
    m[0] = 0x16;
    m[1] = 0x03;
    m[2] = 0x01;
    m[4] = (BODY.len() + 4) as u8;
    // Handshake header: ClientHello, length.
    m[5] = 0x01;
    m[8] = BODY.len() as u8;
    let mut i = 0;
    while i < BODY.len() {
        m[9 + i] = BODY[i];
        i += 1;
    }
    m
};
