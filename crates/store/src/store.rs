//! [`Store`]: format, open (recover), status, checkpoint, close.
//!
//! Shared state and its locks, taken in this order when nested:
//!
//! 0. `zero` — one background zeroing step at a time ([`crate::zero`]).
//! 1. `writer` — the journal writer (tail, sequence numbers, checkpoints);
//!    held only by the group-commit leader and by explicit checkpoints.
//! 2. `state` — the engine and the bookkeeping of open transactions, held
//!    for each allocate / free / rollback and while a leader applies a
//!    durable batch. Never held across device I/O.
//! 3. `queue` — the group-commit queue ([`crate::commit`]), never held
//!    across I/O or while taking another lock.
//!
//! Invariants (under `state`):
//! * `engine` free space == committed free space − allocations of open
//!   transactions and reservations (`reserved`); pending frees are still allocated in the
//!   engine until their commit is durable.
//! * `reserved` and `pending_free` are disjoint from each other and from the
//!   engine's free space; `[0, meta_blocks)` is allocated and in neither.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use blockalloc::{Allocator, Extent, FromFreeExtents, Geometry, SegFitAllocator, Status};

use crate::device::{AlignedBuf, Device};
use crate::error::{Result, StoreError};
use crate::format::{
    checkpoint, journal, JournalOp, Layout, Superblock, FORMAT_VERSION, FORMAT_VERSION_1, PAGE,
    SUPERBLOCK_AREA,
};
use crate::ranges::RangeSet;
use crate::recovery::{self, CheckpointRef, JournalState, RecoveryReport, SlotReport};
use crate::writer::{CommitQueue, JournalStatus, Writer};

/// How to format a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FormatOptions {
    /// Block size in bytes: a power of two from 512 B to 1 GiB.
    pub block_size: u64,
    /// Bytes per checkpoint slot; `None` for the default rule
    /// ([`Layout::default_sizes`]).
    pub checkpoint_slot_bytes: Option<u64>,
    /// Bytes of journal; `None` for the default rule.
    pub journal_bytes: Option<u64>,
    /// Overwrite an existing store.
    pub force: bool,
    /// The store's size in bytes (rounded down to whole blocks), at most
    /// the device's length; `None` for the whole device. A store may be
    /// smaller than its device: it starts at byte 0 and the bytes past it
    /// are never read or written (`open` only checks that the device holds
    /// the store).
    pub capacity_bytes: Option<u64>,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            block_size: 4096,
            checkpoint_slot_bytes: None,
            journal_bytes: None,
            force: false,
            capacity_bytes: None,
        }
    }
}

/// The record key of the zeroing position (a key of the store's own: user
/// keys never start with a zero byte).
pub(crate) const ZEROED_KEY: &[u8] = b"\0zeroed";

/// The zeroer's own state, under `Store::zero`: held for a piece's writes
/// and for a record's commit, so that one step runs at a time.
#[derive(Default)]
pub(crate) struct ZeroState {
    /// One piece of zeros, made at first use.
    buf: Option<AlignedBuf>,
}

impl ZeroState {
    /// `len` bytes of zeros (the same buffer every time).
    pub(crate) fn zeros(&mut self, len: usize) -> &AlignedBuf {
        self.buf.get_or_insert_with(|| AlignedBuf::zeroed(len))
    }
}

/// What the rest of the store reads of zeroing, under `Store::state` (so
/// that a status never waits for a piece's writes).
#[derive(Default)]
pub(crate) struct ZeroShown {
    /// The position, `None` when the store has nothing to zero.
    pub position: Option<u64>,
    /// The position of the committed record (`None`: no record).
    pub recorded: Option<u64>,
    /// Bytes of zeros written since open.
    pub written: u64,
    /// Calls that waited for a piece being zeroed.
    pub waits: u64,
    /// Why the thread stopped early.
    pub stopped: Option<String>,
}

/// Decodes the zeroing record's value.
pub(crate) fn decode_position(value: &[u8], first: u64, capacity: u64) -> Option<u64> {
    let v = u64::from_le_bytes(value.try_into().ok()?);
    (first..=capacity).contains(&v).then_some(v)
}

