//! What the service keeps in a device's store records
//! ([`Store::records`]), changed in the same transactions as the space
//! they describe:
//!
//! | key                        | value                                         |
//! |----------------------------|-----------------------------------------------|
//! | `epoch`                    | the device's owner epoch, u64 big-endian      |
//! | `L` + lease id (8 bytes BE) | a live lease ([`LeaseRecord`])               |
//! | `C` + lease id (8 bytes BE) | its last commit ([`CommitRecord`])           |
//! | `H` + lease id + order (8 bytes BE each) | extents added to it: an extension or recycled frees |
//! | `R` + request id (8 bytes BE) + tenant name | a per-call result ([`RequestRecord`]) |
//!
//! Values start with a format byte (1); integers are LEB128 varints,
//! strings and lists are prefixed by their length.
//!
//! A lease's unused space is free in the store's allocation map (as it
//! always was): its record lists the extents it *may* hold — everything
//! granted, extended or recycled to it since the list was last compacted —
//! — the grant's extents in its record, each extension or recycling
//! commit's in an `H` record of its own — and a restarted server takes
//! back into the lease what of them is free, before anything else
//! allocates. What the lease published is allocated and stays out. So a
//! commit journals only its allocations (as any allocation), its small
//! commit record and what it recycles, however large the lease; after
//! [`MAX_DELTAS`] `H` records the lease record is rewritten with the unused
//! extents and they go. Blocks a lease published and freed may be listed
//! by it and by a later lease granted them: the restart takes them for the
//! record written last (`order`), whose holder may be writing there.

use blockalloc::Extent;
use blockalloc_store::format::{get_varint, put_varint};
use blockalloc_store::Store;

/// The record of the device's owner epoch.
pub(crate) const EPOCH_KEY: &[u8] = b"epoch";

/// The format byte of every value.
const FORMAT: u8 = 1;

/// The key of lease `id`'s record.
pub(crate) fn lease_key(id: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(b'L');
    k.extend_from_slice(&id.to_be_bytes());
    k
}

/// The key of lease `id`'s commit record.
pub(crate) fn commit_key(id: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(b'C');
    k.extend_from_slice(&id.to_be_bytes());
    k
}

/// `H` records of a lease before its record is rewritten with its unused
/// extents.
pub(crate) const MAX_DELTAS: usize = 8;

/// The key of extents added to lease `id` as the device's `order`-th
/// record.
pub(crate) fn delta_key(id: u64, order: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(17);
    k.push(b'H');
    k.extend_from_slice(&id.to_be_bytes());
    k.extend_from_slice(&order.to_be_bytes());
    k
}

/// The value of an `H` record.
pub(crate) fn encode_delta(extents: &[Extent]) -> Vec<u8> {
    let mut out = vec![FORMAT];
    put_extents(&mut out, extents);
    out
}

/// The lease id, order and extents of key `key`, value `v`; `None` for a
/// key that is no `H` record's.
#[allow(clippy::type_complexity)]
pub(crate) fn decode_delta(
    key: &[u8],
    v: &[u8],
) -> Option<Result<(u64, u64, Vec<Extent>), String>> {
    let (id, order) = match key {
        [b'H', rest @ ..] if rest.len() == 16 => (
            u64::from_be_bytes(rest[..8].try_into().ok()?),
            u64::from_be_bytes(rest[8..].try_into().ok()?),
        ),
        _ => return None,
    };
    Some((|| {
        let mut r = Reader::new(v)?;
        let e = r.extents()?;
        r.end()?;
        Ok((id, order, e))
    })())
}

/// The key of request `id` of a caller of `tenant` (empty: none).
pub(crate) fn request_key(id: u64, tenant: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + tenant.len());
    k.push(b'R');
    k.extend_from_slice(&id.to_be_bytes());
    k.extend_from_slice(tenant.as_bytes());
    k
}

/// A live lease as journaled: enough to serve it again after a restart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LeaseRecord {
    pub id: u64,
    pub client: String,
    /// The holder's tenant; empty on a server without tenants.
    pub tenant: String,
    /// The object size its grants were asked for.
    pub object: u64,
    /// When the record was written, in the device's order of lease
    /// records: the later one wins a block two records list.
    pub order: u64,
    /// The extents it may hold (a superset of its unused ones), in address
    /// order.
    pub held: Vec<Extent>,
}

/// A lease's last commit, for a resend of it after a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CommitRecord {
    pub seq: u64,
    pub digest: u64,
    /// The reply's unused blocks.
    pub unused: u64,
}

/// A per-call result, kept for a resend of its request id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RequestRecord {
    /// Its place in the device's window: oldest first.
    pub order: u64,
    /// A checksum of the request's contents: a resend must match.
    pub digest: u32,
    pub result: RequestResult,
}

