//! Background zeroing: writing zeros over a device file's never-written
//! free space ahead of allocation.
//!
//! On ext4 and XFS a block that `fallocate` reserved but nothing wrote is
//! an *unwritten* extent: the first write into it converts the extent, a
//! metadata transaction that the writer's `fdatasync` then waits for. A
//! block zeroed beforehand is a plain overwrite (`docs/background.md`
//! measured 4× for synced 4 KiB writes). Zeroing a whole large file at
//! format takes hours, so a store can instead zero in the background:
//!
//! * **Where.** The engine cuts every extent from its front and takes the
//!   device's last free extent (the never-used space) last, so space is
//!   first handed out in address order from the lowest block never handed
//!   out. The zeroer works in that order from `max(position, frontier)`,
//!   where the *frontier* is the end of the highest block handed out since
//!   the store was opened (at open: the start of the free extent that ends
//!   the device). It writes zeros only over blocks free in the engine, one
//!   *piece* of at most [`PIECE_BYTES`] at a time, and moves its position
//!   past the piece.
//! * **The race.** A piece's free blocks are chosen under the state lock,
//!   which also publishes the piece as *being zeroed*. Any call that takes
//!   blocks from the engine (an allocation, a reservation, a range taken
//!   for a tenant) and gets one inside that piece waits, before it
//!   returns, until the piece's writes completed. So no caller learns of a
//!   block before the zeros under it are written, and no zero is written
//!   into a block after a caller could have learned of it. Placement is the
//!   engine's, unchanged: the zeroer never holds blocks back.
//! * **Progress** is a record of the store ([`Txn`](crate::Txn) records,
//!   key `"\0zeroed"`, the position as 8 bytes little-endian), committed
//!   only after a device sync made every zero below it durable, so a crash
//!   never makes an unzeroed range look zeroed; a crash only loses progress
//!   since the last record, which the next run writes again. Without the
//!   record there is nothing to zero (a block device, a file zeroed at
//!   format); [`Store::plan_zeroing`] creates it.
//! * **Pace** ([`Store::start_zeroing`]): after each piece the thread
//!   sleeps so that its writes fill at most `share` of its time. A busy
//!   device makes each piece slower and so the sleep longer: the share
//!   is of the device's time whatever its speed, with no bandwidth to
//!   configure.
//!
//! Below the position every block is zeroed, or was handed out when the
//! zeroer passed it (zeroed then by its user's writes, or unwritten where
//! its user never wrote it).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use blockalloc::Extent;

use crate::error::{Result, StoreError};
use crate::store::{lock, AllocState, Store, ZEROED_KEY};

/// The most bytes zeroed at once: an allocation that lands in the piece
/// being zeroed waits at most for writes of this size.
pub const PIECE_BYTES: u64 = 1 << 20;

/// How often the zeroing thread records its position (a crash loses at
/// most this much progress).
pub const RECORD_EVERY: Duration = Duration::from_secs(1);

/// Where background zeroing stands ([`Store::zero_progress`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ZeroProgress {
    /// Zeroing has passed every block below this one (see the module
    /// docs); the device's capacity once done.
    pub position: u64,
    /// The position recorded durably (what a restart resumes from).
    pub recorded: u64,
    /// The first data block (zeroing starts there).
    pub first_block: u64,
    /// The device's capacity in blocks.
    pub capacity_blocks: u64,
    /// Bytes of zeros written since the store was opened.
    pub written_bytes: u64,
    /// Calls since open that took blocks in a piece being zeroed and so
    /// waited for its writes.
    pub waits: u64,
    /// Why the zeroing thread stopped early, if it did.
    pub stopped: Option<String>,
}

impl ZeroProgress {
    /// The share of the data area that zeroing has passed, 0 to 1.
    pub fn fraction(&self) -> f64 {
        let all = self.capacity_blocks.saturating_sub(self.first_block);
        if all == 0 {
            return 1.0;
        }
        self.position.saturating_sub(self.first_block) as f64 / all as f64
    }

    /// True once zeroing has passed the whole device.
    pub fn is_done(&self) -> bool {
        self.position >= self.capacity_blocks
    }
}

impl AllocState {
    /// Bookkeeping for blocks just taken from the engine (allocated,
    /// reserved or taken for a pool): the frontier moves past them, and
    /// when one lies in the piece being zeroed this waits, the lock
    /// released meanwhile, until that piece's writes are done.
    pub(crate) fn took<'a>(
        mut guard: MutexGuard<'a, AllocState>,
        store: &Store,
        taken: &[Extent],
    ) -> MutexGuard<'a, AllocState> {
        if let Some(end) = taken.iter().map(|e| e.end()).max() {
            guard.frontier = guard.frontier.max(end);
        }
        let inside = |g: &AllocState| {
            g.zeroing
                .is_some_and(|z| taken.iter().any(|e| e.intersection(&z).is_some()))
        };
        if inside(&guard) {
            guard.zero.waits += 1;
        }
        while inside(&guard) {
            guard = store.zeroed.wait(guard).unwrap_or_else(|p| p.into_inner());
        }
        guard
    }
}

