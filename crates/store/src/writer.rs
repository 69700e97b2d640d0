//! The journal writer's state and the group-commit queue: what the
//! [commit path](crate::commit) works on, under `Store::writer` and
//! `Store::queue`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex};

use blockalloc::Extent;

use crate::error::Result;
use crate::format::Layout;
use crate::recovery::{next_lap, CheckpointRef, JournalState};

/// The journal and checkpoint state, for `inspect`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalStatus {
    /// Pages in the ring.
    pub ring_pages: u64,
    /// Pages that must be kept (from the older checkpoint's start to the
    /// tail).
    pub live_pages: u64,
    /// Pages written since the newest checkpoint.
    pub pages_since_checkpoint: u64,
    /// Sequence number of the next entry.
    pub next_seq: u64,
    /// Absolute page position of the next entry.
    pub tail_pos: u64,
    /// The newest checkpoint.
    pub newest_checkpoint: CheckpointRef,
    /// Pages after the newest checkpoint that trigger the next one.
    pub checkpoint_interval_pages: u64,
}

/// The journal writer, under `Store::writer`.
#[derive(Debug)]
pub(crate) struct Writer {
    pub j: JournalState,
    /// Pages after the newest checkpoint that trigger the next one.
    pub interval: u64,
    /// Tail when a checkpoint last failed as too large: automatic attempts
    /// wait for another interval.
    pub blocked_at: Option<u64>,
}

impl Writer {
    pub(crate) fn new(j: JournalState, interval: u64) -> Self {
        Writer {
            j,
            interval,
            blocked_at: None,
        }
    }

    pub(crate) fn due(&self) -> bool {
        let since = self.j.tail_pos - self.j.newest.journal_pos;
        since >= self.interval
            && self
                .blocked_at
                .is_none_or(|b| self.j.tail_pos - b >= self.interval)
    }

    /// Where an entry of `pages` pages goes.
    pub(crate) fn place(&self, pages: u64, ring: u64) -> u64 {
        let t = self.j.tail_pos;
        if t % ring + pages > ring {
            next_lap(t, ring)
        } else {
            t
        }
    }

    pub(crate) fn status(&self, l: &Layout) -> JournalStatus {
        JournalStatus {
            ring_pages: l.journal_pages(),
            live_pages: self.j.tail_pos - self.j.keep_from,
            pages_since_checkpoint: self.j.tail_pos - self.j.newest.journal_pos,
            next_seq: self.j.next_seq,
            tail_pos: self.j.tail_pos,
            newest_checkpoint: self.j.newest,
            checkpoint_interval_pages: self.interval,
        }
    }
}

/// A record change: the new value, or `None` for a delete.
pub(crate) type RecordChange = (Vec<u8>, Option<Vec<u8>>);

/// A transaction's work: its encoded operations, and what they do.
#[derive(Debug, Default)]
pub(crate) struct Work {
    pub payload: Vec<u8>,
    pub allocs: Vec<Extent>,
    pub frees: Vec<Extent>,
    pub records: Vec<RecordChange>,
}

/// A transaction waiting in the queue.
pub(crate) struct Pending {
    pub ticket: u64,
    pub work: Work,
}

/// A committed transaction's entry sequence number and group size, or why
/// its group failed.
pub(crate) type Outcome = Result<(u64, u32)>;

/// The queue under its mutex.
#[derive(Default)]
pub(crate) struct QueueState {
    pub next_ticket: u64,
    pub pending: VecDeque<Pending>,
    /// A thread is writing a group.
    pub leader: bool,
    /// Outcomes by ticket, until their threads take them.
    pub done: HashMap<u64, Outcome>,
}

/// The group-commit queue.
#[derive(Default)]
pub(crate) struct CommitQueue {
    pub q: Mutex<QueueState>,
    pub cv: Condvar,
}