/// Allocation bookkeeping, under `Store::state`.
pub(crate) struct AllocState {
    pub engine: SegFitAllocator,
    /// Allocations of open transactions and unpublished reservations
    /// ([`crate::Reservation`]).
    pub reserved: RangeSet,
    /// Frees of open transactions.
    pub pending_free: RangeSet,
    pub open_txns: u64,
    /// The committed records ([`Store::records`]).
    pub records: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Their encoded size, as a checkpoint announcement restates them.
    pub records_bytes: usize,
    /// The piece that background zeroing is writing ([`crate::zero`]).
    pub zeroing: Option<Extent>,
    /// The end of the highest block taken from the engine since open (at
    /// open: the start of the free extent ending the device).
    pub frontier: u64,
    /// Background zeroing, as others see it.
    pub zero: ZeroShown,
}

impl AllocState {
    /// Applies one committed record change.
    pub(crate) fn set_record(&mut self, key: &[u8], value: Option<Vec<u8>>) {
        if let Some(old) = self.records.remove(key) {
            self.records_bytes -= JournalOp::put_len(key, &old);
        }
        if let Some(v) = value {
            self.records_bytes += JournalOp::put_len(key, &v);
            self.records.insert(key.to_vec(), v);
        }
    }
}

/// Told about each journal sync of a store ([`Store::observe_syncs`]).
/// Called on the committing thread with the journal writer held: keep it
/// short (record a number, never block).
pub trait SyncObserver: Send + Sync {
    /// A journal entry carrying `txns` transactions (0 for a checkpoint
    /// announcement) was written and synced; the sync took `took`.
    fn journal_synced(&self, txns: u32, took: std::time::Duration);
}

/// Counters since the store was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Transactions committed (with at least one operation).
    pub commits: u64,
    /// Journal entries written (one per group commit, plus checkpoint
    /// announcements).
    pub entries: u64,
    /// Device syncs.
    pub syncs: u64,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Bytes written to the journal.
    pub journal_bytes: u64,
    /// Bytes written to checkpoint slots.
    pub checkpoint_bytes: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub commits: AtomicU64,
    pub entries: AtomicU64,
    pub syncs: AtomicU64,
    pub checkpoints: AtomicU64,
    pub journal_bytes: AtomicU64,
    pub checkpoint_bytes: AtomicU64,
}

impl Counters {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// Space and metadata state of a store.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StoreStatus {
    /// Block size and capacity.
    pub geometry: Geometry,
    /// The engine's accounting. `used_blocks` includes the metadata area and
    /// the allocations of open transactions.
    pub space: Status,
    /// Blocks reserved for metadata.
    pub meta_blocks: u64,
    /// Blocks allocated by open transactions or held by reservations.
    pub reserved_blocks: u64,
    /// Blocks being freed by open transactions.
    pub pending_free_blocks: u64,
    /// Open transactions.
    pub open_txns: u64,
    /// Journal state.
    pub journal: JournalStatus,
}

/// A device's space allocator, made durable: allocations and frees are
/// grouped in transactions that become durable at
/// [`Txn::commit`](crate::Txn::commit), and a reopened device holds exactly
/// the committed state.
///
/// `Store` is `Send + Sync`: share it with an `Arc`, and transactions on
/// many threads commit concurrently, sharing device syncs (group commit).
///
/// ```
/// use blockalloc_store::{device::MemDevice, FormatOptions, Store};
///
/// let store = Store::format(MemDevice::new(64 << 20), FormatOptions::default())?;
/// let mut txn = store.begin();
/// let a = txn.allocate(256, None)?; // 1 MiB in 4 KiB blocks
/// let info = txn.commit()?; // durable when this returns
/// assert!(info.seq >= 1);
///
/// let mut txn = store.begin();
/// txn.free(a)?;
/// txn.commit()?; // the blocks are reusable from now on
/// # Ok::<(), blockalloc_store::StoreError>(())
/// ```
pub struct Store {
    pub(crate) dev: Box<dyn Device>,
    pub(crate) sb: Superblock,
    pub(crate) state: Mutex<AllocState>,
    pub(crate) writer: Mutex<Writer>,
    pub(crate) queue: CommitQueue,
    pub(crate) poison: OnceLock<String>,
    pub(crate) counters: Counters,
    /// Told about every journal sync ([`Store::observe_syncs`]).
    pub(crate) observer: OnceLock<Arc<dyn SyncObserver>>,
    /// Opened read-only: every write is refused before it reaches the
    /// device.
    pub(crate) read_only: bool,
    /// Set (under the writer lock) once [`Store::close`] wrote the close
    /// record: every later write is refused, so that none overwrites it.
    pub(crate) closed: std::sync::atomic::AtomicBool,
    /// Asked before every device write ([`Store::set_fence`]).
    pub(crate) fence: OnceLock<Fence>,
    /// Background zeroing ([`crate::zero`]); taken before `writer`.
    pub(crate) zero: Mutex<ZeroState>,
    /// Signalled (with `state`) when a piece's zeros are written.
    pub(crate) zeroed: std::sync::Condvar,
}

