//! TLS files: for the server, certificate, key and optional client CA files read
//! into tonic's rustls configuration (ring; no system OpenSSL).
//!
//! Every file is read and parsed here, before the listener serves, so that
//! a missing file, a file without a PEM certificate or key, or a key that
//! does not match its certificate is reported with the file's name instead
//! of failing each handshake later. The PEM readers are
//! [`blockalloc_proto::tls`]'s, which clients use too.

use std::path::PathBuf;

pub use blockalloc_proto::tls::{error_chain, read_certificates, read_key, TlsError};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// The files of a TLS server (in a configuration file: `[server.tls]` with
/// `cert`, `key` and optionally `client_ca`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The server's certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// The server certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by one of
    /// these CAs (PEM): mutual TLS.
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// Reads and checks the files into tonic's server configuration.
    ///
    /// # Errors
    /// [`TlsError`] naming the file at fault.
    pub fn server_config(&self) -> Result<ServerTlsConfig, TlsError> {
        let cert = read_certificates("certificate", &self.cert)?;
        let key = read_key(&self.key)?;
        let mut cfg = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
        if let Some(ca) = &self.client_ca {
            cfg = cfg.client_ca_root(Certificate::from_pem(read_certificates("client CA", ca)?));
        }
        // tonic builds the rustls configuration only when the transport is
        // built; build it once here to tell a mismatched key apart early.
        tonic::transport::Server::builder()
            .tls_config(cfg.clone())
            .map_err(|e| TlsError::Rejected {
                cert: self.cert.clone(),
                key: self.key.clone(),
                reason: error_chain(&e),
            })?;
        Ok(cfg)
    }
}