/// What a request did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RequestResult {
    /// Allocate: the objects, each its extents.
    Allocated(Vec<Vec<Extent>>),
    /// Free: the blocks freed.
    Freed(u64),
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn put_extents(out: &mut Vec<u8>, extents: &[Extent]) {
    put_varint(out, extents.len() as u64);
    for e in extents {
        put_varint(out, e.start());
        put_varint(out, e.len());
    }
}

/// Reads a value: a cursor that turns any malformation into an error
/// naming the record.
struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(b: &'a [u8]) -> Result<Self, String> {
        match b.first() {
            Some(&FORMAT) => Ok(Reader { b, pos: 1 }),
            Some(f) => Err(format!("unknown format {f}")),
            None => Err("empty".into()),
        }
    }

    fn varint(&mut self) -> Result<u64, String> {
        get_varint(self.b, &mut self.pos).map_err(|e| e.0)
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or("truncated")?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn str(&mut self) -> Result<String, String> {
        let n = usize::try_from(self.varint()?).map_err(|_| "a string too long")?;
        String::from_utf8(self.bytes(n)?.to_vec()).map_err(|_| "a string not UTF-8".into())
    }

    fn extents(&mut self) -> Result<Vec<Extent>, String> {
        let n = self.varint()?;
        let mut out = Vec::new();
        for _ in 0..n {
            let (s, l) = (self.varint()?, self.varint()?);
            out.push(Extent::new(s, l).map_err(|e| e.to_string())?);
        }
        Ok(out)
    }

    fn end(&self) -> Result<(), String> {
        if self.pos == self.b.len() {
            Ok(())
        } else {
            Err(format!("{} bytes past its end", self.b.len() - self.pos))
        }
    }
}

/// The lease id of a key `prefix` + id.
fn id_of(key: &[u8], prefix: u8) -> Option<u64> {
    match key {
        [p, id @ ..] if *p == prefix => Some(u64::from_be_bytes(id.try_into().ok()?)),
        _ => None,
    }
}

impl CommitRecord {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = vec![FORMAT];
        put_varint(&mut out, self.seq);
        out.extend_from_slice(&self.digest.to_le_bytes());
        put_varint(&mut out, self.unused);
        out
    }

    /// The lease id and record of key `key`, value `v`; `None` for a key
    /// that is no commit record's.
    pub(crate) fn decode(key: &[u8], v: &[u8]) -> Option<Result<(u64, CommitRecord), String>> {
        let id = id_of(key, b'C')?;
        Some((|| {
            let mut r = Reader::new(v)?;
            let seq = r.varint()?;
            let digest = u64::from_le_bytes(r.bytes(8)?.try_into().expect("8 bytes"));
            let rec = CommitRecord {
                seq,
                digest,
                unused: r.varint()?,
            };
            r.end()?;
            Ok((id, rec))
        })())
    }
}

impl LeaseRecord {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = vec![FORMAT];
        put_varint(&mut out, self.order);
        put_varint(&mut out, self.object);
        put_str(&mut out, &self.client);
        put_str(&mut out, &self.tenant);
        put_extents(&mut out, &self.held);
        out
    }

    /// The record of key `key`, value `v`; `None` for a key that is no
    /// lease's.
    pub(crate) fn decode(key: &[u8], v: &[u8]) -> Option<Result<LeaseRecord, String>> {
        let id = id_of(key, b'L')?;
        Some((|| {
            let mut r = Reader::new(v)?;
            let rec = LeaseRecord {
                id,
                order: r.varint()?,
                object: r.varint()?,
                client: r.str()?,
                tenant: r.str()?,
                held: r.extents()?,
            };
            r.end()?;
            Ok(rec)
        })())
    }
}

