//! Asking the server for space (`Lease`, new or extending the serving
//! lease) and adding what it grants to the local engines.

use std::time::{Duration, Instant};

use blockalloc::{Allocator, Extent, FromFreeExtents, SegFitAllocator};
use blockalloc_proto::pb;

use super::local::{Local, LocalLease};
use super::options::lease_gone;
use super::shared::{drop_lease, lock, Shared, EXTENSIONS, LEASES};
use crate::client::extent;
use crate::error::{ClientError, Result};

/// A grant of fewer than this many of the largest objects means the
/// server's long free runs are gone: requests no lease serves then go per
/// call for a lease's lifetime.
const FRAGMENTED_GRANT_OBJECTS: u64 = 4;

/// Asks the server for space: `extend` (a serving lease and the block to
/// grow it at) adds to that lease, else a new lease. Near full a lease of
/// the preferred minimum may be too much while one of exactly this
/// allocation is still granted, so that is asked next. With the reply, when
/// the request it answers was sent (the lease's deadline counts from then).
async fn ask_for_space(
    sh: &Shared,
    blocks: u64,
    extend: Option<(u64, u64)>,
) -> Result<(pb::LeaseResponse, Instant)> {
    let o = &sh.opts;
    let req = |min_blocks, want_blocks| pb::LeaseRequest {
        device: Some(o.device.to_pb()),
        client_id: o.client_id.clone(),
        min_blocks,
        want_blocks,
        hint: extend.map(|(_, at)| at),
        extend_lease_id: extend.map_or(0, |(id, _)| id),
        epoch: 0,
    };
    let c = &sh.client;
    let sent = Instant::now();
    match c
        .lease_call(&o.device, req(blocks.max(o.min_blocks), o.want_blocks))
        .await
    {
        Ok(r) => Ok((r, sent)),
        Err(ClientError::NoSpace { .. } | ClientError::Quota { .. }) if blocks < o.min_blocks => {
            let sent = Instant::now();
            Ok((c.lease_call(&o.device, req(blocks, blocks)).await?, sent))
        }
        Err(e) => Err(e),
    }
}

/// Gets at least `blocks` more blocks to allocate from: grows the serving
/// lease, or takes a new one when there is none or it is gone.
pub(super) async fn take_lease(sh: &Shared, blocks: u64) -> Result<()> {
    let serving = lock(&sh.local)
        .leases
        .iter()
        .find(|x| !x.retiring)
        .map(|x| (x.id, x.grow_at));
    let (r, sent) = match ask_for_space(sh, blocks, serving).await {
        Err(e) if lease_gone(&e) => {
            if let Some((id, _)) = serving {
                drop_lease(&mut lock(&sh.local), sh, id, true);
            }
            ask_for_space(sh, blocks, None).await?
        }
        r => r?,
    };
    let extents: Vec<Extent> = r.extents.iter().map(extent).collect::<Result<_>>()?;
    let grant = Grant {
        lease_id: r.lease_id,
        capacity_blocks: r.capacity_blocks,
        extents,
        grantable_blocks: r.grantable_blocks,
        ttl: Duration::from_millis(r.ttl_ms.max(1)),
        margin_ms: r.margin_ms,
        sent,
    };
    let request = blocks.max(sh.opts.min_blocks);
    let extended = serving.map(|(id, _)| id);
    match lock(&sh.local).add_grant(grant, request, extended)? {
        Added::Extension => sh.count(EXTENSIONS, 1),
        Added::Lease => sh.count(LEASES, 1),
        Added::Nothing => {}
    }
    Ok(())
}

/// What the server granted, as the client reads it.
#[derive(Clone, Debug)]
pub(super) struct Grant {
    pub(super) lease_id: u64,
    pub(super) capacity_blocks: u64,
    pub(super) extents: Vec<Extent>,
    pub(super) grantable_blocks: u64,
    pub(super) ttl: Duration,
    /// The margin the server keeps after expiry (0: none said).
    pub(super) margin_ms: u64,
    /// When the request was sent.
    pub(super) sent: Instant,
}