/// A check that says when a store must write nothing: its owner may no
/// longer own the device ([`Store::set_fence`]).
pub type Fence = Arc<dyn Fn() -> bool + Send + Sync>;

/// Claims `dev` for a writing store ([`Device::claim`]).
fn claim(dev: &dyn Device) -> Result<()> {
    dev.claim()
        .map_err(|e| match crate::device::DeviceBusy::from_io(&e) {
            Some(b) => StoreError::Busy {
                device: dev.describe(),
                holder: b.holder,
            },
            None => StoreError::io("while claiming the device", e),
        })
}

/// Releases a claim when dropped, unless disarmed.
struct ReleaseOnError<'a>(Option<&'a dyn Device>);

impl ReleaseOnError<'_> {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for ReleaseOnError<'_> {
    fn drop(&mut self) {
        if let Some(d) = self.0 {
            d.release();
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if !self.read_only {
            self.dev.release();
        }
    }
}

/// Keys of the store's own records (never shown to its user).
pub(crate) fn is_store_key(key: &[u8]) -> bool {
    key.first() == Some(&0)
}

/// True when `dev` holds a valid superblock (copy 0 or 1): formatting it
/// would destroy a store.
pub fn is_formatted(dev: &dyn Device) -> bool {
    recovery::read_superblock(dev).is_ok()
}

pub(crate) use crate::sync::lock;

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("device", &self.dev.describe())
            .field("layout", &self.sb.layout)
            .finish_non_exhaustive()
    }
}

/// Writes blank pages over the whole journal ring (not synced).
fn write_blank_ring(dev: &dyn Device, layout: &Layout, uuid: &[u8; 16]) -> std::io::Result<()> {
    let chunk = journal::blank_pages(256, uuid);
    let mut at = layout.journal_offset();
    let end = at + layout.journal_len;
    while at < end {
        let n = (end - at).min(chunk.len() as u64) as usize;
        dev.write_at(at, &chunk.as_slice()[..n])?;
        at += n as u64;
    }
    Ok(())
}

