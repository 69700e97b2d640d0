//! The owner of a device: one thread that alone changes the device's
//! store, lease table, leases' reservations and tenant pools.
//!
//! Connection tasks ([`crate::server`]) decode and check a request, send a
//! [`Command`] on the device's channel and await its reply. The owner's
//! loop:
//!
//! 1. wait for a command, or for the next deadline (lease expiry, a
//!    waiting allocation's deadline);
//! 2. take every command queued;
//! 3. stage each one: its in-memory effects go in a store transaction of
//!    its own; one that fails is answered at once and changes nothing;
//!    one that needs no journal record (a grant, a renewal) is done and
//!    answered;
//! 4. commit the staged transactions together ([`Store::commit_all`]: one
//!    journal entry and one sync for as many as fit);
//! 5. finish each (lease and pool bookkeeping once durable) and answer.
//!
//! Group commit follows: whatever queued during one sync is committed by
//! the next. A command on a lease that has a commit staged waits for the
//! next round, so one lease's calls take effect in the order they came.
//! Nothing here is locked across I/O; the thread holds no lock at all.
//!
//! Cancellation: a command whose caller is gone when the owner takes it is
//! not run; an allocation whose caller is gone when it is answered (its
//! deadline passed during the sync) is freed again in the next round —
//! unless it carries a request id: its caller learns of it by resending the
//! call — and a grant is released.
//!
//! Retries: an Allocate or Free with a request id is answered from the
//! device's window of recent results when the id is there (the same
//! contents, or INVALID_ARGUMENT), refused as busy while a call with the id
//! runs, and otherwise staged with its result's record in its own
//! transaction ([`crate::records`]): the window survives a restart.
//!
//! Recalls: a per-call allocation refused for want of room while leases of
//! its scope hold unused space starts a recall and waits here (no
//! polling). Waiters are tried again in the round after space comes back (a
//! lease ends, frees become durable) and refused at their deadline (one
//! lease TTL and a margin) or once no lease of their scope holds space.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Instant;

use blockalloc::{AllocError, Extent};
use blockalloc_store::{CommitInfo, JournalOp, Store, StoreError, Txn};
use tokio::sync::oneshot;
use tonic::Status;

use crate::config::Config;
use crate::device::{scope, Scope, ServedDevice};
use crate::error::ServiceError;
use crate::leases::{
    CommitBatch, CommitOutcome, CommitStep, Grant, LeaseAsk, LeaseInfo, LeaseTable, RenewOutcome,
    StagedCommit, StagedGrant,
};
use crate::limits::{check_reply_size, LeaseSlot};
use crate::ownership::{Home, PoolAllocation};
use crate::records::{lease_key, request_key, CommitRecord, RequestRecord, RequestResult};
use crate::tenants::Tenant;
use crate::{details, pb, status};

/// Where a command's answer goes.
pub(crate) type Reply<T> = oneshot::Sender<Result<T, Status>>;

/// The most per-call results a device keeps for resent request ids (fewer
/// when its journal is too small to restate them all: the oldest go first).
const REQUEST_WINDOW: usize = 4096;

/// A per-call call's request id, as the window keys it, and its contents'
/// checksum.
#[derive(Clone, Debug)]
pub(crate) struct RequestId {
    pub id: u64,
    pub key: Vec<u8>,
    pub digest: u32,
}

impl RequestId {
    /// Request `id` (nonzero) of a caller of `tenant` (empty: none), whose
    /// contents encode as `contents`.
    pub(crate) fn new(id: u64, tenant: &str, contents: &[u8]) -> RequestId {
        RequestId {
            id,
            key: request_key(id, tenant),
            digest: crc32c::crc32c(contents),
        }
    }
}

/// The device's recent per-call results, by request key, oldest first.
#[derive(Default)]
pub(crate) struct Requests {
    by_key: HashMap<Vec<u8>, RequestRecord>,
    order: VecDeque<Vec<u8>>,
    next_order: u64,
    /// The records' size, as the store counts it: at most a quarter of the
    /// store's records, the rest is for leases.
    bytes: usize,
    /// Keys of calls staged or waiting now.
    running: HashSet<Vec<u8>>,
}

impl Requests {
    /// The window a restarted server found journaled.
    pub(crate) fn restored(mut found: Vec<(Vec<u8>, RequestRecord)>) -> Requests {
        found.sort_unstable_by_key(|(_, r)| r.order);
        let mut w = Requests::default();
        for (key, r) in found {
            w.next_order = r.order + 1;
            w.bytes += JournalOp::put_len(&key, &r.encode());
            w.order.push_back(key.clone());
            w.by_key.insert(key, r);
        }
        w
    }
}

