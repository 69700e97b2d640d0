//! Tenants: who may call the server, with which token, on which devices,
//! and how much space each may hold per device.
//!
//! A tenant's bearer token is a random 256-bit value; the server keeps only
//! its SHA-256 (a slow password hash buys nothing against a token that
//! cannot be guessed) and compares digests in constant time.

use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Prefix of every token [`new_token`] makes, so that a leaked one is easy
/// to recognise.
pub const TOKEN_PREFIX: &str = "bat_";

/// One `[[tenant]]` entry of the configuration file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The tenant's name: letters, digits, `-`, `_` and `.`, at most 64
    /// bytes. Region ownership is recorded under it.
    pub name: String,
    /// The SHA-256 of the tenant's bearer token, in hex (64 digits), as
    /// `blockalloc token new` prints it.
    pub token_sha256: String,
    /// The most space the tenant may hold on each device (allocated plus
    /// leased), in bytes or with a unit (`"1TiB"`); unset for no limit.
    #[serde(default, deserialize_with = "crate::units::optional_bytes")]
    pub quota_bytes: Option<u64>,
    /// The devices (by name) the tenant may use; unset for every device.
    #[serde(default)]
    pub devices: Option<Vec<String>>,
}

/// The SHA-256 of `token`.
pub fn token_sha256(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Hex digits of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn from_hex(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// A fresh random bearer token: [`TOKEN_PREFIX`] and 64 hex digits (256
/// bits from the operating system's generator).
///
/// # Errors
/// When the operating system has no random numbers to give.
pub fn new_token() -> Result<String, getrandom::Error> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b)?;
    Ok(format!("{TOKEN_PREFIX}{}", to_hex(&b)))
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Checks a tenant list; the error is `(key, reason)` of the first bad
/// entry.
pub(crate) fn validate(list: &[TenantConfig]) -> Result<(), (String, String)> {
    for (i, t) in list.iter().enumerate() {
        let key = |k: &str| format!("tenant[{i}].{k}");
        if !valid_name(&t.name) {
            return Err((
                key("name"),
                format!("{:?}: use 1 to 64 letters, digits, '-', '_' or '.'", t.name),
            ));
        }
        if list[..i].iter().any(|o| o.name == t.name) {
            return Err((key("name"), format!("two tenants are named {:?}", t.name)));
        }
        let Some(h) = from_hex(&t.token_sha256.to_ascii_lowercase()) else {
            return Err((
                key("token_sha256"),
                "must be 64 hex digits (the line `blockalloc token new` prints)".into(),
            ));
        };
        if list[..i]
            .iter()
            .any(|o| from_hex(&o.token_sha256.to_ascii_lowercase()) == Some(h))
        {
            return Err((
                key("token_sha256"),
                "another tenant has the same token".into(),
            ));
        }
        if t.quota_bytes == Some(0) {
            return Err((key("quota_bytes"), "0 would refuse every allocation".into()));
        }
        if t.devices.as_ref().is_some_and(|d| d.is_empty()) {
            return Err((
                key("devices"),
                "an empty list would refuse every device (omit it for all)".into(),
            ));
        }
    }
    Ok(())
}

/// A tenant of a running server.
#[derive(Debug)]
pub struct Tenant {
    /// Its position in the configuration, from 0.
    pub(crate) id: usize,
    /// Its name.
    pub name: String,
    hash: [u8; 32],
    /// Its quota per device, in bytes.
    pub quota_bytes: Option<u64>,
    devices: Option<Vec<String>>,
}

impl Tenant {
    /// The devices the tenant is restricted to (`None`: every device).
    pub fn devices(&self) -> Option<&[String]> {
        self.devices.as_deref()
    }

    /// True when the tenant may use the device named `name`.
    pub fn may_use(&self, device: &str) -> bool {
        self.devices
            .as_ref()
            .is_none_or(|d| d.iter().any(|x| x == device))
    }
}

/// The tenants of a server; empty for an open server.
#[derive(Debug, Default)]
pub struct Tenants {
    list: Vec<Arc<Tenant>>,
    /// Tenants may name devices this server does not serve (see
    /// [`Tenants::in_cluster`]).
    elsewhere: bool,
}

impl Tenants {
    /// The tenants of a configuration (checked with the file; see
    /// [`crate::ConfigFile`]).
    ///
    /// # Errors
    /// `(key, reason)` of the first bad entry.
    pub fn new(list: &[TenantConfig]) -> Result<Tenants, (String, String)> {
        validate(list)?;
        Ok(Tenants {
            list: list
                .iter()
                .enumerate()
                .map(|(id, t)| {
                    Arc::new(Tenant {
                        id,
                        name: t.name.clone(),
                        hash: from_hex(&t.token_sha256.to_ascii_lowercase()).expect("validated"),
                        quota_bytes: t.quota_bytes,
                        devices: t.devices.clone(),
                    })
                })
                .collect(),
            elsewhere: false,
        })
    }

    /// These tenants, for a server in a cluster whose servers share one
    /// tenants file: a tenant's `devices` may name devices that other
    /// servers serve (otherwise a name this server does not serve is
    /// refused as a mistake).
    #[must_use]
    pub fn in_cluster(self) -> Tenants {
        Tenants {
            elsewhere: true,
            ..self
        }
    }

    /// Whether tenants may name devices other servers serve.
    pub(crate) fn names_devices_elsewhere(&self) -> bool {
        self.elsewhere
    }

    /// True for an open server (no tenant declared).
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Every tenant, in configuration order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Tenant>> {
        self.list.iter()
    }

    /// The tenant named `name`.
    pub fn by_name(&self, name: &str) -> Option<&Arc<Tenant>> {
        self.list.iter().find(|t| t.name == name)
    }

    /// The tenant whose token is `token`. Every tenant's digest is compared,
    /// in constant time, so the time taken tells nothing about which digit
    /// differed or which tenant matched.
    pub fn authenticate(&self, token: &str) -> Option<Arc<Tenant>> {
        let h = token_sha256(token);
        let mut found = None;
        for t in &self.list {
            if bool::from(t.hash.ct_eq(&h)) {
                found = Some(Arc::clone(t));
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(name: &str, token: &str) -> TenantConfig {
        TenantConfig {
            name: name.into(),
            token_sha256: to_hex(&token_sha256(token)),
            quota_bytes: None,
            devices: None,
        }
    }

    #[test]
    fn tokens_authenticate_their_own_tenant_only() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX) && a.len() == TOKEN_PREFIX.len() + 64);
        let t = Tenants::new(&[cfg("a", &a), cfg("b", &b)]).unwrap();
        assert_eq!(t.authenticate(&a).unwrap().name, "a");
        assert_eq!(t.authenticate(&b).unwrap().name, "b");
        assert!(t.authenticate("").is_none());
        assert!(t.authenticate(&a[..a.len() - 1]).is_none());
    }

    #[test]
    fn bad_tenant_entries_name_the_key() {
        let tok = new_token().unwrap();
        let mut bad_hash = cfg("a", &tok);
        bad_hash.token_sha256 = "abc".into();
        let mut zero = cfg("a", &tok);
        zero.quota_bytes = Some(0);
        for (list, key) in [
            (vec![cfg("", &tok)], "tenant[0].name"),
            (vec![cfg("a b", &tok)], "tenant[0].name"),
            (vec![cfg("a", &tok), cfg("a", "x")], "tenant[1].name"),
            (vec![bad_hash], "tenant[0].token_sha256"),
            (
                vec![cfg("a", &tok), cfg("b", &tok)],
                "tenant[1].token_sha256",
            ),
            (vec![zero], "tenant[0].quota_bytes"),
        ] {
            let (k, why) = Tenants::new(&list).unwrap_err();
            assert_eq!(k, key, "{why}");
        }
    }
}