/// What a grant became in [`Local::add_grant`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Added {
    /// More space for a lease held.
    Extension,
    /// A new lease.
    Lease,
    /// An extension of a lease released meanwhile: the release returned
    /// it too.
    Nothing,
}

/// Where a lease grows next: the end of the grant's longest extent (a
/// grant is a run and perhaps some fragments).
pub(super) fn grow_at(extents: &[Extent]) -> u64 {
    extents
        .iter()
        .max_by_key(|e| e.len())
        .map_or(0, |e| e.end())
}

impl Local {
    /// Adds a grant for a request of `request` blocks (the allocation or
    /// the smallest useful lease, whichever is larger): to the lease it
    /// names when one is held, else as a new lease unless it extended
    /// `extended`, a lease released since it was asked for.
    ///
    /// # Errors
    /// [`ClientError::BadReply`] for an extension that overlaps space the
    /// lease held, or extents no engine can be built over.
    pub(super) fn add_grant(
        &mut self,
        g: Grant,
        request: u64,
        extended: Option<u64>,
    ) -> Result<Added> {
        let granted: u64 = g.extents.iter().map(|e| e.len()).sum();
        self.last_grant = granted;
        self.ttl_seen = g.ttl;
        if granted < FRAGMENTED_GRANT_OBJECTS * request {
            self.per_call_until = Some(Instant::now() + g.ttl);
        }
        let grow_at = grow_at(&g.extents);
        if let Some(lease) = self.leases.iter_mut().find(|x| x.id == g.lease_id) {
            for &e in &g.extents {
                lease.engine.free(e).map_err(|_| {
                    ClientError::BadReply(format!(
                        "lease {}: the extension {e} overlaps space it held",
                        g.lease_id
                    ))
                })?;
            }
            lease.grow_at = grow_at;
            lease.extended(g.sent, g.ttl, g.margin_ms);
            self.set_refill(g.grantable_blocks);
            return Ok(Added::Extension);
        }
        if extended == Some(g.lease_id) {
            return Ok(Added::Nothing);
        }
        let mut engine = SegFitAllocator::from_free_extents(g.capacity_blocks, &g.extents)
            .map_err(|e| ClientError::BadReply(format!("lease {}: {e}", g.lease_id)))?;
        engine.set_refill_blocks(g.grantable_blocks);
        self.leases.push(LocalLease::new(
            g.lease_id,
            engine,
            grow_at,
            g.ttl,
            g.margin_ms,
            g.sent,
        ));
        Ok(Added::Lease)
    }
}

#[cfg(test)]
mod tests {
    use super::super::local::tests::{ext, holding, lease, DEVICE};
    use super::*;
    use blockalloc::Allocator;

    fn grant(lease_id: u64, extents: &[Extent]) -> Grant {
        Grant {
            lease_id,
            capacity_blocks: DEVICE,
            extents: extents.to_vec(),
            grantable_blocks: 0,
            ttl: Duration::from_secs(30),
            margin_ms: 0,
            sent: Instant::now(),
        }
    }

    #[test]
    fn a_new_lease_serves_exactly_its_extents() {
        let mut l = Local::new(64);
        let added = l
            .add_grant(grant(7, &[ext(100, 64), ext(1000, 256)]), 64, None)
            .unwrap();
        assert_eq!(added, Added::Lease);
        let x = &l.leases[0];
        assert_eq!((x.id, x.unused(), x.grow_at, x.last_seq), (7, 320, 1256, 0));
        assert_eq!(x.ttl, Duration::from_secs(30));
        assert!(x.inflight.is_none() && !x.retiring);
        assert_eq!((l.last_grant, l.ttl_seen), (320, Duration::from_secs(30)));
        // Everything it hands out lies inside the grant.
        while let Some((e, _)) = l.allocate_now(16) {
            let inside =
                (e.start() >= 100 && e.end() <= 164) || (e.start() >= 1000 && e.end() <= 1256);
            assert!(inside, "{e} is outside the grant");
        }
        assert_eq!(l.pending.len(), 20);
    }