impl Requests {
    /// A call with request `r`: its first result when the window has it
    /// (`Some`), or `None` for a new one, which runs from now on.
    ///
    /// # Errors
    /// [`ServiceError::BadRequest`] for the id with other contents,
    /// [`ServiceError::Busy`] while a call with the id runs.
    fn check(&mut self, r: &RequestId) -> Result<Option<RequestResult>, ServiceError> {
        if let Some(rec) = self.by_key.get(&r.key) {
            if rec.digest != r.digest {
                return Err(ServiceError::BadRequest(format!(
                    "request id {} was used before with other contents",
                    r.id
                )));
            }
            return Ok(Some(rec.result.clone()));
        }
        if !self.running.insert(r.key.clone()) {
            return Err(ServiceError::Busy(format!(
                "a call with request id {} is running",
                r.id
            )));
        }
        Ok(None)
    }

    /// Puts the record of `r`'s result in `txn`, making room in the
    /// window (the oldest results go, deleted in `txn` too). `None` when
    /// the result alone is too large for the store's records: the call
    /// runs unprotected (a warning says so).
    fn stage(
        &mut self,
        txn: &mut Txn<'_>,
        r: RequestId,
        result: RequestResult,
    ) -> Option<(RequestId, RequestRecord)> {
        let rec = RequestRecord {
            order: self.next_order,
            digest: r.digest,
            result,
        };
        let value = rec.encode();
        let size = JournalOp::put_len(&r.key, &value);
        let room = txn.store().records_limit() / 4;
        while !self.order.is_empty()
            && (self.order.len() >= REQUEST_WINDOW || self.bytes + size > room)
        {
            self.evict(txn);
        }
        let put = if size <= room {
            txn.put_record(&r.key, &value)
        } else {
            Err(StoreError::BadRecord {
                reason: format!("{size} bytes, more than the {room} kept for call results"),
            })
        };
        match put {
            Ok(()) => {
                self.next_order += 1;
                self.bytes += size;
                Some((r, rec))
            }
            Err(e) => {
                tracing::warn!(
                    request = r.id,
                    error = %e,
                    "a call's result is too large to keep for a resend of its request id"
                );
                self.running.remove(&r.key);
                None
            }
        }
    }

    /// Drops the oldest result (its record in `txn`).
    fn evict(&mut self, txn: &mut Txn<'_>) {
        if let Some(old) = self.order.pop_front() {
            if let Some(r) = self.by_key.remove(&old) {
                self.bytes -= JournalOp::put_len(&old, &r.encode());
            }
            let _ = txn.delete_record(&old);
        }
    }

    /// A call with request `r` ended without a result to keep.
    fn done(&mut self, r: Option<&RequestId>) {
        if let Some(r) = r {
            self.running.remove(&r.key);
        }
    }

    /// A staged call's transaction is durable (`ok`) or failed.
    fn finish(&mut self, staged: Option<(RequestId, RequestRecord)>, ok: bool) {
        let Some((r, rec)) = staged else {
            return;
        };
        self.running.remove(&r.key);
        if ok {
            self.order.push_back(r.key.clone());
            self.by_key.insert(r.key, rec);
        } else {
            self.bytes -= JournalOp::put_len(&r.key, &rec.encode());
        }
    }
}

/// The refusal of a request id resent as the other kind of call.
fn other_kind(id: u64, was: &str) -> ServiceError {
    ServiceError::BadRequest(format!("request id {id} was used before by a {was} call"))
}

/// The objects of an Allocate reply.
fn objects_of(r: &pb::AllocateResponse) -> Vec<Vec<Extent>> {
    r.objects
        .iter()
        .map(|o| {
            o.extents
                .iter()
                .filter_map(|e| Extent::new(e.start, e.len).ok())
                .collect()
        })
        .collect()
}

/// A per-call Allocate, checked.
#[derive(Clone, Debug)]
pub(crate) struct AllocateAsk {
    pub count: u32,
    pub blocks: u64,
    pub scattered: bool,
    pub hint: Option<u64>,
    /// The largest reply the caller can take.
    pub max_reply: usize,
}

/// What a device's owner is asked to do.
pub(crate) enum Command {
    /// Allocate objects per call, durably.
    Allocate {
        home: Option<Home>,
        ask: AllocateAsk,
        request: Option<RequestId>,
        reply: Reply<pb::AllocateResponse>,
    },
    /// Free committed extents per call, durably; answers the blocks freed
    /// and whether it answers a resent request id.
    Free {
        home: Option<Home>,
        extents: Vec<Extent>,
        request: Option<RequestId>,
        reply: Reply<(u64, bool)>,
    },
    /// Grant or extend a lease.
    Lease {
        home: Option<Home>,
        ask: LeaseAsk,
        slot: Option<LeaseSlot>,
        reply: Reply<Grant>,
    },
    /// Publish allocations (and free extents) inside a lease, durably.
    Commit {
        lease: u64,
        scope: Scope,
        seq: u64,
        batch: CommitBatch,
        reply: Reply<CommitOutcome>,
    },
    /// Move a lease's deadline.
    Renew {
        lease: u64,
        scope: Scope,
        fragments: u64,
        reply: Reply<RenewOutcome>,
    },
    /// End a lease; answers its unused blocks.
    Release {
        lease: u64,
        scope: Scope,
        reply: Reply<u64>,
    },
    /// The device's Status entry (and its leases, when asked) for a caller.
    Status {
        tenant: Option<Arc<Tenant>>,
        leases: bool,
        reply: Reply<(pb::DeviceStatus, Vec<pb::LeaseStatus>)>,
    },
    /// End every lease (shutdown); answers how many were live.
    EndLeases { reply: oneshot::Sender<usize> },
    /// Close the store (a final checkpoint and the close record); the
    /// owner stops.
    Close {
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
}

impl Command {
    /// The lease the command acts on, if any.
    fn lease(&self) -> Option<u64> {
        match self {
            Command::Commit { lease, .. }
            | Command::Renew { lease, .. }
            | Command::Release { lease, .. } => Some(*lease),
            Command::Lease { ask, .. } => ask.extend,
            _ => None,
        }
    }