impl Store {
    /// Formats `device` and returns the open, empty store.
    ///
    /// Order of writes: invalidate any old superblocks (sync), blank the
    /// journal (every sector stamped blank) and zero both slot headers, write checkpoint 1 (everything but the
    /// metadata free) to slot 0 (sync), then both superblock copies (sync).
    /// A crash before the last sync leaves a device that `open` refuses as
    /// not formatted.
    ///
    /// # Errors
    /// [`StoreError::BadOptions`] for impossible sizes,
    /// [`StoreError::AlreadyFormatted`] when the device holds a store and
    /// `force` is false, I/O errors.
    pub fn format(device: impl Device + 'static, opts: FormatOptions) -> Result<Store> {
        let dev: Box<dyn Device> = Box::new(device);
        let len = match opts.capacity_bytes {
            Some(c) if c > dev.len() => {
                return Err(StoreError::BadOptions(format!(
                    "a store of {c} bytes does not fit {}, which has {} bytes",
                    dev.describe(),
                    dev.len()
                )))
            }
            Some(c) => c,
            None => dev.len(),
        };
        let layout = Layout::plan(
            len,
            opts.block_size,
            opts.checkpoint_slot_bytes,
            opts.journal_bytes,
        )
        .map_err(StoreError::BadOptions)?;
        if !opts.force && recovery::read_superblock(&*dev).is_ok() {
            return Err(StoreError::AlreadyFormatted {
                device: dev.describe(),
            });
        }
        claim(&*dev)?;
        // From here the claim is released on every path: by the store on
        // success, here on error.
        let claimed = ReleaseOnError(Some(&*dev));
        let w = |off: u64, buf: &[u8], what: &str| {
            dev.write_at(off, buf)
                .map_err(|e| StoreError::io(format!("while formatting ({what})"), e))
        };
        let sync = |what: &str| {
            dev.sync()
                .map_err(|e| StoreError::io(format!("while formatting ({what})"), e))
        };
        let zeros = AlignedBuf::zeroed(1 << 20);
        w(
            0,
            &zeros.as_slice()[..SUPERBLOCK_AREA as usize],
            "superblocks",
        )?;
        sync("superblocks")?;
        let uuid: [u8; 16] = rand::random();
        write_blank_ring(&*dev, &layout, &uuid)
            .map_err(|e| StoreError::io("while formatting (journal)", e))?;
        for i in 0..2 {
            w(
                layout.slot_offset(i),
                &zeros.as_slice()[..PAGE as usize],
                "checkpoint slots",
            )?;
        }
        let sb = Superblock {
            version: FORMAT_VERSION,
            uuid,
            layout,
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        };
        let all_data = Extent::from_range(layout.meta_blocks, layout.capacity_blocks)
            .expect("plan leaves at least one data block");
        let stamp = checkpoint::Stamp {
            slot: 0,
            uuid: sb.uuid,
            seq: 1,
            journal_seq: 1,
            journal_pos: 0,
        };
        let ck = checkpoint::encode(&stamp, &[all_data], &layout)
            .expect("a planned slot holds any checkpoint");
        w(layout.slot_offset(0), ck.as_slice(), "first checkpoint")?;
        sync("first checkpoint")?;
        let mut sbs = AlignedBuf::zeroed(SUPERBLOCK_AREA as usize);
        let page = sb.encode();
        sbs.as_mut_slice()[..PAGE as usize].copy_from_slice(&page);
        sbs.as_mut_slice()[PAGE as usize..].copy_from_slice(&page);
        w(0, sbs.as_slice(), "superblocks")?;
        sync("superblocks")?;
        let engine = SegFitAllocator::from_free_extents(layout.capacity_blocks, &[all_data])
            .map_err(|e| StoreError::BadOptions(e.to_string()))?;
        claimed.disarm();
        let first = CheckpointRef {
            slot: 0,
            seq: 1,
            journal_seq: 1,
            journal_pos: 0,
        };
        let journal = JournalState {
            next_seq: 1,
            tail_pos: 0,
            newest: first,
            keep_from: 0,
            next_checkpoint_seq: 2,
        };
        Ok(Store::assemble(dev, sb, engine, journal))
    }

    /// Opens a formatted device and recovers its committed state: the
    /// newest valid checkpoint plus the journal after it.
    ///
    /// Opening writes nothing (the first checkpoint after it goes to the slot
    /// not used for recovery), except that a store of format version 1 is
    /// upgraded to the current version first (two checkpoints, the journal
    /// rewritten, the superblocks; crash-safe at every step), and that a
    /// checkpoint torn at a crash is written again.
    ///
    /// # Errors
    /// [`StoreError::NotFormatted`], [`StoreError::Corrupt`] naming the
    /// damaged structure, [`StoreError::DeviceTooSmall`], I/O errors.
    ///
    /// A device that is read-only ([`Device::is_read_only`]) gives a
    /// read-only store, as [`open_read_only`](Self::open_read_only) does.
    pub fn open(device: impl Device + 'static) -> Result<(Store, RecoveryReport)> {
        let read_only = device.is_read_only();
        Self::open_mode(Box::new(device), read_only)
    }