    #[test]
    fn an_extension_adds_to_the_lease_it_names() {
        let mut l = holding(vec![lease(7, &[ext(0, 100)])]);
        let (a, _) = l.allocate_now(100).unwrap();
        let added = l
            .add_grant(grant(7, &[ext(100, 400)]), 64, Some(7))
            .unwrap();
        assert_eq!(added, Added::Extension);
        assert_eq!(l.leases.len(), 1);
        assert_eq!(l.leases[0].unused(), 400);
        assert_eq!(l.leases[0].grow_at, 500);
        // The allocation made before is still the caller's.
        assert_eq!(l.pending, vec![(7, a)]);
        assert_eq!(l.leases[0].engine.used(), DEVICE - 400);
    }

    #[test]
    fn a_leases_deadline_counts_from_when_its_request_was_sent() {
        let mut l = Local::new(64);
        let sent = Instant::now();
        let mut g = grant(7, &[ext(0, 100)]);
        g.sent = sent;
        g.margin_ms = 2_000;
        l.add_grant(g, 64, None).unwrap();
        let x = &l.leases[0];
        assert_eq!(x.deadline, sent + Duration::from_secs(28));
        assert_eq!(x.renewed, sent);

        // An extension sent later moves it on; without a margin in the
        // reply a twentieth of the TTL is kept.
        let mut g = grant(7, &[ext(200, 100)]);
        g.sent = sent + Duration::from_secs(10);
        l.add_grant(g, 64, Some(7)).unwrap();
        let x = &l.leases[0];
        assert_eq!(x.deadline, sent + Duration::from_millis(10_000 + 28_500));
        assert_eq!(x.renewed, sent + Duration::from_secs(10));

        // A reply to an older request never moves it back.
        let mut g = grant(7, &[ext(400, 100)]);
        g.sent = sent;
        l.add_grant(g, 64, Some(7)).unwrap();
        let x = &l.leases[0];
        assert_eq!(x.deadline, sent + Duration::from_millis(38_500));
        assert_eq!(x.renewed, sent + Duration::from_secs(10));
    }

    #[test]
    fn an_extension_that_overlaps_the_lease_is_a_bad_reply() {
        let mut l = holding(vec![lease(7, &[ext(0, 100)])]);
        let r = l.add_grant(grant(7, &[ext(50, 100)]), 64, Some(7));
        assert!(matches!(r, Err(ClientError::BadReply(_))), "{r:?}");
    }

    #[test]
    fn an_extension_of_a_released_lease_adds_nothing() {
        let mut l = Local::new(64);
        let added = l.add_grant(grant(7, &[ext(0, 4096)]), 64, Some(7)).unwrap();
        assert_eq!(added, Added::Nothing);
        assert!(l.leases.is_empty());
    }

    #[test]
    fn a_grant_of_a_few_objects_sends_requests_per_call_for_a_ttl() {
        let mut l = Local::new(64);
        // 4 requests' worth is enough...
        l.add_grant(grant(1, &[ext(0, 256)]), 64, None).unwrap();
        assert!(l.per_call_until.is_none());
        // ...fewer is not: the long runs are gone.
        let before = Instant::now();
        l.add_grant(grant(2, &[ext(1000, 255)]), 64, None).unwrap();
        let until = l.per_call_until.expect("set");
        assert!(until >= before + Duration::from_secs(30));
    }

    #[test]
    fn bad_extents_for_a_new_lease_are_a_bad_reply() {
        let mut l = Local::new(64);
        let mut g = grant(1, &[ext(0, 100)]);
        g.capacity_blocks = 50;
        assert!(matches!(
            l.add_grant(g, 64, None),
            Err(ClientError::BadReply(_))
        ));
        assert!(l.leases.is_empty());
    }

    #[test]
    fn a_lease_grows_at_the_end_of_its_longest_run() {
        assert_eq!(grow_at(&[ext(0, 8), ext(100, 64), ext(500, 16)]), 164);
        assert_eq!(grow_at(&[]), 0);
    }
}