    /// Whether the caller is gone (nobody would read the answer).
    fn caller_gone(&self) -> bool {
        match self {
            Command::Allocate { reply, .. } => reply.is_closed(),
            Command::Free { reply, .. } => reply.is_closed(),
            Command::Lease { reply, .. } => reply.is_closed(),
            Command::Commit { reply, .. } => reply.is_closed(),
            Command::Renew { reply, .. } => reply.is_closed(),
            Command::Release { reply, .. } => reply.is_closed(),
            Command::Status { reply, .. } => reply.is_closed(),
            Command::EndLeases { .. } | Command::Close { .. } => false,
        }
    }
}

/// A per-call Allocate and where its answer goes.
struct PerCall {
    home: Option<Home>,
    ask: AllocateAsk,
    request: Option<RequestId>,
    reply: Reply<pb::AllocateResponse>,
}

/// A per-call allocation waiting for recalled leases, until `deadline`.
struct Waiter {
    call: PerCall,
    deadline: Instant,
}

/// Work staged in a transaction of the round, waiting for it.
enum Staged {
    Allocate {
        home: Option<Home>,
        pooled: Option<PoolAllocation>,
        response: pb::AllocateResponse,
        request: Option<(RequestId, RequestRecord)>,
        reply: Reply<pb::AllocateResponse>,
    },
    Free {
        home: Option<Home>,
        extents: Vec<Extent>,
        request: Option<(RequestId, RequestRecord)>,
        reply: Option<Reply<(u64, bool)>>,
    },
    Commit {
        staged: StagedCommit,
        reply: Reply<CommitOutcome>,
    },
    Grant {
        staged: StagedGrant,
        scope: Scope,
        reply: Reply<Grant>,
    },
    /// A lease's record deleted: its holder's Release (answered with its
    /// unused blocks) or an expiry (no answer).
    Ended { reply: Option<(Reply<u64>, u64)> },
}

/// The owner thread's state.
struct Owner {
    index: usize,
    dev: Arc<ServedDevice>,
    cfg: Config,
    leases: LeaseTable,
    rx: Receiver<Command>,
    waiters: Vec<Waiter>,
    /// Allocations answered to callers that were gone: freed next round.
    undo: Vec<(Option<Home>, Vec<Extent>)>,
    /// Space came back in the last round: the waiters try again.
    space_back: bool,
    next_expiry: Instant,
    requests: Requests,
    /// Leases ended without a transaction of their own (a grant nobody
    /// heard of): their records are deleted next round.
    forget: Vec<u64>,
    /// The device's background zeroing, while it runs.
    zeroer: Option<blockalloc_store::Zeroer>,
}

/// What a device's owner starts with: leases and per-call results a
/// restarted server found journaled.
pub(crate) struct Restored {
    pub leases: Vec<crate::leases::RestoredLease>,
    /// The last commits of leases that had ended.
    pub ended: Vec<(u64, CommitRecord)>,
    pub requests: Requests,
}

/// Starts the owner of device `index`; it runs until [`Command::Close`]
/// or until every sender is gone.
pub(crate) fn spawn(
    index: usize,
    dev: Arc<ServedDevice>,
    cfg: Config,
    restored: Restored,
    rx: Receiver<Command>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let epoch = dev.epoch() as u16;
    let mut leases = LeaseTable::new(cfg.clone(), Arc::clone(&dev), epoch, index as u16);
    for r in restored.leases {
        leases.restore(r);
    }
    for (id, c) in restored.ended {
        leases.restore_ended(id, c);
    }
    // `dev:NAME` in `top -H` (the system keeps its first 15 bytes).
    let name = format!("dev:{}", dev.name);
    let zeroer = if cfg.zero_share > 0.0 {
        dev.store
            .start_zeroing(cfg.zero_share)
            .map_err(std::io::Error::other)?
    } else {
        None
    };
    if let Some(p) = dev.store.zero_progress().filter(|_| zeroer.is_some()) {
        tracing::info!(
            device = %dev.name,
            share = cfg.zero_share,
            "zeroing never-used space in the background, {:.1} % done",
            p.fraction() * 100.0
        );
    }
    let owner = Owner {
        zeroer,
        index,
        next_expiry: Instant::now() + cfg.expiry_interval,
        dev,
        cfg,
        leases,
        rx,
        waiters: Vec::new(),
        undo: Vec::new(),
        space_back: false,
        requests: restored.requests,
        forget: Vec::new(),
    };
    std::thread::Builder::new()
        .name(name)
        .spawn(move || owner.run())
}

/// True when the store (or the tenant's pool and the unassigned space)
/// found no free run for the request (not a limit, a quota or a reply too
/// large).
fn out_of_room(e: &ServiceError) -> bool {
    matches!(
        e,
        ServiceError::Store(StoreError::Alloc(AllocError::NoSpace { .. }))
            | ServiceError::TenantFull { .. }
    )
}

fn to_pb(e: Extent) -> pb::Extent {
    pb::Extent {
        start: e.start(),
        len: e.len(),
    }
}

fn response(objects: &[Vec<Extent>], block_size: u64) -> pb::AllocateResponse {
    pb::AllocateResponse {
        objects: objects
            .iter()
            .map(|o| pb::Object {
                extents: o.iter().copied().map(to_pb).collect(),
            })
            .collect(),
        block_size,
        ..Default::default()
    }
}

/// Puts the frees of `extents` (the tenant's own, with `home`) in a
/// transaction of their own.
fn stage_free<'s>(
    store: &'s Store,
    home: Option<&Home>,
    extents: &[Extent],
) -> Result<Txn<'s>, ServiceError> {
    if let Some(h) = home {
        h.owners.check_owned(&h.tenant, extents)?;
    }
    let mut txn = store.begin();
    txn.free_each(extents)?;
    Ok(txn)
}