    /// Opens a formatted device for reading only: recovery as in
    /// [`open`](Self::open), then the store answers every query, and refuses
    /// commits, checkpoints with [`StoreError::ReadOnly`] before anything
    /// reaches the device; [`close`](Self::close) writes nothing. For tools
    /// that look while a writer may be running, on read-only files and on
    /// read-only file systems.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn open_read_only(device: impl Device + 'static) -> Result<(Store, RecoveryReport)> {
        Self::open_mode(Box::new(device), true)
    }

    fn open_mode(dev: Box<dyn Device>, read_only: bool) -> Result<(Store, RecoveryReport)> {
        let r = recovery::recover(&*dev)?;
        if !read_only {
            claim(&*dev)?;
        }
        let mut store = Store::assemble(dev, r.sb, r.engine, r.journal);
        {
            let s = store.state.get_mut().unwrap_or_else(|p| p.into_inner());
            for (k, v) in r.records {
                s.set_record(&k, Some(v));
            }
            if let Some(v) = s.records.get(ZEROED_KEY) {
                let l = &r.sb.layout;
                let p = decode_position(v, l.meta_blocks, l.capacity_blocks).ok_or_else(|| {
                    StoreError::Corrupt {
                        structure: crate::error::Structure::ZeroingRecord,
                        offset: l.journal_offset(),
                        reason: format!(
                            "{} bytes that are no block from {} to {}",
                            v.len(),
                            l.meta_blocks,
                            l.capacity_blocks
                        ),
                    }
                })?;
                s.zero.position = Some(p);
                s.zero.recorded = Some(p);
            }
        }
        store.read_only = read_only;
        if !read_only && (r.sb.version == FORMAT_VERSION_1 || r.report.upgrade_unfinished) {
            store.upgrade()?;
        }
        // A checkpoint torn at a crash is told from damage only while its
        // announcement is the journal's last entry: write the checkpoint
        // again before anything follows it, so that a later recovery finds
        // the slot whole (not damage after two crashes).
        let torn = r.report.slots.iter().any(|s| {
            matches!(
                s,
                SlotReport::Damaged {
                    torn_by_crash: true,
                    ..
                }
            )
        });
        if !read_only && torn {
            match store.checkpoint() {
                Err(StoreError::CheckpointTooLarge { .. }) => {}
                r => r?,
            }
        }
        Ok((store, r.report))
    }

    /// Upgrades a store of format version 1 to the current version, before
    /// the store is shared. Every step leaves a device that recovers to the
    /// same state, so a crash anywhere is harmless and the next writable
    /// open starts again:
    ///
    /// 1. two checkpoints, written as version 1 does: both slots then replay
    ///    from the tail, and no version 1 entry is needed any more;
    /// 2. the whole ring blanked as `format` does, and the newest
    ///    checkpoint's announcement (which the older one replays) written
    ///    again in version 2, sync: a version 1 reader finds no entry after
    ///    the newest checkpoint either way;
    /// 3. superblock copy 0, then copy 1, each naming the current version,
    ///    each synced (a reader that finds copy 0 upgraded and copy 1 not
    ///    uses copy 0; [`RecoveryReport::upgrade_unfinished`]).
    ///
    /// A version 1 store whose slots are too small for a checkpoint of its
    /// free space ([`StoreError::CheckpointTooLarge`]) stays at version 1:
    /// it works as before, and the next writable open tries again.
    fn upgrade(&mut self) -> Result<()> {
        if self.sb.version == FORMAT_VERSION_1 {
            let mut w = lock(&self.writer);
            for _ in 0..2 {
                match self.write_checkpoint(&mut w) {
                    Err(StoreError::CheckpointTooLarge { .. }) => return Ok(()),
                    r => r?,
                }
            }
            // The older checkpoint replays from the newest one's
            // announcement: that entry is written again, in version 2.
            let newest = w.j.newest;
            let mut marker = Vec::new();
            JournalOp::CheckpointBegin {
                slot: newest.slot,
                seq: newest.seq,
            }
            .encode(&mut marker);
            let pos = newest.journal_pos - 1;
            let entry =
                journal::encode_entry(newest.journal_seq - 1, pos, &self.sb.uuid, 0, &marker);
            let l = &self.sb.layout;
            write_blank_ring(&*self.dev, l, &self.sb.uuid)
                .and_then(|()| {
                    let at = l.journal_offset() + (pos % l.journal_pages()) * PAGE;
                    self.dev.write_at(at, entry.as_slice())
                })
                .and_then(|()| self.dev.sync())
                .map_err(|e| StoreError::io("while upgrading the journal to version 2", e))?;
        }
        let sb = Superblock {
            version: FORMAT_VERSION,
            ..self.sb
        };
        let mut page = AlignedBuf::zeroed(PAGE as usize);
        page.as_mut_slice().copy_from_slice(&sb.encode());
        for copy in 0..2 {
            self.dev
                .write_at(copy * PAGE, page.as_slice())
                .and_then(|()| self.dev.sync())
                .map_err(|e| {
                    StoreError::io(format!("while upgrading superblock copy {copy}"), e)
                })?;
        }
        self.sb = sb;
        Ok(())
    }

    /// The records, in key order: a small key-value table that
    /// transactions change atomically with their allocations
    /// ([`Txn::put_record`](crate::Txn::put_record)), durable as they are.
    /// A user keeps there what must survive a crash together with the
    /// space it describes (the service: its leases, the results of recent
    /// calls, its owner epoch).
    pub fn records(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        lock(&self.state)
            .records
            .iter()
            .filter(|(k, _)| !is_store_key(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The committed value of record `key`.
    pub fn record(&self, key: &[u8]) -> Option<Vec<u8>> {
        if is_store_key(key) {
            return None;
        }
        lock(&self.state).records.get(key).cloned()
    }

    /// The most bytes the records may take, encoded (a key and a value
    /// take their lengths plus 3 to 11 bytes): half of the largest
    /// journal entry, since every checkpoint announcement restates them.
    pub fn records_limit(&self) -> usize {
        self.max_entry_payload() / 2
    }

    pub(crate) fn check_record_key(&self, key: &[u8]) -> Result<()> {
        if key.is_empty() || key.len() > crate::format::journal::MAX_KEY {
            return Err(StoreError::BadRecord {
                reason: format!(
                    "a key of {} bytes (1 to {} allowed)",
                    key.len(),
                    crate::format::journal::MAX_KEY
                ),
            });
        }
        if is_store_key(key) {
            return Err(StoreError::BadRecord {
                reason: "keys starting with a zero byte are the store's own".into(),
            });
        }
        if self.sb.version == FORMAT_VERSION_1 {
            return Err(StoreError::BadRecord {
                reason: "a store of format version 1 keeps no records (open it writable once \
                         to upgrade it)"
                    .into(),
            });
        }
        Ok(())
    }

    /// True when opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    fn assemble(
        dev: Box<dyn Device>,
        sb: Superblock,
        engine: SegFitAllocator,
        journal: JournalState,
    ) -> Store {
        let interval = (sb.layout.journal_pages() / 4).max(1);
        let cap = sb.layout.capacity_blocks;
        let mut last = Vec::new();
        let last_block = Extent::new(cap - 1, 1).expect("a store holds blocks");
        engine.free_extents_overlapping(last_block, &mut last);
        let frontier = last.first().map_or(cap, |e| e.start());
        Store {
            dev,
            sb,
            state: Mutex::new(AllocState {
                engine,
                reserved: RangeSet::new(sb.layout.capacity_blocks),
                pending_free: RangeSet::new(sb.layout.capacity_blocks),
                open_txns: 0,
                records: BTreeMap::new(),
                records_bytes: 0,
                zeroing: None,
                frontier,
                zero: Default::default(),
            }),
            writer: Mutex::new(Writer::new(journal, interval)),
            queue: CommitQueue::default(),
            poison: OnceLock::new(),
            counters: Counters::default(),
            observer: OnceLock::new(),
            read_only: false,
            closed: std::sync::atomic::AtomicBool::new(false),
            fence: OnceLock::new(),
            zero: Mutex::default(),
            zeroed: std::sync::Condvar::new(),
        }
    }

    /// Block size and capacity (metadata included).
    pub fn geometry(&self) -> Geometry {
        let l = &self.sb.layout;
        Geometry::from_blocks(l.capacity_blocks, l.block_size)
            .expect("the superblock was validated")
    }

    /// The device layout.
    pub fn layout(&self) -> Layout {
        self.sb.layout
    }

    /// The superblock.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// The device.
    pub fn device(&self) -> &dyn Device {
        &*self.dev
    }

    /// Installs `observer`, told about every journal sync from now on
    /// (for latency metrics). Returns false, changing nothing, when one is
    /// installed already.
    pub fn observe_syncs(&self, observer: Arc<dyn SyncObserver>) -> bool {
        self.observer.set(observer).is_ok()
    }

    /// Counters since the store was opened.
    pub fn stats(&self) -> StoreStats {
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StoreStats {
            commits: g(&c.commits),
            entries: g(&c.entries),
            syncs: g(&c.syncs),
            checkpoints: g(&c.checkpoints),
            journal_bytes: g(&c.journal_bytes),
            checkpoint_bytes: g(&c.checkpoint_bytes),
        }
    }

    /// Blocks that can be allocated or reserved now (the engine's free
    /// space; [`Status::free_blocks`] of [`Store::status`]). Cheap: it
    /// reads a counter, neither walks the free extents nor waits for the
    /// journal writer, so hot paths (lease grants, recall checks) can ask
    /// on every call.
    pub fn free_blocks(&self) -> u64 {
        let s = lock(&self.state);
        s.engine.capacity() - s.engine.used()
    }

    /// Space and metadata state. Costs a pass over the free extents and
    /// waits for the journal writer (which may be syncing the device).
    pub fn status(&self) -> StoreStatus {
        let journal = lock(&self.writer).status(&self.sb.layout);
        let s = lock(&self.state);
        StoreStatus {
            geometry: self.geometry(),
            space: s.engine.status(),
            meta_blocks: self.sb.layout.meta_blocks,
            reserved_blocks: s.reserved.blocks(),
            pending_free_blocks: s.pending_free.blocks(),
            open_txns: s.open_txns,
            journal,
        }
    }

    /// The free extents of the committed state (what a checkpoint taken now
    /// would hold): the engine's free space plus the allocations of open
    /// transactions.
    pub fn committed_free_extents(&self) -> Vec<Extent> {
        let s = lock(&self.state);
        crate::ranges::merge_sorted(s.engine.free_extents(), s.reserved.iter())
    }

    /// Checks the engine's invariants and the store's bookkeeping.
    ///
    /// # Errors
    /// A description of the broken invariant (a bug, never bad input).
    pub fn verify(&self) -> std::result::Result<(), String> {
        let s = lock(&self.state);
        s.engine.verify().map_err(|e| e.to_string())?;
        let meta = self.sb.layout.meta_blocks;
        if let Some(e) = s.engine.free_extents().first() {
            if e.start() < meta {
                return Err(format!("{e} is free but lies in the metadata area"));
            }
        }
        for r in s.reserved.iter().chain(s.pending_free.iter()) {
            if s.engine.check_allocated(r).is_err() {
                return Err(format!(
                    "{r} is held by an open transaction but free in the engine"
                ));
            }
        }
        for r in s.reserved.iter() {
            if s.pending_free.overlap(r).is_some() {
                return Err(format!(
                    "{r} is both allocated and being freed by open transactions"
                ));
            }
        }
        Ok(())
    }

    /// Refuses `action` on a read-only store.
    pub(crate) fn check_writable(&self, action: &'static str) -> Result<()> {
        if self.read_only {
            return Err(StoreError::ReadOnly {
                device: self.dev.describe(),
                action,
            });
        }
        Ok(())
    }

    /// Refuses work on a poisoned or closed store.
    pub(crate) fn check_poison(&self) -> Result<()> {
        self.check_open("write")?;
        match self.poison.get() {
            Some(cause) => Err(StoreError::Poisoned {
                cause: cause.clone(),
            }),
            None => Ok(()),
        }
    }

    /// [`StoreError::Closed`] once the store is closed.
    pub(crate) fn check_open(&self, action: &'static str) -> Result<()> {
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(StoreError::Closed {
                device: self.dev.describe(),
                action,
            });
        }
        Ok(())
    }

    /// From now on every write to the device (a commit's journal entry, a
    /// checkpoint, the close) first asks `fence`, under the writer lock,
    /// right before it writes: while it says true the store writes nothing
    /// and refuses with [`StoreError::Fenced`] (a commit's effects are
    /// rolled back; the store stays usable and writes again once the fence
    /// lifts). For an owner whose ownership comes from a lease elsewhere (a
    /// cluster): a paused owner that wakes after losing the lease writes
    /// nothing, not even its own lease expiries. The first fence set stays.
    pub fn set_fence(&self, fence: Fence) {
        let _ = self.fence.set(fence);
    }

    /// [`StoreError::Fenced`] while the fence says so.
    pub(crate) fn check_fence(&self) -> Result<()> {
        if self.fence.get().is_some_and(|f| f()) {
            return Err(StoreError::Fenced {
                device: self.dev.describe(),
            });
        }
        Ok(())
    }

    pub(crate) fn set_poison(&self, cause: &StoreError) {
        let _ = self.poison.set(cause.to_string());
    }

    /// Journal pages after the newest checkpoint that trigger the next one
    /// (default: a quarter of the ring). Smaller values bound recovery time
    /// more tightly and cost more checkpoint writes.
    pub fn set_checkpoint_interval(&self, pages: u64) {
        lock(&self.writer).interval = pages.max(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemDevice;

    #[test]
    fn format_refuses_an_existing_store_unless_forced() {
        let dev = std::sync::Arc::new(MemDevice::new(8 << 20));
        Store::format(dev.clone(), FormatOptions::default()).unwrap();
        let e = Store::format(dev.clone(), FormatOptions::default()).unwrap_err();
        assert!(matches!(e, StoreError::AlreadyFormatted { .. }), "{e}");
        let s = Store::format(
            dev.clone(),
            FormatOptions {
                force: true,
                ..FormatOptions::default()
            },
        )
        .unwrap();
        s.verify().unwrap();
    }

    #[test]
    fn format_counts_metadata_as_used() {
        let s = Store::format(MemDevice::new(64 << 20), FormatOptions::default()).unwrap();
        let st = s.status();
        assert_eq!(st.space.used_blocks, st.meta_blocks);
        assert_eq!(st.space.capacity_blocks, (64 << 20) / 4096);
        assert_eq!(
            s.committed_free_extents(),
            vec![Extent::from_range(st.meta_blocks, st.space.capacity_blocks).unwrap()]
        );
        assert!(format!("{s:?}").contains("memory device"));
    }

    #[test]
    fn a_store_smaller_than_its_device_leaves_the_rest_untouched() {
        let dev = std::sync::Arc::new(MemDevice::new(64 << 20));
        let tail = vec![0xa5; 4096];
        dev.poke(32 << 20, &tail);
        dev.poke((64 << 20) - 4096, &tail);
        let opts = |mib: u64| FormatOptions {
            capacity_bytes: Some(mib << 20),
            force: true,
            ..FormatOptions::default()
        };
        let e = Store::format(dev.clone(), opts(65)).unwrap_err();
        assert!(matches!(e, StoreError::BadOptions(_)), "{e}");
        assert!(e.to_string().contains("67108864 bytes"), "{e}");
        let s = Store::format(dev.clone(), opts(32)).unwrap();
        assert_eq!(s.status().space.capacity_blocks, (32 << 20) / 4096);
        s.close().unwrap();
        // Format and close wrote nothing past the store.
        assert_eq!(dev.peek(32 << 20, 4096), tail);
        assert_eq!(dev.peek((64 << 20) - 4096, 4096), tail);
        let (s, _) = Store::open(dev.clone()).unwrap();
        assert_eq!(s.status().space.capacity_blocks, (32 << 20) / 4096);
        s.verify().unwrap();
    }

    #[test]
    fn bad_options_and_unformatted_devices_are_errors() {
        let e = Store::format(
            MemDevice::new(64 << 20),
            FormatOptions {
                block_size: 1000,
                ..FormatOptions::default()
            },
        )
        .unwrap_err();
        assert!(matches!(e, StoreError::BadOptions(_)), "{e}");
        let e = Store::format(MemDevice::new(64 << 10), FormatOptions::default()).unwrap_err();
        assert!(e.to_string().contains("too small"), "{e}");
        let e = Store::open(MemDevice::new(1 << 20)).unwrap_err();
        assert!(matches!(e, StoreError::NotFormatted { .. }), "{e}");
        let e = Store::open(MemDevice::new(4096)).unwrap_err();
        assert!(matches!(e, StoreError::NotFormatted { .. }), "{e}");
    }

    #[test]
    fn a_truncated_device_is_refused() {
        let dev = MemDevice::new(8 << 20);
        let s = Store::format(dev, FormatOptions::default()).unwrap();
        drop(s);
        let dev = MemDevice::new(8 << 20);
        Store::format(
            std::sync::Arc::new(MemDevice::from_image(Vec::new())),
            FormatOptions::default(),
        )
        .unwrap_err();
        let img = {
            let d = std::sync::Arc::new(dev);
            Store::format(d.clone(), FormatOptions::default()).unwrap();
            d.image()
        };
        let e = Store::open(MemDevice::from_image(img[..4 << 20].to_vec())).unwrap_err();
        assert!(matches!(e, StoreError::DeviceTooSmall { .. }), "{e}");
    }
}
