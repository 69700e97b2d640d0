//! Certificates for TLS tests, made with rcgen: a CA, a server certificate
//! for `localhost` and `127.0.0.1`, a client certificate, and a second CA
//! that signed neither.

#![allow(dead_code)] // Each test file uses some of the files.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
};

/// PEM files written into one directory.
pub struct Pki {
    /// The CA that signed the server and client certificates.
    pub ca: PathBuf,
    /// A CA that signed nothing here.
    pub other_ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(rcgen::DnType::CommonName, name.to_string());
    CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap()
}

fn leaf(
    names: &[&str],
    usage: ExtendedKeyUsagePurpose,
    issuer: &CertifiedIssuer<'static, KeyPair>,
) -> (String, String) {
    let mut p =
        CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    p.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// Writes a fresh set of certificates into `dir`.
pub fn make(dir: &Path) -> Pki {
    let ca_issuer = ca("blockalloc test CA");
    let other = ca("another CA");
    let (sc, sk) = leaf(
        &["localhost", "127.0.0.1"],
        ExtendedKeyUsagePurpose::ServerAuth,
        &ca_issuer,
    );
    let (cc, ck) = leaf(&["client"], ExtendedKeyUsagePurpose::ClientAuth, &ca_issuer);
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    Pki {
        ca: write("ca.pem", &ca_issuer.pem()),
        other_ca: write("other-ca.pem", &other.pem()),
        server_cert: write("server.pem", &sc),
        server_key: write("server.key", &sk),
        client_cert: write("client.pem", &cc),
        client_key: write("client.key", &ck),
    }
}