/// Answers a command; false when its caller is gone.
fn answer<T>(reply: Reply<T>, r: Result<T, ServiceError>) -> bool {
    reply.send(r.map_err(Status::from)).is_ok()
}

impl Owner {
    fn run(mut self) {
        let mut queue: VecDeque<Command> = VecDeque::new();
        loop {
            if queue.is_empty() && self.undo.is_empty() && self.forget.is_empty() {
                let wait = self.next_wake().saturating_duration_since(Instant::now());
                match self.rx.recv_timeout(wait) {
                    Ok(c) => {
                        self.dev.queued.fetch_sub(1, Ordering::Relaxed);
                        queue.push_back(c);
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => {
                        self.leases.end_all();
                        return;
                    }
                }
            }
            let before = queue.len();
            queue.extend(self.rx.try_iter());
            let taken = (queue.len() - before) as u64;
            self.dev.queued.fetch_sub(taken, Ordering::Relaxed);
            let now = Instant::now();
            // A bug in one round fails its calls (their replies are
            // dropped), not the device.
            let round = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.round(&mut queue, now)
            }));
            let Ok((later, close)) = round else {
                tracing::error!(device = %self.dev.name, "a round of the device's owner panicked; its calls failed");
                queue.clear();
                continue;
            };
            queue = later;
            // Leases that ended gave space back: the waiters try again.
            if self.leases.take_ended() {
                self.space_back = true;
            }
            if let Some(reply) = close {
                self.close(reply);
                return;
            }
        }
    }

    /// When the loop must look again without a command: the next expiry
    /// tick, a waiter's deadline, or now when waiters can try again.
    fn next_wake(&self) -> Instant {
        let mut at = self.next_expiry;
        for w in &self.waiters {
            at = at.min(w.deadline);
        }
        if self.space_back && !self.waiters.is_empty() {
            at = Instant::now();
        }
        at
    }

    /// One round over `queue` (see the module docs). Returns the commands
    /// left for the next round, and the reply of a Close taken.
    fn round(
        &mut self,
        queue: &mut VecDeque<Command>,
        now: Instant,
    ) -> (
        VecDeque<Command>,
        Option<oneshot::Sender<Result<(), StoreError>>>,
    ) {
        let store = Arc::clone(&self.dev.store);
        let mut txns: Vec<Txn<'_>> = Vec::new();
        let mut staged: Vec<Staged> = Vec::new();
        let mut later = VecDeque::new();
        let mut close = None;
        for (home, extents) in std::mem::take(&mut self.undo) {
            match stage_free(&store, home.as_ref(), &extents) {
                Ok(txn) => {
                    txns.push(txn);
                    staged.push(Staged::Free {
                        home,
                        extents,
                        request: None,
                        reply: None,
                    });
                }
                Err(e) => self.undone(&extents, Err(e)),
            }
        }
        if now >= self.next_expiry {
            self.forget.extend(self.leases.expire(now));
            self.next_expiry = now + self.cfg.expiry_interval;
            self.zeroing_ended();
        }
        let stale = self.leases.take_stale();
        if !self.forget.is_empty() || !stale.is_empty() {
            let mut txn = store.begin();
            for id in std::mem::take(&mut self.forget) {
                // Keys of 9 bytes are always valid ones.
                let _ = txn.delete_record(&lease_key(id));
            }
            for key in stale {
                let _ = txn.delete_record(&key);
            }
            txns.push(txn);
            staged.push(Staged::Ended { reply: None });
        }
        let retry = std::mem::replace(&mut self.space_back, false);
        let waiters = std::mem::take(&mut self.waiters);
        for w in waiters {
            if retry || now >= w.deadline || w.call.reply.is_closed() {
                self.attempt(&store, &mut txns, &mut staged, w.call, Some(w.deadline));
            } else {
                self.waiters.push(w);
            }
        }
        // Leases with a commit staged in this round.
        let mut busy = HashSet::new();
        while let Some(cmd) = queue.pop_front() {
            if close.is_some() {
                later.push_back(cmd);
                continue;
            }
            if cmd.lease().is_some_and(|l| busy.contains(&l)) {
                later.push_back(cmd);
                continue;
            }
            if cmd.caller_gone() {
                continue;
            }
            match cmd {
                Command::Allocate {
                    home,
                    ask,
                    request,
                    reply,
                } => match request.as_ref().map(|r| self.requests.check(r)) {
                    Some(Err(e)) => {
                        answer(reply, Err(e));
                    }
                    Some(Ok(Some(RequestResult::Allocated(objects)))) => {
                        let bs = store.geometry().block_size();
                        let r = pb::AllocateResponse {
                            replayed: true,
                            ..response(&objects, bs)
                        };
                        answer(reply, Ok(r));
                    }
                    Some(Ok(Some(RequestResult::Freed(_)))) => {
                        let id = request.map_or(0, |r| r.id);
                        answer(reply, Err(other_kind(id, "Free")));
                    }
                    Some(Ok(None)) | None => {
                        let call = PerCall {
                            home,
                            ask,
                            request,
                            reply,
                        };
                        self.attempt(&store, &mut txns, &mut staged, call, None);
                    }
                },
                Command::Free {
                    home,
                    extents,
                    request,
                    reply,
                } => match request.as_ref().map(|r| self.requests.check(r)) {
                    Some(Err(e)) => {
                        answer(reply, Err(e));
                    }
                    Some(Ok(Some(RequestResult::Freed(n)))) => {
                        answer(reply, Ok((n, true)));
                    }
                    Some(Ok(Some(RequestResult::Allocated(_)))) => {
                        let id = request.map_or(0, |r| r.id);
                        answer(reply, Err(other_kind(id, "Allocate")));
                    }
                    Some(Ok(None)) | None => match stage_free(&store, home.as_ref(), &extents) {
                        Ok(mut txn) => {
                            let blocks = extents.iter().map(|e| e.len()).sum();
                            let request = request.and_then(|r| {
                                self.requests
                                    .stage(&mut txn, r, RequestResult::Freed(blocks))
                            });
                            txns.push(txn);
                            staged.push(Staged::Free {
                                home,
                                extents,
                                request,
                                reply: Some(reply),
                            });
                        }
                        Err(e) => {
                            self.requests.done(request.as_ref());
                            answer(reply, Err(e));
                        }
                    },
                },
                Command::Commit {
                    lease,
                    scope,
                    seq,
                    batch,
                    reply,
                } => {
                    let mut txn = store.begin();
                    match self.leases.stage_commit(lease, scope, seq, batch, &mut txn) {
                        Ok(CommitStep::Staged(s)) => {
                            busy.insert(lease);
                            txns.push(txn);
                            staged.push(Staged::Commit { staged: s, reply });
                        }
                        Ok(CommitStep::Replayed(out)) => {
                            answer(reply, Ok(out));
                        }
                        Err(e) => {
                            answer(reply, Err(e));
                        }
                    }
                }
                Command::Lease {
                    home,
                    ask,
                    slot,
                    reply,
                } => {
                    let sc = scope(home.as_ref());
                    let mut txn = store.begin();
                    match self.leases.stage_grant(&ask, slot, home, &mut txn) {
                        Ok(g) => {
                            if let Some(id) = ask.extend {
                                busy.insert(id);
                            }
                            txns.push(txn);
                            staged.push(Staged::Grant {
                                staged: g,
                                scope: sc,
                                reply,
                            });
                        }
                        Err(e) => {
                            answer(reply, Err(e));
                        }
                    }
                }
                Command::Renew {
                    lease,
                    scope,
                    fragments,
                    reply,
                } => {
                    answer(reply, self.leases.renew(lease, fragments, scope));
                }
                Command::Release {
                    lease,
                    scope,
                    reply,
                } => match self.leases.release(lease, scope) {
                    Ok(n) => {
                        let mut txn = store.begin();
                        let _ = txn.delete_record(&lease_key(lease));
                        busy.insert(lease);
                        txns.push(txn);
                        staged.push(Staged::Ended {
                            reply: Some((reply, n)),
                        });
                    }
                    Err(e) => {
                        answer(reply, Err(e));
                    }
                },
                Command::Status {
                    tenant,
                    leases,
                    reply,
                } => {
                    let _ = reply.send(Ok(self.status(tenant.as_deref(), leases)));
                }
                Command::EndLeases { reply } => {
                    self.refuse_waiters();
                    let _ = reply.send(self.leases.end_all());
                }
                Command::Close { reply } => close = Some(reply),
            }
        }
        let results = if txns.is_empty() {
            Vec::new()
        } else {
            store.commit_all(txns)
        };
        for (s, r) in staged.into_iter().zip(results) {
            self.finish(s, r);
        }
        (later, close)
    }

    /// Stages a per-call allocation (its first attempt without a
    /// `deadline`, a waiter's with its own); when there is no room but the
    /// leases of its scope hold some, it waits for a recall (see the module
    /// docs).
    fn attempt<'s>(
        &mut self,
        store: &'s Arc<Store>,
        txns: &mut Vec<Txn<'s>>,
        staged: &mut Vec<Staged>,
        call: PerCall,
        deadline: Option<Instant>,
    ) {
        if call.reply.is_closed() {
            self.requests.done(call.request.as_ref());
            return;
        }
        match self.stage_allocate(store.begin(), call.home.as_ref(), &call.ask) {
            Ok((mut txn, pooled, response)) => {
                let request = call.request.and_then(|r| {
                    let objects = objects_of(&response);
                    self.requests
                        .stage(&mut txn, r, RequestResult::Allocated(objects))
                });
                txns.push(txn);
                staged.push(Staged::Allocate {
                    home: call.home,
                    pooled,
                    response,
                    request,
                    reply: call.reply,
                });
            }
            Err(e) if out_of_room(&e) => {
                let home = call.home.as_ref();
                let wait = match deadline {
                    None => {
                        let needed = call.ask.blocks.saturating_mul(u64::from(call.ask.count));
                        self.leases.recall_for_per_call(needed, home)
                    }
                    Some(t) if Instant::now() >= t || self.leases.leased_in_scope(home) == 0 => {
                        None
                    }
                    Some(t) => Some(t),
                };
                match wait {
                    Some(deadline) => self.waiters.push(Waiter { call, deadline }),
                    None => {
                        self.requests.done(call.request.as_ref());
                        let _ = call.reply.send(Err(self.refused_for_room(e)));
                    }
                }
            }
            Err(e) => {
                self.requests.done(call.request.as_ref());
                answer(call.reply, Err(e));
            }
        }
    }

    /// Puts one Allocate call's objects in `txn` (from the tenant's pool
    /// with `home`).
    #[allow(clippy::type_complexity)]
    fn stage_allocate<'s>(
        &self,
        mut txn: Txn<'s>,
        home: Option<&Home>,
        ask: &AllocateAsk,
    ) -> Result<(Txn<'s>, Option<PoolAllocation>, pb::AllocateResponse), ServiceError> {
        let bs = self.dev.store.geometry().block_size();
        if let Some(h) = home {
            let a = h.owners.allocate_in(
                &h.tenant,
                ask.count,
                ask.blocks,
                ask.scattered,
                ask.hint,
                &mut txn,
            )?;
            let reply = response(&a.objects, bs);
            if let Err(e) = check_reply_size(&reply, ask.max_reply) {
                // The aborted transaction frees the blocks in the store;
                // the pool takes them back.
                txn.abort();
                h.owners.allocation_failed(&h.tenant, a);
                return Err(e);
            }
            return Ok((txn, Some(a), reply));
        }
        let mut objects = Vec::with_capacity(ask.count as usize);
        if ask.scattered {
            for _ in 0..ask.count {
                objects.push(txn.allocate_scattered(ask.blocks)?);
            }
        } else {
            let mut extents = Vec::with_capacity(ask.count as usize);
            txn.allocate_each(
                &vec![ask.blocks; ask.count as usize],
                ask.hint,
                &mut extents,
            )?;
            objects.extend(extents.into_iter().map(|e| vec![e]));
        }
        let reply = response(&objects, bs);
        // A reply too large to send would leave its allocations durable and
        // unknown to the caller: refuse before committing.
        check_reply_size(&reply, ask.max_reply)?;
        Ok((txn, None, reply))
    }

    /// Settles staged work once its transaction is durable (or failed),
    /// and answers it.
    fn finish(&mut self, s: Staged, r: Result<CommitInfo, StoreError>) {
        match s {
            Staged::Allocate {
                home,
                pooled,
                response,
                request,
                reply,
            } => {
                // A caller that sent a request id learns of the allocation
                // when it resends the call: it stays allocated for it.
                let kept = request.is_some();
                self.requests.finish(request, r.is_ok());
                if let Err(e) = r {
                    if let (Some(h), Some(a)) = (&home, pooled) {
                        h.owners.allocation_failed(&h.tenant, a);
                    }
                    answer(reply, Err(e.into()));
                    return;
                }
                // Nobody will learn of an allocation whose caller is gone
                // (and sent no request id): it is freed again next round.
                if let Err(Ok(response)) = reply.send(Ok(response)) {
                    if kept {
                        return;
                    }
                    let extents = response
                        .objects
                        .iter()
                        .flat_map(|o| &o.extents)
                        .filter_map(|e| Extent::new(e.start, e.len).ok())
                        .collect();
                    self.undo.push((home, extents));
                }
            }
            Staged::Free {
                home,
                extents,
                request,
                reply,
            } => {
                self.requests.finish(request, r.is_ok());
                if r.is_ok() {
                    if let Some(h) = &home {
                        h.owners.freed(&h.tenant, &extents);
                    }
                    self.space_back = true;
                }
                let blocks = extents.iter().map(|e| e.len()).sum();
                match reply {
                    Some(reply) => {
                        answer(
                            reply,
                            r.map(|_| (blocks, false)).map_err(ServiceError::from),
                        );
                    }
                    None => self.undone(&extents, r.map(|_| ()).map_err(ServiceError::from)),
                }
            }
            Staged::Commit { staged, reply } => {
                let out = self.leases.finish_commit(staged, r);
                // Frees that did not join the lease are back in free space.
                self.space_back = true;
                answer(reply, out);
            }
            Staged::Grant {
                staged,
                scope,
                reply,
            } => {
                let extend = staged.extends();
                let out = self.leases.finish_grant(staged, r);
                let id = out.as_ref().ok().map(|g| g.id);
                if !answer(reply, out) {
                    // Nobody learns of a new lease: end it at once.
                    if let Some(id) = id.filter(|_| !extend) {
                        if self.leases.release(id, scope).is_ok() {
                            self.forget.push(id);
                        }
                    }
                }
            }
            Staged::Ended { reply } => {
                if let Some((reply, n)) = reply {
                    answer(reply, r.map(|_| n).map_err(ServiceError::from));
                }
            }
        }
    }

    /// Logs the outcome of freeing an allocation nobody heard of.
    fn undone(&self, extents: &[Extent], r: Result<(), ServiceError>) {
        let blocks: u64 = extents.iter().map(|e| e.len()).sum();
        match r {
            Ok(()) => tracing::warn!(
                device = %self.dev.name,
                blocks,
                "an allocation finished after its call was cancelled; freed again"
            ),
            Err(e) => tracing::error!(
                device = %self.dev.name,
                blocks,
                error = %e,
                "an allocation finished after its call was cancelled and could not be freed"
            ),
        }
    }

    /// The status of an allocation refused for want of room; when the
    /// device's engine refused it, with the device as it was then
    /// ([`pb::NoSpaceDetails`]).
    fn refused_for_room(&self, e: ServiceError) -> Status {
        let status = e.to_status();
        let ServiceError::Store(StoreError::Alloc(AllocError::NoSpace {
            requested,
            free,
            largest_free,
        })) = e
        else {
            return status;
        };
        let dev = &self.dev;
        let capacity = dev.store.geometry().capacity_blocks();
        let free = free.min(capacity);
        let leased = dev.leased_unused_blocks().min(capacity - free);
        let at = pb::NoSpaceDetails {
            requested_blocks: requested,
            free_blocks: free,
            largest_free_extent: largest_free,
            used_blocks: status::used_blocks(capacity, free, leased),
            leased_unused_blocks: leased,
            capacity_blocks: capacity,
        };
        details::with_no_space(status, &at)
    }

    /// The device's Status entry for a caller of `tenant`, with its leases
    /// when asked.
    fn status(
        &self,
        tenant: Option<&Tenant>,
        leases: bool,
    ) -> (pb::DeviceStatus, Vec<pb::LeaseStatus>) {
        let d = &self.dev;
        let (tenants, region_blocks) = status::tenant_status(d, tenant);
        let entry = pb::DeviceStatus {
            tenants,
            region_blocks,
            ..status::device_status(self.index, d)
        };
        let list: Vec<LeaseInfo> = if leases {
            // A tenant sees only its own leases.
            self.leases.list(tenant.map(|t| Some(t.id)))
        } else {
            Vec::new()
        };
        let leases = list
            .into_iter()
            .map(|l| pb::LeaseStatus {
                lease_id: l.id,
                client_id: l.client,
                device_index: self.index as u32,
                device_name: d.name.clone(),
                granted_blocks: l.granted_blocks,
                unused_blocks: l.unused_blocks,
                age_ms: l.age.as_millis() as u64,
                expires_in_ms: l.expires_in.as_millis() as u64,
            })
            .collect();
        (entry, leases)
    }

    /// Stops the device's background zeroing once its thread has ended.
    fn zeroing_ended(&mut self) {
        if self.zeroer.as_ref().is_some_and(|z| z.is_finished()) {
            self.stop_zeroing();
        }
    }

    /// Stops the device's background zeroing, logging why it ended: done,
    /// or the error that stopped it.
    fn stop_zeroing(&mut self) {
        let Some(z) = self.zeroer.take() else {
            return;
        };
        match z.stop() {
            Ok(()) if self.dev.store.zero_progress().is_some_and(|p| p.is_done()) => {
                tracing::info!(device = %self.dev.name, "background zeroing done")
            }
            Ok(()) => {}
            Err(e) => tracing::warn!(device = %self.dev.name, "background zeroing stopped: {e}"),
        }
    }

    /// Answers every waiting allocation: the server is stopping.
    fn refuse_waiters(&mut self) {
        for w in std::mem::take(&mut self.waiters) {
            self.requests.done(w.call.request.as_ref());
            let _ = w.call.reply.send(Err(ServiceError::ShuttingDown.into()));
        }
    }

    /// Ends every lease and closes the store (a final checkpoint and the
    /// close record); waiters are refused.
    fn close(mut self, reply: oneshot::Sender<Result<(), StoreError>>) {
        self.refuse_waiters();
        self.leases.end_all();
        self.stop_zeroing();
        let _ = reply.send(self.dev.store.close_shared());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockalloc_store::device::MemDevice;
    use blockalloc_store::FormatOptions;

    /// Runs calls with ids `ids` through `w` on `store`, each committed.
    fn run(store: &Store, w: &mut Requests, ids: std::ops::RangeInclusive<u64>) {
        for id in ids {
            let r = RequestId::new(id, "", b"contents");
            assert!(w.check(&r).unwrap().is_none(), "{id}");
            let mut txn = store.begin();
            let staged = w.stage(&mut txn, r, RequestResult::Freed(id));
            let ok = txn.commit().is_ok();
            w.finish(staged, ok);
        }
    }

    fn window_of(store: &Store) -> Requests {
        let found = store
            .records()
            .into_iter()
            .filter_map(|(k, v)| {
                let (_, _, rec) = RequestRecord::decode(&k, &v)?.unwrap();
                Some((k, rec))
            })
            .collect();
        Requests::restored(found)
    }

    #[test]
    fn the_window_keeps_the_newest_results_within_a_quarter_of_the_records() {
        let store = Store::format(
            MemDevice::new(16 << 20),
            FormatOptions {
                journal_bytes: Some(64 * 4096),
                ..FormatOptions::default()
            },
        )
        .unwrap();
        let mut w = Requests::default();
        run(&store, &mut w, 1..=3000);
        let room = store.records_limit() / 4;
        assert!(
            w.bytes <= room && w.bytes > room / 2,
            "{} of {room}",
            w.bytes
        );
        assert!(w.order.len() < 3000);
        let newest = RequestId::new(3000, "", b"contents");
        assert_eq!(w.check(&newest).unwrap(), Some(RequestResult::Freed(3000)));
        // The oldest went, on disk too: what a restart finds is the window.
        assert!(w
            .check(&RequestId::new(1, "", b"contents"))
            .unwrap()
            .is_none());
        let again = window_of(&store);
        assert_eq!(again.order, w.order);
        assert_eq!(again.bytes, w.bytes);
        // Other contents under a kept id are refused.
        let other = RequestId::new(3000, "", b"other");
        assert!(matches!(w.check(&other), Err(ServiceError::BadRequest(_))));
    }

    #[test]
    fn the_window_keeps_at_most_its_count_of_results() {
        let store = Store::format(
            MemDevice::new(64 << 20),
            FormatOptions {
                journal_bytes: Some(16 << 20),
                ..FormatOptions::default()
            },
        )
        .unwrap();
        let mut w = Requests::default();
        run(&store, &mut w, 1..=REQUEST_WINDOW as u64 + 10);
        assert_eq!(w.order.len(), REQUEST_WINDOW);
        assert_eq!(window_of(&store).order.len(), REQUEST_WINDOW);
        assert!(w
            .check(&RequestId::new(10, "", b"contents"))
            .unwrap()
            .is_none());
        let kept = RequestId::new(11, "", b"contents");
        assert_eq!(w.check(&kept).unwrap(), Some(RequestResult::Freed(11)));
    }

    #[test]
    fn a_running_request_id_is_busy_until_it_finishes() {
        let store = Store::format(MemDevice::new(16 << 20), FormatOptions::default()).unwrap();
        let mut w = Requests::default();
        let r = RequestId::new(5, "t", b"c");
        assert!(w.check(&r).unwrap().is_none());
        assert!(matches!(w.check(&r), Err(ServiceError::Busy(_))));
        // Ids are per tenant.
        assert!(w.check(&RequestId::new(5, "u", b"c")).unwrap().is_none());
        let mut txn = store.begin();
        let staged = w.stage(&mut txn, r.clone(), RequestResult::Freed(1));
        txn.abort();
        w.finish(staged, false);
        // A failed call keeps nothing: the id runs again.
        assert!(w.check(&r).unwrap().is_none());
    }
}