impl Store {
    /// Records that the store's free space is to be zeroed in the
    /// background, from its first data block (for a device file whose
    /// blocks `fallocate` left unwritten). Does nothing when a position is
    /// recorded already.
    ///
    /// # Errors
    /// As [`Txn::commit`](crate::Txn::commit).
    pub fn plan_zeroing(&self) -> Result<()> {
        let _z = lock(&self.zero);
        if lock(&self.state).zero.position.is_some() {
            return Ok(());
        }
        let first = self.sb.layout.meta_blocks;
        self.commit_position(first)?;
        lock(&self.state).zero.position = Some(first);
        Ok(())
    }

    /// Where background zeroing stands; `None` when the store has nothing
    /// to zero (no [`plan_zeroing`](Self::plan_zeroing) since format).
    pub fn zero_progress(&self) -> Option<ZeroProgress> {
        let l = &self.sb.layout;
        let s = lock(&self.state);
        Some(ZeroProgress {
            position: s.zero.position?,
            recorded: s.zero.recorded.unwrap_or(l.meta_blocks),
            first_block: l.meta_blocks,
            capacity_blocks: l.capacity_blocks,
            written_bytes: s.zero.written,
            waits: s.zero.waits,
            stopped: s.zero.stopped.clone(),
        })
    }

    /// Zeroes the next piece (at most [`PIECE_BYTES`]) of never-used free
    /// space and moves the position past it, without syncing or recording
    /// (see [`record_zeroing`](Self::record_zeroing)). Returns the bytes
    /// written (0 when the piece held no free block), or `None` when
    /// nothing is left to zero. The steps of the thread of
    /// [`start_zeroing`](Self::start_zeroing), for callers that pace their
    /// own.
    ///
    /// # Errors
    /// [`StoreError::ReadOnly`], [`StoreError::Closed`],
    /// [`StoreError::Poisoned`], [`StoreError::Fenced`] (nothing written),
    /// [`StoreError::Io`] when a write fails (the position stays; the
    /// store stays usable: zeros over free space change no committed
    /// state).
    pub fn zero_piece(&self) -> Result<Option<u64>> {
        self.check_writable("zero free space")?;
        self.check_poison()?;
        let mut z = lock(&self.zero);
        let l = self.sb.layout;
        let bs = l.block_size;
        let mut s = lock(&self.state);
        let Some(position) = s.zero.position else {
            return Ok(None);
        };
        let start = position.max(s.frontier);
        if start >= l.capacity_blocks {
            s.zero.position = Some(l.capacity_blocks);
            return Ok(None);
        }
        let piece_blocks = (PIECE_BYTES / bs).max(1);
        let piece = Extent::new(start, piece_blocks.min(l.capacity_blocks - start))
            .expect("inside the device");
        let mut free = Vec::new();
        s.engine.free_extents_overlapping(piece, &mut free);
        let free: Vec<Extent> = free.iter().filter_map(|e| e.intersection(&piece)).collect();
        s.zeroing = Some(piece);
        drop(s);
        let written = self.write_zeros(&mut z, &free);
        let mut s = lock(&self.state);
        s.zeroing = None;
        if let Ok(bytes) = written {
            s.zero.written += bytes;
            s.zero.position = Some(piece.end());
        }
        drop(s);
        self.zeroed.notify_all();
        written.map(Some)
    }

    fn write_zeros(&self, z: &mut crate::store::ZeroState, free: &[Extent]) -> Result<u64> {
        let bs = self.sb.layout.block_size;
        let chunk = PIECE_BYTES as usize;
        let buf = z.zeros(chunk);
        let mut bytes = 0;
        for e in free {
            let (mut at, end) = (e.start() * bs, e.end() * bs);
            while at < end {
                let n = (end - at).min(chunk as u64);
                // A fenced owner writes nothing: the device may be
                // another's now, its blocks handed out there.
                self.check_fence()?;
                self.dev
                    .write_at(at, &buf.as_slice()[..n as usize])
                    .map_err(|e| StoreError::io("while writing zeros over free space", e))?;
                at += n;
                bytes += n;
            }
        }
        Ok(bytes)
    }

    /// Syncs the device, so that every zero written so far is durable,
    /// then commits the position as the zeroing record. Does nothing when
    /// the recorded position is current.
    ///
    /// # Errors
    /// As [`zero_piece`](Self::zero_piece) and
    /// [`Txn::commit`](crate::Txn::commit).
    pub fn record_zeroing(&self) -> Result<()> {
        let _z = lock(&self.zero);
        let s = lock(&self.state);
        let (Some(position), recorded) = (s.zero.position, s.zero.recorded) else {
            return Ok(());
        };
        drop(s);
        if recorded == Some(position) {
            return Ok(());
        }
        self.check_writable("zero free space")?;
        self.check_fence()?;
        // The zeros first: a record ahead of them would make unzeroed
        // blocks look zeroed after a crash.
        self.dev
            .sync()
            .map_err(|e| StoreError::io("while syncing zeros over free space", e))?;
        crate::store::Counters::add(&self.counters.syncs, 1);
        self.commit_position(position)
    }

