//! The background loop and its commit rounds: the pending allocations and
//! frees go out lease by lease, each batch with the lease's next sequence
//! number, and a batch not acknowledged is resent as it was, which the
//! server applies once. A batch that failed for a cause a resend may cure
//! (the server restarting, a cut connection, a reply from a stale owner) is
//! resent within the same round, after a pause (10 ms, doubling up to a
//! second), until its lease's deadline: a restarted server restores its
//! leases and answers the resend. Past the deadline the lease is dropped
//! and its uncommitted allocations are lost.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockalloc::{Allocator, Extent};
use blockalloc_proto::pb;
use tonic::Code;

use super::local::{Inflight, Local, LocalLease};
use super::options::lease_gone;
use super::shared::{lock, Shared, COMMITS, LOST};
use super::{recall, renew};
use crate::client::{extent, to_pb};
use crate::error::{ClientError, Result};
use crate::retry::Backoff;

/// Allocations plus frees in one `Commit`: the server's default limit per
/// request. A larger batch goes out in several commits of the same round.
const MAX_PER_COMMIT: usize = 4096;

/// The background task: commits, renews, releases; on close, commits and
/// releases everything.
pub(super) async fn background(sh: Arc<Shared>) -> Result<()> {
    let mut closing_rounds = 0u32;
    let mut last_commit = Instant::now();
    loop {
        // Registered before the flags are read, so a wake between the
        // check and the wait is not lost.
        let notified = sh.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let (renew_every, open) = {
            let l = lock(&sh.local);
            (renew::renew_every(&l, Instant::now()), l.open_gen)
        };
        let demanded = |sh: &Shared| {
            sh.closing.load(Ordering::Relaxed)
                || sh.urgent.load(Ordering::Relaxed)
                || sh.wanted.load(Ordering::Relaxed) >= open
        };
        if !demanded(&sh) {
            let until_commit = sh
                .opts
                .commit_interval
                .saturating_sub(last_commit.elapsed());
            let _ = tokio::time::timeout(until_commit.min(renew_every), notified).await;
        }
        let closing = sh.closing.load(Ordering::Relaxed);
        // Commit when asked to, or when the interval has passed; a wake
        // for renewals alone commits nothing.
        if demanded(&sh) || last_commit.elapsed() >= sh.opts.commit_interval {
            sh.urgent.store(false, Ordering::Relaxed);
            commit_round(&sh).await;
            last_commit = Instant::now();
        }
        renew::renew_round(&sh).await;
        recall::release_round(&sh, closing).await;
        if closing {
            closing_rounds += 1;
            let released = lock(&sh.local).leases.is_empty();
            if released || closing_rounds >= 5 {
                let _ = sh.done.send(u64::MAX);
                return if released {
                    Ok(())
                } else {
                    Err(ClientError::Unavailable(
                        "leases could not be released; they expire on the server".into(),
                    ))
                };
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Takes the gathered batch and commits it, lease by lease, in as many
/// passes as the per-request limit needs, and resends what failed for a
/// cause a resend may cure, after a pause, until it is answered or its
/// lease's deadline passes; then tells the waiters.
async fn commit_round(sh: &Shared) {
    let mut backoff = Backoff::default();
    let gen = loop {
        let (gen, next) = commit_pass(sh).await;
        match next {
            Next::Done => break gen,
            Next::More => {}
            Next::Resend => tokio::time::sleep(backoff.next_pause()).await,
        }
    };
    let _ = sh.done.send_if_modified(|d| {
        if *d < gen {
            *d = gen;
            true
        } else {
            false
        }
    });
}

/// What one pass sends: its generation, each lease's batch (with the
/// lease's fragment blocks, for the server's sizing), and whether a batch
/// was cut at [`MAX_PER_COMMIT`].
pub(super) struct Pass {
    pub(super) gen: u64,
    pub(super) work: Vec<(u64, Inflight, u64)>,
    pub(super) cut: bool,
    /// Allocations of leases dropped meanwhile, now lost.
    pub(super) lost: u64,
}

/// What a commit pass leaves to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// Everything sent was answered, and nothing more waits.
    Done,
    /// A batch was cut at the per-request limit: another pass follows.
    More,
    /// A batch is to be resent, after a pause.
    Resend,
}

/// How [`Local::commit_failed`] took a failed commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Failed {
    /// Not run, or run with its outcome unknown, before the lease's
    /// deadline: the batch stays in flight and is resent as it is.
    Resend,
    /// The lease is gone, or its deadline passed with the batch
    /// unanswered: it was dropped with this many allocations lost, and the
    /// batch's frees are queued again (unless it may have been applied).
    LeaseGone(u64),
    /// Refused with frees in it: the same sequence goes again without
    /// them at once.
    FreesDropped,
    /// Its allocations alone were refused: the lease was dropped with this
    /// many allocations lost.
    LeaseDropped(u64),
}

impl Local {
    /// Opens a pass: starts the next generation and gives every lease
    /// without an unacknowledged batch a new one of its pending
    /// allocations and (on the first such lease) the queued frees, at most
    /// [`MAX_PER_COMMIT`] operations; the rest waits for the next pass.
    /// An unacknowledged batch goes again unchanged.
    pub(super) fn open_pass(&mut self) -> Pass {
        let mut cut = false;
        let gen = self.open_gen;
        self.open_gen += 1;
        let mut by_lease: HashMap<u64, Vec<Extent>> = HashMap::new();
        for (id, e) in self.pending.drain(..) {
            by_lease.entry(id).or_default().push(e);
        }
        let mut frees = std::mem::take(&mut self.frees);
        let mut work = Vec::new();
        for lease in &mut self.leases {
            let mut allocs = by_lease.remove(&lease.id).unwrap_or_default();
            if lease.inflight.is_none() && (!allocs.is_empty() || !frees.is_empty()) {
                lease.unsure = false;
                if allocs.len() > MAX_PER_COMMIT {
                    let rest = allocs.split_off(MAX_PER_COMMIT);
                    self.pending.extend(rest.into_iter().map(|e| (lease.id, e)));
                    cut = true;
                }
                let n = frees.len().min(MAX_PER_COMMIT - allocs.len());
                cut |= n < frees.len();
                lease.inflight = Some(Inflight {
                    seq: lease.last_seq + 1,
                    allocs,
                    frees: frees.drain(..n).collect(),
                });
            } else if !allocs.is_empty() {
                // Waits behind an unacknowledged commit of the same lease.
                self.pending
                    .extend(allocs.into_iter().map(|e| (lease.id, e)));
            }
            if let Some(i) = &lease.inflight {
                work.push((lease.id, i.clone(), lease.engine.fragment_blocks()));
            }
        }
        // Allocations of leases dropped meanwhile are lost.
        let mut lost = 0;
        for (_, extents) in by_lease {
            lost += extents.len() as u64;
            self.note_lost(extents);
        }
        self.frees.extend(frees);
        Pass {
            gen,
            work,
            cut,
            lost,
        }
    }

    /// Frees that no lease can carry (none is held): they go as a per-call
    /// `Free`.
    pub(super) fn frees_without_lease(&self) -> Vec<Extent> {
        if self.leases.is_empty() {
            self.frees.clone()
        } else {
            Vec::new()
        }
    }

    /// The server acknowledged sequence `seq` of lease `id`, sent at
    /// `sent`: the batch is durable, the lease lives a TTL from `sent` (a
    /// commit keeps it alive as a renewal does; a reply without a TTL, from
    /// a server that does not say, keeps the lease's), the blocks it
    /// recycled join the lease, and a recall retires it. Returns whether
    /// the lease was recalled, and the error for recycled blocks the lease
    /// holds free already.
    pub(super) fn committed(
        &mut self,
        id: u64,
        seq: u64,
        r: &pb::CommitResponse,
        sent: Instant,
    ) -> (bool, Option<ClientError>) {
        let mut recalled = false;
        let mut bad = None;
        self.commit_acknowledged(id);
        if let Some(lease) = self.leases.iter_mut().find(|x| x.id == id) {
            lease.last_seq = seq;
            lease.inflight = None;
            lease.unsure = false;
            let ttl = match r.ttl_ms {
                0 => lease.ttl,
                ms => Duration::from_millis(ms),
            };
            lease.extended(sent, ttl, r.margin_ms);
            // Once per sequence: the inflight commit is gone now, and a
            // replayed reply arrives only in place of a lost one.
            bad = reuse_recycled(lease, &r.recycled);
            if r.recall {
                lease.retiring = true;
                recalled = true;
            }
        }
        self.set_refill(r.grantable_blocks);
        (recalled, bad)
    }

    /// The commit of `inf` for lease `id` failed with `e` at `now`; see
    /// [`Failed`].
    pub(super) fn commit_failed(
        &mut self,
        id: u64,
        inf: &Inflight,
        e: &ClientError,
        now: Instant,
    ) -> Failed {
        let (unsure, expired) = self
            .leases
            .iter()
            .find(|x| x.id == id)
            .map_or((false, true), |x| (x.unsure, now >= x.deadline));
        match e {
            ClientError::Refused {
                code: Code::NotFound | Code::FailedPrecondition,
                ..
            } if lease_gone(e) => {
                // Not applied (the server answers a resend of a commit
                // that ran as a replay, even once the lease ended): its
                // frees go again.
                if let Some(x) = self.leases.iter_mut().find(|x| x.id == id) {
                    x.unsure = false;
                }
                Failed::LeaseGone(self.drop_lease(id, true))
            }
            // Not run, cut off with its outcome unknown, or answered by a
            // stale owner; or refused while an earlier send, cut off, may
            // still be applying it: the batch stays in flight and is sent
            // again with the same sequence number, which the server
            // applies once (a replay answers a batch that did run). So a
            // cut-off commit is neither taken as lost (its allocations may
            // be durable) nor as done (they may not be), until the lease's
            // deadline: past it the lease is dropped and its allocations
            // lost.
            e if e.retryable() || (unsure && matches!(e, ClientError::Refused { .. })) => {
                if e.is_outcome_unknown() {
                    if let Some(x) = self.leases.iter_mut().find(|x| x.id == id) {
                        x.unsure = true;
                    }
                }
                if expired {
                    // Cut off at the deadline (or before), the batch is in
                    // doubt: settled later by the server's answer.
                    return Failed::LeaseGone(self.drop_lease(id, true));
                }
                Failed::Resend
            }
            _ if !inf.frees.is_empty() => {
                // Refused as a whole, and the frees are the likely cause (a
                // double free, a free of a lost allocation): nothing was
                // applied, so the same sequence is resent at once without
                // the frees, which are dropped with the error.
                if let Some(lease) = self.leases.iter_mut().find(|x| x.id == id) {
                    lease.inflight = (!inf.allocs.is_empty()).then(|| Inflight {
                        seq: inf.seq,
                        allocs: inf.allocs.clone(),
                        frees: Vec::new(),
                    });
                }
                Failed::FreesDropped
            }
            // Allocations alone refused: a bug on one side or the other.
            // Nothing of it is durable; the lease is left to expire.
            _ => Failed::LeaseDropped(self.drop_lease(id, false)),
        }
    }
}

/// One pass of a round: at most [`MAX_PER_COMMIT`] operations per lease.
/// Returns the pass's generation and what is left to do: resends, or
/// another pass when a batch was cut at the limit (and everything sent was
/// accepted).
async fn commit_pass(sh: &Shared) -> (u64, Next) {
    let mut failed = false;
    let mut resend = false;
    let Pass {
        gen,
        work,
        cut,
        lost,
    } = lock(&sh.local).open_pass();
    sh.count(LOST, lost);
    settle_in_doubt(sh).await;
    let frees_without_lease = lock(&sh.local).frees_without_lease();
    for chunk in frees_without_lease.chunks(MAX_PER_COMMIT) {
        match sh.client.free(&sh.opts.device, chunk).await {
            Ok(_) => {
                let mut l = lock(&sh.local);
                l.frees.retain(|f| !chunk.contains(f));
            }
            Err(e) => {
                if e.is_outcome_unknown() {
                    // The free may have run: sent again, it could free
                    // blocks allocated since by someone else. Dropped with
                    // the error instead; at worst they stay allocated
                    // until a `reconcile` finds them.
                    lock(&sh.local).frees.retain(|f| !chunk.contains(f));
                }
                failed = true;
                lock(&sh.local).note_error(gen, e);
                break;
            }
        }
    }
    for (id, inf, fragments) in work {
        sh.count(COMMITS, 1);
        let sent = Instant::now();
        let until = lock(&sh.local).attempt_until(id, sent);
        // On the connection's `Calls` stream (unary where it has none).
        let call = sh
            .client
            .commit_call(&sh.opts.device, commit_request(id, &inf, fragments));
        let r = within(until, call).await;
        let mut l = lock(&sh.local);
        match r {
            Ok(r) => {
                let (recalled, bad) = l.committed(id, inf.seq, &r, sent);
                if recalled {
                    sh.urge();
                }
                if let Some(e) = bad {
                    failed = true;
                    l.note_error(gen, e);
                }
            }
            Err(e) => {
                failed = true;
                match l.commit_failed(id, &inf, &e, Instant::now()) {
                    // Not an error yet: resent in this round.
                    Failed::Resend => {
                        resend = true;
                        continue;
                    }
                    Failed::LeaseGone(lost) => {
                        // Reported as the losses, not as this error.
                        sh.count(LOST, lost);
                        continue;
                    }
                    Failed::FreesDropped => sh.urge(),
                    Failed::LeaseDropped(lost) => {
                        sh.count(LOST, lost);
                    }
                }
                l.note_error(gen, e);
            }
        }
    }
    let next = if resend {
        Next::Resend
    } else if cut && !failed {
        Next::More
    } else {
        Next::Done
    };
    (gen, next)
}

/// The Commit of batch `inf` of lease `id`, reporting `fragments`.
fn commit_request(id: u64, inf: &Inflight, fragments: u64) -> pb::CommitRequest {
    pb::CommitRequest {
        lease_id: id,
        sequence: inf.seq,
        allocations: inf.allocs.iter().copied().map(to_pb).collect(),
        frees: inf.frees.iter().copied().map(to_pb).collect(),
        recycle_frees: true,
        fragment_blocks: fragments,
        epoch: 0,
    }
}

/// Past its deadline, a lease's call still waits this long for its reply.
const LAST_ATTEMPT: Duration = Duration::from_secs(1);

/// How long a batch in doubt is resent before it is given up (its frees
/// not sent, its allocations left: at worst allocated until `reconcile`).
const IN_DOUBT_PATIENCE: Duration = Duration::from_secs(600);

/// Resends each batch whose outcome was unknown when its lease's deadline
/// passed, to learn whether it ran: the server answers a commit that ran
/// as a replay even once the lease ended, and one that did not as a lease
/// gone ([`Local::settled`]).
async fn settle_in_doubt(sh: &Shared) {
    let batches = lock(&sh.local).in_doubt.clone();
    for (id, inf, since) in batches {
        let call = sh
            .client
            .commit_call(&sh.opts.device, commit_request(id, &inf, 0));
        let r = within(Instant::now() + LAST_ATTEMPT, call).await;
        let mut l = lock(&sh.local);
        match r {
            Ok(_) => l.settled(id, &inf, true),
            Err(e) if lease_gone(&e) => l.settled(id, &inf, false),
            Err(e) if e.retryable() && since.elapsed() < IN_DOUBT_PATIENCE => {}
            Err(_) => l
                .in_doubt
                .retain(|(x, b, _)| !(*x == id && b.seq == inf.seq)),
        }
    }
}

impl Local {
    /// Until when a call of lease `id` sent at `now` waits for its reply:
    /// the lease's deadline (then it counts as cut off, and the lease is
    /// dropped), or [`LAST_ATTEMPT`] after `now` if later.
    pub(super) fn attempt_until(&self, id: u64, now: Instant) -> Instant {
        let deadline = self
            .leases
            .iter()
            .find(|x| x.id == id)
            .map_or(now, |x| x.deadline);
        deadline.max(now + LAST_ATTEMPT)
    }
}

/// `call`'s result, or [`ClientError::OutcomeUnknown`] when it has none by
/// `until` (a connection that lost its peer without a word).
pub(super) async fn within<T>(
    until: Instant,
    call: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout_at(until.into(), call)
        .await
        .unwrap_or_else(|_| {
            Err(ClientError::OutcomeUnknown(
                "no reply by the lease's deadline".into(),
            ))
        })
}

/// Adds the freed blocks a commit handed back to its lease to the lease's
/// engine; the error for a reply that lists blocks the lease holds free
/// already (the rest is added all the same).
fn reuse_recycled(lease: &mut LocalLease, recycled: &[pb::Extent]) -> Option<ClientError> {
    let mut bad = None;
    for e in recycled {
        let ok = extent(e).is_ok_and(|e| lease.engine.free(e).is_ok());
        if !ok {
            bad = Some(ClientError::BadReply(format!(
                "lease {}: recycled extent {}+{} is not an allocation of the lease",
                lease.id, e.start, e.len
            )));
        }
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::super::local::tests::{ext, holding, lease};
    use super::super::options::LEASE_GONE_PHRASE;
    use super::*;

    fn reply(recycled: &[Extent], recall: bool) -> pb::CommitResponse {
        pb::CommitResponse {
            recycled: recycled.iter().copied().map(to_pb).collect(),
            recall,
            ..Default::default()
        }
    }

    fn refused(code: Code, reason: &str) -> ClientError {
        ClientError::Refused {
            code,
            reason: reason.into(),
        }
    }

    /// A lease 1 over `[0, 1000)` with `n` pending allocations of 1 block.
    fn with_pending(n: u64) -> Local {
        let mut l = holding(vec![lease(1, &[ext(0, 1000)])]);
        for _ in 0..n {
            l.allocate_now(1).unwrap();
        }
        l
    }

    #[test]
    fn a_pass_batches_each_leases_pending_allocations_under_its_next_sequence() {
        let mut l = holding(vec![lease(1, &[ext(0, 100)]), lease(2, &[ext(500, 100)])]);
        l.leases[1].last_seq = 41;
        let (a, _) = l.allocate_now(10).unwrap();
        l.leases[0].retiring = true;
        let (b, _) = l.allocate_now(10).unwrap();
        let freed = ext(9000, 3);
        l.free(freed);

        let p = l.open_pass();
        assert_eq!((p.gen, l.open_gen), (1, 2));
        assert!(!p.cut);
        assert_eq!(p.lost, 0);
        let batches: Vec<_> = p.work.iter().map(|(id, i, _)| (*id, i.clone())).collect();
        assert_eq!(
            batches,
            vec![
                (
                    1,
                    Inflight {
                        seq: 1,
                        allocs: vec![a],
                        frees: vec![freed],
                    }
                ),
                (
                    2,
                    Inflight {
                        seq: 42,
                        allocs: vec![b],
                        frees: Vec::new(),
                    }
                ),
            ]
        );
        assert!(l.pending.is_empty() && l.frees.is_empty());
    }

    #[test]
    fn an_unacknowledged_batch_is_resent_unchanged_and_newer_allocations_wait() {
        let mut l = with_pending(2);
        let first = l.open_pass().work[0].1.clone();
        // Cut off: outcome unknown.
        let e = ClientError::OutcomeUnknown("stream ended".into());
        assert_eq!(
            l.commit_failed(1, &first, &e, Instant::now()),
            Failed::Resend
        );
        let (later, _) = l.allocate_now(1).unwrap();
        l.free(ext(9000, 1));

        let p = l.open_pass();
        assert_eq!(p.gen, 2);
        assert_eq!(p.work.len(), 1);
        assert_eq!(p.work[0].1, first, "same sequence, same contents");
        assert_eq!(l.pending, vec![(1, later)], "waits behind the batch");
        assert_eq!(l.frees, vec![ext(9000, 1)], "waits too");

        // Acknowledged: the next pass carries what waited.
        let (recalled, bad) = l.committed(1, first.seq, &reply(&[], false), Instant::now());
        assert!(!recalled && bad.is_none(), "{bad:?}");
        assert_eq!(l.leases[0].last_seq, 1);
        let p = l.open_pass();
        assert_eq!(
            p.work[0].1,
            Inflight {
                seq: 2,
                allocs: vec![later],
                frees: vec![ext(9000, 1)],
            }
        );
    }

    #[test]
    fn an_unavailable_commit_is_resent_with_its_sequence() {
        let mut l = with_pending(1);
        let first = l.open_pass().work[0].1.clone();
        let e = ClientError::Unavailable("connection refused".into());
        assert_eq!(
            l.commit_failed(1, &first, &e, Instant::now()),
            Failed::Resend
        );
        assert_eq!(l.leases[0].inflight.as_ref(), Some(&first));
        assert!(l.lost.is_empty());
        assert_eq!(l.open_pass().work[0].1.seq, first.seq);
    }

    #[test]
    fn an_unanswered_commit_past_the_leases_deadline_loses_the_lease() {
        let mut l = with_pending(2);
        l.free(ext(9000, 1));
        let first = l.open_pass().work[0].1.clone();
        let d = l.leases[0].deadline;
        let e = ClientError::Unavailable("restarting".into());
        let before = d - Duration::from_millis(1);
        assert_eq!(l.commit_failed(1, &first, &e, before), Failed::Resend);
        assert!(l.lost.is_empty());
        assert_eq!(l.commit_failed(1, &first, &e, d), Failed::LeaseGone(2));
        assert!(l.leases.is_empty());
        assert_eq!(l.lost, first.allocs);
        assert_eq!(l.frees, vec![ext(9000, 1)], "never applied: sent again");
    }

    /// A commit whose reply had not come by the deadline (the client was
    /// paused, say) was taken as never run: its allocations were reported
    /// lost although the server had committed them, and they leaked. It
    /// is in doubt instead, settled by the server.
    #[test]
    fn a_commit_unanswered_at_the_deadline_is_in_doubt_not_taken_as_never_run() {
        let mut l = with_pending(2);
        let first = l.open_pass().work[0].1.clone();
        let d = l.leases[0].deadline;
        let e = ClientError::OutcomeUnknown("no reply by the lease's deadline".into());
        assert_eq!(l.commit_failed(1, &first, &e, d), Failed::LeaseGone(2));
        assert_eq!(l.in_doubt.len(), 1);
        assert!(l.frees.is_empty());
        l.settled(1, &first, true);
        assert_eq!(l.frees, first.allocs, "committed, and freed as nobody's");
    }

    #[test]
    fn a_refused_resend_of_a_cut_off_commit_is_resent_until_the_deadline() {
        let mut l = with_pending(1);
        l.free(ext(9000, 1));
        let first = l.open_pass().work[0].1.clone();
        let now = Instant::now();
        let cut = ClientError::OutcomeUnknown("connection reset".into());
        assert_eq!(l.commit_failed(1, &first, &cut, now), Failed::Resend);
        assert!(l.leases[0].unsure);
        // The server may still be applying the first send: a refusal of
        // the resend (its allocations taken already, its free done) is
        // not final.
        let e = refused(Code::FailedPrecondition, "already free");
        assert_eq!(l.commit_failed(1, &first, &e, now), Failed::Resend);
        assert_eq!(l.leases[0].inflight.as_ref(), Some(&first));
        // Past the deadline it is lost, and the frees, which may have been
        // applied, are not sent again.
        let d = l.leases[0].deadline;
        assert_eq!(l.commit_failed(1, &first, &e, d), Failed::LeaseGone(1));
        assert!(l.frees.is_empty());
        // Answered at last: sure again.
        let mut l = with_pending(1);
        let first = l.open_pass().work[0].1.clone();
        l.commit_failed(1, &first, &cut, now);
        l.committed(1, first.seq, &reply(&[], false), now);
        assert!(!l.leases[0].unsure);
    }

    #[test]
    fn a_commit_extends_the_lease_from_when_it_was_sent() {
        let mut l = with_pending(1);
        l.leases[0].deadline = l.leases[0].renewed;
        let first = l.open_pass().work[0].1.clone();
        let sent = l.leases[0].renewed + Duration::from_secs(30);
        let mut r = reply(&[], false);
        r.ttl_ms = 10_000;
        r.margin_ms = 1_000;
        l.committed(1, first.seq, &r, sent);
        let x = &l.leases[0];
        assert_eq!(x.deadline, sent + Duration::from_secs(9));
        assert_eq!((x.renewed, x.ttl), (sent, Duration::from_secs(10)));
        // A server that gives no TTL: the lease's own, and a twentieth of
        // it as the margin.
        l.allocate_now(1).unwrap();
        let second = l.open_pass().work[0].1.clone();
        let later = sent + Duration::from_secs(5);
        l.committed(1, second.seq, &reply(&[], false), later);
        assert_eq!(l.leases[0].deadline, later + Duration::from_millis(9_500));
    }

    #[test]
    fn a_large_batch_is_cut_at_the_per_request_limit() {
        let mut l = holding(vec![lease(1, &[ext(0, 10_000)])]);
        for _ in 0..MAX_PER_COMMIT + 3 {
            l.allocate_now(1).unwrap();
        }
        l.free(ext(20_000, 1));
        let p = l.open_pass();
        assert!(p.cut);
        assert_eq!(p.work[0].1.allocs.len(), MAX_PER_COMMIT);
        assert!(p.work[0].1.frees.is_empty(), "no room left for the free");
        assert_eq!(l.pending.len(), 3);
        assert_eq!(l.frees.len(), 1);
    }

    #[test]
    fn frees_fill_the_room_the_allocations_leave() {
        let mut l = with_pending(1);
        for i in 0..MAX_PER_COMMIT as u64 {
            l.frees.push(ext(100_000 + 2 * i, 1));
        }
        let p = l.open_pass();
        assert!(p.cut);
        assert_eq!(p.work[0].1.allocs.len(), 1);
        assert_eq!(p.work[0].1.frees.len(), MAX_PER_COMMIT - 1);
        assert_eq!(l.frees.len(), 1);
    }

    #[test]
    fn allocations_of_a_lease_dropped_meanwhile_are_lost() {
        let mut l = holding(vec![lease(1, &[ext(0, 100)])]);
        let orphan = ext(5000, 2);
        l.pending.push((9, orphan));
        let p = l.open_pass();
        assert_eq!(p.lost, 1);
        assert_eq!(l.lost, vec![orphan]);
        assert!(p.work.is_empty());
    }

    #[test]
    fn frees_go_per_call_only_when_no_lease_is_held() {
        let mut l = with_pending(0);
        l.frees.push(ext(9000, 1));
        assert!(l.frees_without_lease().is_empty());
        l.leases.clear();
        assert_eq!(l.frees_without_lease(), vec![ext(9000, 1)]);
        // A pass without a lease keeps them queued for that call.
        l.open_pass();
        assert_eq!(l.frees, vec![ext(9000, 1)]);
    }

    #[test]
    fn recycled_blocks_join_the_lease_once_and_a_recall_retires_it() {
        let mut l = with_pending(1);
        let inf = l.open_pass().work[0].1.clone();
        let before = l.leases[0].unused();
        let back = ext(4000, 50);
        let (recalled, bad) = l.committed(1, inf.seq, &reply(&[back], true), Instant::now());
        assert!(recalled && bad.is_none());
        assert!(l.leases[0].retiring);
        assert!(l.leases[0].inflight.is_none());
        assert_eq!(l.leases[0].unused(), before + 50);
        // The same blocks again are no allocation of the lease.
        let (_, bad) = l.committed(1, inf.seq, &reply(&[back], false), Instant::now());
        assert!(matches!(bad, Some(ClientError::BadReply(_))), "{bad:?}");
        assert_eq!(l.leases[0].unused(), before + 50);
    }

    #[test]
    fn a_gone_lease_loses_its_allocations_and_resends_its_frees() {
        let mut l = with_pending(2);
        l.free(ext(9000, 1));
        let inf = l.open_pass().work[0].1.clone();
        let (waiting, _) = l.allocate_now(1).unwrap();
        let gone = refused(Code::FailedPrecondition, LEASE_GONE_PHRASE);
        assert_eq!(
            l.commit_failed(1, &inf, &gone, Instant::now()),
            Failed::LeaseGone(3)
        );
        assert!(l.leases.is_empty());
        assert_eq!(l.lost.len(), 3);
        assert!(l.lost.contains(&waiting));
        assert_eq!(l.frees, vec![ext(9000, 1)]);
        assert_eq!(
            l.commit_failed(
                1,
                &inf,
                &refused(Code::NotFound, "no lease"),
                Instant::now()
            ),
            Failed::LeaseGone(0)
        );
    }

    #[test]
    fn a_refused_batch_with_frees_is_resent_at_once_without_them() {
        let mut l = with_pending(1);
        l.free(ext(9000, 1));
        let inf = l.open_pass().work[0].1.clone();
        let e = refused(Code::FailedPrecondition, "double free");
        assert_eq!(
            l.commit_failed(1, &inf, &e, Instant::now()),
            Failed::FreesDropped
        );
        assert_eq!(
            l.leases[0].inflight,
            Some(Inflight {
                seq: inf.seq,
                allocs: inf.allocs.clone(),
                frees: Vec::new(),
            })
        );
        assert!(l.frees.is_empty() && l.lost.is_empty());

        // Frees alone: nothing is left to resend.
        let mut l = with_pending(0);
        l.free(ext(9000, 1));
        let inf = l.open_pass().work[0].1.clone();
        assert_eq!(
            l.commit_failed(1, &inf, &e, Instant::now()),
            Failed::FreesDropped
        );
        assert!(l.leases[0].inflight.is_none());
        assert!(!l.has_work(), "the free is dropped with the error");
    }

    #[test]
    fn a_refused_batch_of_allocations_drops_the_lease() {
        let mut l = with_pending(2);
        let inf = l.open_pass().work[0].1.clone();
        let e = refused(Code::InvalidArgument, "outside the lease");
        assert_eq!(
            l.commit_failed(1, &inf, &e, Instant::now()),
            Failed::LeaseDropped(2)
        );
        assert!(l.leases.is_empty());
        assert_eq!(l.lost, inf.allocs);
    }
}