impl RequestRecord {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = vec![FORMAT];
        put_varint(&mut out, self.order);
        out.extend_from_slice(&self.digest.to_le_bytes());
        match &self.result {
            RequestResult::Allocated(objects) => {
                out.push(0);
                put_varint(&mut out, objects.len() as u64);
                for o in objects {
                    put_extents(&mut out, o);
                }
            }
            RequestResult::Freed(blocks) => {
                out.push(1);
                put_varint(&mut out, *blocks);
            }
        }
        out
    }

    /// The request id, tenant and record of key `key`, value `v`; `None`
    /// for a key that is no request's.
    #[allow(clippy::type_complexity)]
    pub(crate) fn decode(
        key: &[u8],
        v: &[u8],
    ) -> Option<Result<(u64, String, RequestRecord), String>> {
        let (id, tenant) = match key {
            [b'R', rest @ ..] if rest.len() >= 8 => {
                let (id, t) = rest.split_at(8);
                (u64::from_be_bytes(id.try_into().ok()?), t)
            }
            _ => return None,
        };
        Some((|| {
            let tenant = String::from_utf8(tenant.to_vec()).map_err(|_| "a tenant not UTF-8")?;
            let mut r = Reader::new(v)?;
            let order = r.varint()?;
            let digest = u32::from_le_bytes(r.bytes(4)?.try_into().expect("4 bytes"));
            let result = match r.bytes(1)?[0] {
                0 => {
                    let n = r.varint()?;
                    let mut objects = Vec::new();
                    for _ in 0..n {
                        objects.push(r.extents()?);
                    }
                    RequestResult::Allocated(objects)
                }
                1 => RequestResult::Freed(r.varint()?),
                k => return Err(format!("unknown result kind {k}")),
            };
            r.end()?;
            Ok((
                id,
                tenant,
                RequestRecord {
                    order,
                    digest,
                    result,
                },
            ))
        })())
    }
}

/// Raises the device's owner epoch and makes it durable before the device
/// serves anything: to `at_least` when given (a coordination service's
/// revision; it must be above the device's epoch), else by one. Returns
/// the new epoch.
///
/// # Errors
/// A text for the operator: `at_least` not above the device's epoch, a
/// malformed epoch record, or the store's error.
pub(crate) fn raise_epoch(store: &Store, at_least: Option<u64>) -> Result<u64, String> {
    let old = match store.record(EPOCH_KEY) {
        None => 0,
        Some(v) => u64::from_be_bytes(
            v.as_slice()
                .try_into()
                .map_err(|_| format!("its epoch record is {} bytes, not 8", v.len()))?,
        ),
    };
    let new = match at_least {
        Some(e) if e <= old => {
            return Err(format!(
                "the epoch given ({e}) is not above the device's epoch ({old}): another owner \
                 took the device since"
            ))
        }
        Some(e) => e,
        None => old
            .checked_add(1)
            .ok_or("the device's epoch is at its largest value")?,
    };
    let mut txn = store.begin();
    txn.put_record(EPOCH_KEY, &new.to_be_bytes())
        .and_then(|()| txn.commit())
        .map_err(|e| format!("cannot record the epoch: {e}"))?;
    Ok(new)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(s: u64, l: u64) -> Extent {
        Extent::new(s, l).unwrap()
    }

    #[test]
    fn lease_records_round_trip_and_refuse_garbage() {
        let rec = LeaseRecord {
            id: 0x0001_0002_0000_0003,
            client: "host-7".into(),
            tenant: "team".into(),
            object: 256,
            order: 12,
            held: vec![x(1000, 100), x(5000, 1)],
        };
        let v = rec.encode();
        let key = lease_key(rec.id);
        assert_eq!(LeaseRecord::decode(&key, &v), Some(Ok(rec.clone())));
        assert_eq!(LeaseRecord::decode(b"epoch", &v), None);
        for n in 0..v.len() {
            assert!(
                matches!(LeaseRecord::decode(&key, &v[..n]), Some(Err(_))),
                "{n}"
            );
        }
        let mut long = v.clone();
        long.push(0);
        assert!(matches!(LeaseRecord::decode(&key, &long), Some(Err(_))));
        let mut other = v;
        other[0] = 2;
        assert!(matches!(LeaseRecord::decode(&key, &other), Some(Err(_))));
        let c = CommitRecord {
            seq: 9,
            digest: 77,
            unused: 5,
        };
        let v = c.encode();
        assert_eq!(CommitRecord::decode(&commit_key(3), &v), Some(Ok((3, c))));
        assert_eq!(CommitRecord::decode(&key, &v), None);
        for n in 0..v.len() {
            assert!(matches!(
                CommitRecord::decode(&commit_key(3), &v[..n]),
                Some(Err(_))
            ));
        }
    }

    #[test]
    fn request_records_round_trip_and_refuse_garbage() {
        for result in [
            RequestResult::Allocated(vec![vec![x(10, 4)], vec![x(20, 1), x(30, 3)]]),
            RequestResult::Freed(77),
        ] {
            let rec = RequestRecord {
                order: 9,
                digest: 0xdead_beef,
                result,
            };
            let v = rec.encode();
            let key = request_key(42, "team");
            assert_eq!(
                RequestRecord::decode(&key, &v),
                Some(Ok((42, "team".to_string(), rec.clone())))
            );
            for n in 0..v.len() {
                assert!(matches!(RequestRecord::decode(&key, &v[..n]), Some(Err(_))));
            }
        }
        assert_eq!(RequestRecord::decode(&lease_key(1), &[1]), None);
    }
}
