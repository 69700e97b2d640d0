//! PEM files for TLS, read and checked before they are used: a server's
//! certificate and key, a client's certificate and key, a CA.
//!
//! Every file is parsed when read, so that a missing file or a file without
//! a PEM certificate or key is reported with the file's name instead of
//! failing each handshake later.

use std::path::{Path, PathBuf};

/// Why a TLS configuration cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read the TLS {what} file {}: {source}", path.display())]
    Read {
        /// Which file: certificate, key, client CA.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file holds no PEM item of the expected kind, or a malformed one.
    #[error("the TLS {what} file {} holds no valid PEM {expected}", path.display())]
    NoPem {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What it should hold.
        expected: &'static str,
    },
    /// The files parse but rustls refuses them together (e.g. the key does
    /// not belong to the certificate).
    #[error("the TLS certificate {} and key {} cannot be used together: {reason}", cert.display(), key.display())]
    Rejected {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls' reason.
        reason: String,
    },
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// Reads a PEM file that must hold at least one certificate; returns its
/// bytes. `what` names the file in the error (e.g. "client CA").
///
/// # Errors
/// [`TlsError::Read`], [`TlsError::NoPem`].
pub fn read_certificates(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let pem = read(what, path)?;
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&pem).collect();
    match certs {
        Ok(c) if !c.is_empty() => Ok(pem),
        _ => Err(TlsError::NoPem {
            what,
            path: path.to_path_buf(),
            expected: "certificate",
        }),
    }
}

/// Reads a PEM file that must hold a private key; returns its bytes.
///
/// # Errors
/// [`TlsError::Read`], [`TlsError::NoPem`].
pub fn read_key(path: &Path) -> Result<Vec<u8>, TlsError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::PrivateKeyDer;
    let pem = read("key", path)?;
    match PrivateKeyDer::from_pem_slice(&pem) {
        Ok(_) => Ok(pem),
        Err(_) => Err(TlsError::NoPem {
            what: "key",
            path: path.to_path_buf(),
            expected: "private key",
        }),
    }
}

/// An error and its sources on one line, each source once: the reason a
/// TLS handshake or configuration failed is often several sources down.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}