    fn commit_position(&self, position: u64) -> Result<()> {
        let mut txn = self.begin();
        txn.put_store_record(ZEROED_KEY, &position.to_le_bytes());
        txn.commit()?;
        lock(&self.state).zero.recorded = Some(position);
        Ok(())
    }

    /// Starts a thread that zeroes the never-used free space (see the
    /// module docs) until it is all zeroed or the returned handle is
    /// stopped or dropped, its writes taking at most `share` (0 to 1] of
    /// its time, recording its position every [`RECORD_EVERY`] and when it
    /// stops. Returns `None` when the store has nothing to zero.
    ///
    /// Stop it before closing the store. Its records are commits: a
    /// [`Store::reconcile`] running beside it stops with
    /// [`ReconcileError::Interrupted`](crate::ReconcileError::Interrupted).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use blockalloc_store::{device::MemDevice, FormatOptions, Store};
    ///
    /// let store = Arc::new(Store::format(MemDevice::new(64 << 20), FormatOptions::default())?);
    /// store.plan_zeroing()?;
    /// let zeroer = store.start_zeroing(0.25)?.expect("planned");
    /// let mut txn = store.begin();
    /// txn.allocate(256, None)?; // never lands on a piece being zeroed
    /// txn.commit()?;
    /// zeroer.stop()?; // records how far it got
    /// let p = store.zero_progress().unwrap();
    /// assert_eq!(p.recorded, p.position);
    /// # Ok::<(), blockalloc_store::StoreError>(())
    /// ```
    ///
    /// # Errors
    /// [`StoreError::BadOptions`] when `share` is not in (0, 1],
    /// [`StoreError::ReadOnly`] on a read-only store.
    pub fn start_zeroing(self: &Arc<Self>, share: f64) -> Result<Option<Zeroer>> {
        if !(share > 0.0 && share <= 1.0) {
            return Err(StoreError::BadOptions(format!(
                "the zeroing share must be above 0 and at most 1, not {share}"
            )));
        }
        self.check_writable("zero free space")?;
        let position = lock(&self.state).zero.position;
        if position.is_none_or(|p| p >= self.sb.layout.capacity_blocks) {
            return Ok(None);
        }
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let store = Arc::clone(self);
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("blockalloc-zero".into())
            .spawn(move || {
                let r = run(&store, share, &flag);
                if let Err(e) = &r {
                    lock(&store.state).zero.stopped = Some(e.to_string());
                }
                r
            })
            .map_err(|e| StoreError::io("while starting the zeroing thread", e))?;
        Ok(Some(Zeroer {
            stop,
            thread: Some(thread),
        }))
    }
}

/// The zeroing thread's loop.
fn run(store: &Store, share: f64, stop: &(Mutex<bool>, Condvar)) -> Result<()> {
    let rest = (1.0 - share) / share;
    let mut last_record = Instant::now();
    loop {
        let t = Instant::now();
        let step = store.zero_piece();
        let mut busy = t.elapsed();
        let more = match step {
            Ok(Some(_)) => true,
            Ok(None) => false,
            // A fenced owner waits: the fence may lift.
            Err(StoreError::Fenced { .. }) => {
                busy = busy.max(Duration::from_millis(100));
                true
            }
            Err(e) => return Err(e),
        };
        if !more || last_record.elapsed() >= RECORD_EVERY {
            let t = Instant::now();
            match store.record_zeroing() {
                Ok(()) | Err(StoreError::Fenced { .. }) => {}
                Err(e) => return Err(e),
            }
            busy += t.elapsed();
            last_record = Instant::now();
        }
        if !more {
            return Ok(());
        }
        let (m, cv) = stop;
        let stopped = lock(m);
        let (stopped, _) = cv
            .wait_timeout_while(stopped, busy.mul_f64(rest), |s| !*s)
            .unwrap_or_else(|p| p.into_inner());
        if *stopped {
            drop(stopped);
            return match store.record_zeroing() {
                Err(StoreError::Fenced { .. } | StoreError::Closed { .. }) => Ok(()),
                r => r,
            };
        }
    }
}

/// The zeroing thread of [`Store::start_zeroing`]; dropping it stops the
/// thread (as [`stop`](Self::stop) does, ignoring the outcome).
#[derive(Debug)]
pub struct Zeroer {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<Result<()>>>,
}

impl Zeroer {
    /// Stops the thread after its current piece, records the position, and
    /// waits for it.
    ///
    /// # Errors
    /// The error that stopped the thread early, or that recording the
    /// position met.
    pub fn stop(mut self) -> Result<()> {
        self.halt().unwrap_or_else(|p| std::panic::resume_unwind(p))
    }

    /// True once the thread has ended (all zeroed, or stopped by an
    /// error that [`Store::zero_progress`] names).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    fn halt(&mut self) -> std::thread::Result<Result<()>> {
        let (m, cv) = &*self.stop;
        *lock(m) = true;
        cv.notify_all();
        self.thread.take().map_or(Ok(Ok(())), |t| t.join())
    }
}

impl Drop for Zeroer {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}
