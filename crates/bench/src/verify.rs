//! [`PatternDevice`]: fill every allocated block with a pattern derived from
//! its owner, check every byte before the space is released.
//!
//! This is the replay-and-check method of the original notes
//! (`docs/background.md`): replay real traces, write a known
//! pattern into each allocation, verify it byte by byte when it is freed. An
//! allocator that hands the same block to two live objects, frees too much
//! or too little, or returns blocks outside the device is caught at the
//! first free (or final check) that touches the damage.
//!
//! # The pattern
//!
//! Block `i` of object `o` (blocks counted across the object's extents, in
//! order) in run `epoch` holds 8-byte little-endian words:
//!
//! * word 0: `o ^ ID0`, word 1: `i ^ ID1` — so that a block found in the
//!   wrong place names its writer;
//! * word `k ≥ 2`: `mix(seed(epoch, o, i) + k·φ)`, a cheap 64-bit mixer:
//!   every word of every block of every object differs.
//!
//! The epoch (one per engine run) keeps a run from ever accepting data left
//! by an earlier run on the same device.
//!
//! # I/O
//!
//! Positional I/O (`pwrite`/`pread` via [`FileExt`]), one call per extent
//! (split at [`IO_CHUNK`] bytes), no caching of ours. On a regular file the
//! kernel's page cache serves the reads back, so the reported throughput is
//! that of the page cache unless the device is larger than memory.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use blockalloc::{ErrorClass, Extent, Geometry};
use serde::Serialize;

/// Largest single read or write.
pub const IO_CHUNK: usize = 4 << 20;

const ID0: u64 = 0x6f62_6a65_6374_2121; // "object!!"
const ID1: u64 = 0x626c_6f63_6b23_2323; // "block###"
const PHI: u64 = 0x9E37_79B9_7F4A_7C15;

/// A cheap 64-bit mixer (the finaliser of SplitMix64).
#[inline(always)]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[inline]
fn block_seed(epoch: u64, object: u64, index: u64) -> u64 {
    mix(mix(object ^ epoch.wrapping_mul(PHI)).wrapping_add(index))
}

/// Fills `buf` (whole blocks) with the pattern of blocks `first_index..` of
/// `object`.
fn fill(buf: &mut [u8], block_size: usize, epoch: u64, object: u64, first_index: u64) {
    for (b, block) in buf.chunks_exact_mut(block_size).enumerate() {
        let index = first_index + b as u64;
        let seed = block_seed(epoch, object, index);
        let mut x = seed;
        for w in block.chunks_exact_mut(8) {
            x = x.wrapping_add(PHI);
            w.copy_from_slice(&mix(x).to_le_bytes());
        }
        block[0..8].copy_from_slice(&(object ^ ID0).to_le_bytes());
        block[8..16].copy_from_slice(&(index ^ ID1).to_le_bytes());
    }
}

/// What a mismatching block holds instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FoundData {
    /// The whole block is another (or the same) object's block, written in
    /// this run: the space was handed out twice, or freed and reused while
    /// live.
    Object {
        /// The object whose pattern is there.
        object: u64,
        /// Which of its blocks.
        block_index: u64,
    },
    /// The block is all zeros: never written (or zeroed by someone else).
    Zeros,
    /// Anything else: torn or foreign data.
    Unknown,
}

impl fmt::Display for FoundData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FoundData::Object {
                object,
                block_index,
            } => write!(
                f,
                "the block holds the data of object {object}'s block {block_index}: \
                 the space was given to both objects"
            ),
            FoundData::Zeros => f.write_str("the block is all zeros: it was never written"),
            FoundData::Unknown => f.write_str("the block holds data no object of this run wrote"),
        }
    }
}

/// The first wrong byte of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// The object being checked.
    pub object: u64,
    /// Which of the object's blocks (0-based, across its extents).
    pub block_index: u64,
    /// The block's number on the device.
    pub device_block: u64,
    /// Offset of the first wrong byte in the block.
    pub byte_offset: u64,
    /// Up to 16 bytes expected from there.
    pub expected: Vec<u8>,
    /// The bytes found there.
    pub found: Vec<u8>,
    /// Wrong bytes in this block.
    pub wrong_bytes: u64,
    /// Whose data the block holds.
    pub found_data: FoundData,
}

fn hex(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "object {} block {} (device block {}), byte {} of the block: expected {}, found {} \
             ({} wrong bytes in the block); {}",
            self.object,
            self.block_index,
            self.device_block,
            self.byte_offset,
            hex(&self.expected),
            hex(&self.found),
            self.wrong_bytes,
            self.found_data
        )
    }
}

/// Data verification failed, or the device could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// A byte of an object differs from its pattern: an allocator bug.
    #[error("data check failed: {0}")]
    Mismatch(Box<Mismatch>),
    /// The allocator handed out blocks beyond the end of the device.
    #[error("object {object} was given {extent}, beyond the device's {capacity} blocks")]
    OutOfDevice {
        /// The object.
        object: u64,
        /// The extent handed out.
        extent: Extent,
        /// Device size in blocks.
        capacity: u64,
    },
    /// The device is smaller than the capacity replayed.
    #[error("device {path} holds {size} bytes, less than the {needed} bytes replayed")]
    TooSmall {
        /// The device.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The capacity.
        needed: u64,
    },
    /// A device file cannot be made as long as the capacity replayed: the
    /// file system's largest file (or the largest file offset, 2^63 - 1
    /// bytes) is smaller.
    #[error(
        "device {path} cannot be made {needed} bytes long, the capacity replayed ({source}): \
         replay a smaller --capacity"
    )]
    TooLarge {
        /// The device.
        path: PathBuf,
        /// The capacity.
        needed: u64,
        /// Why the file system refused.
        source: io::Error,
    },
    /// Another process (or another handle in this one) writes the device:
    /// a blockalloc store or another replay holds its lock.
    #[error(
        "device {path} is in use by another writer (its lock is held); stop that writer first"
    )]
    Busy {
        /// The device.
        path: PathBuf,
    },
    /// I/O on the device failed.
    #[error("device {path}: {source}")]
    Io {
        /// The device.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

impl CheckError {
    /// What kind of failure this is: [`ErrorClass::Bug`] when the allocator
    /// is at fault ([`is_allocator_fault`](Self::is_allocator_fault)), else
    /// that of the device problem.
    pub fn class(&self) -> ErrorClass {
        match self {
            CheckError::Mismatch(_) | CheckError::OutOfDevice { .. } => ErrorClass::Bug,
            CheckError::TooSmall { .. } | CheckError::TooLarge { .. } => ErrorClass::InvalidInput,
            CheckError::Busy { .. } => ErrorClass::Busy,
            CheckError::Io { .. } => ErrorClass::Io,
        }
    }

    /// True when the allocator is at fault (a mismatch or an extent beyond
    /// the device), false for device problems.
    pub fn is_allocator_fault(&self) -> bool {
        self.class() == ErrorClass::Bug
    }
}

/// Data moved and checked by a [`PatternDevice`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct DataCheckStats {
    /// Objects written.
    pub objects_written: u64,
    /// Objects read back and checked.
    pub objects_checked: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Bytes read back and compared.
    pub bytes_checked: u64,
    /// Seconds spent writing (pattern generation included).
    pub write_secs: f64,
    /// Seconds spent reading and comparing.
    pub check_secs: f64,
    /// `bytes_written / write_secs` in MiB/s.
    pub write_mib_per_sec: f64,
    /// `bytes_checked / check_secs` in MiB/s.
    pub check_mib_per_sec: f64,
}

/// A device file carrying patterns; see the module documentation.
///
/// ```
/// use blockalloc::{Extent, Geometry};
/// use blockalloc_bench::PatternDevice;
///
/// let file = tempfile::tempfile()?;
/// let geo = Geometry::parse("1MiB", "4KiB")?;
/// let mut dev = PatternDevice::new(file, "scratch".into(), geo)?;
/// let a = [Extent::new(10, 4)?];
/// dev.write_object(7, &a)?;
/// dev.check_object(7, &a)?;
/// // Object 8 handed the same blocks: object 7's check now fails.
/// dev.write_object(8, &[Extent::new(12, 1)?])?;
/// let err = dev.check_object(7, &a).unwrap_err();
/// assert!(err.to_string().contains("object 7 block 2 (device block 12)"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct PatternDevice {
    file: File,
    path: PathBuf,
    block_size: usize,
    capacity: u64,
    epoch: u64,
    buf: Vec<u8>,
    expect: Vec<u8>,
    stats: DataCheckStats,
    write_time: Duration,
    check_time: Duration,
}

impl PatternDevice {
    /// Opens (creating it if missing) a device file for `geometry`. A
    /// regular file shorter than the capacity is extended (sparse); a block
    /// device must be large enough.
    ///
    /// # Errors
    /// [`CheckError::Io`], [`CheckError::TooSmall`].
    pub fn open(path: &Path, geometry: Geometry) -> Result<Self, CheckError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|source| CheckError::Io {
                path: path.into(),
                source,
            })?;
        Self::new(file, path.to_path_buf(), geometry)
    }

    /// Uses an open file (read and write) named `path` in messages.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn new(mut file: File, path: PathBuf, geometry: Geometry) -> Result<Self, CheckError> {
        let needed = geometry.capacity_bytes();
        let io = |source| CheckError::Io {
            path: path.clone(),
            source,
        };
        // The writer's lock, as a store takes it: patterns written over a
        // device in use would destroy its objects and its metadata.
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => return Err(CheckError::Busy { path }),
            Err(e) => return Err(io(e.into())),
        }
        let meta = file.metadata().map_err(io)?;
        let size = if meta.is_file() {
            meta.len()
        } else {
            file.seek(SeekFrom::End(0)).map_err(io)?
        };
        if size < needed {
            if meta.is_file() {
                file.set_len(needed).map_err(|source| {
                    // EFBIG from the file system; InvalidInput from the
                    // conversion to an offset beyond 2^63 - 1.
                    let source = if source.kind() == io::ErrorKind::InvalidInput {
                        io::Error::new(
                            io::ErrorKind::InvalidInput,
                            "more than the largest file offset, 2^63 - 1 bytes",
                        )
                    } else if source.raw_os_error() == Some(rustix::io::Errno::FBIG.raw_os_error())
                    {
                        source
                    } else {
                        return io(source);
                    };
                    CheckError::TooLarge {
                        path: path.clone(),
                        needed,
                        source,
                    }
                })?;
            } else {
                return Err(CheckError::TooSmall { path, size, needed });
            }
        }
        let block_size =
            usize::try_from(geometry.block_size()).expect("block sizes are at most 1 GiB");
        let buf_len = IO_CHUNK.max(block_size);
        Ok(PatternDevice {
            file,
            path,
            block_size,
            capacity: geometry.capacity_blocks(),
            epoch: 1,
            buf: vec![0; buf_len],
            expect: vec![0; buf_len],
            stats: DataCheckStats::default(),
            write_time: Duration::ZERO,
            check_time: Duration::ZERO,
        })
    }

    /// The device file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Starts a new run: a fresh epoch (so earlier runs' data never passes)
    /// and zeroed statistics.
    pub fn begin_run(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.stats = DataCheckStats::default();
        self.write_time = Duration::ZERO;
        self.check_time = Duration::ZERO;
    }

    /// Statistics since [`begin_run`](Self::begin_run).
    pub fn stats(&self) -> DataCheckStats {
        let mut s = self.stats;
        s.write_secs = self.write_time.as_secs_f64();
        s.check_secs = self.check_time.as_secs_f64();
        let rate = |bytes: u64, secs: f64| {
            if secs > 0.0 {
                bytes as f64 / (1 << 20) as f64 / secs
            } else {
                0.0
            }
        };
        s.write_mib_per_sec = rate(s.bytes_written, s.write_secs);
        s.check_mib_per_sec = rate(s.bytes_checked, s.check_secs);
        s
    }

    fn bounds(&self, object: u64, extents: &[Extent]) -> Result<(), CheckError> {
        match extents.iter().find(|e| e.end() > self.capacity) {
            Some(&extent) => Err(CheckError::OutOfDevice {
                object,
                extent,
                capacity: self.capacity,
            }),
            None => Ok(()),
        }
    }

    /// Visits `extents` in pieces of at most `IO_CHUNK` bytes:
    /// `(device block, object block index, blocks)`.
    fn pieces(
        &self,
        extents: &[Extent],
        mut f: impl FnMut(u64, u64, usize) -> Result<(), CheckError>,
    ) -> Result<(), CheckError> {
        // `self.buf` may be taken out by the caller: size from the constant.
        let per = (IO_CHUNK.max(self.block_size) / self.block_size) as u64;
        let mut index = 0u64;
        for e in extents {
            let mut start = e.start();
            while start < e.end() {
                let n = (e.end() - start).min(per);
                f(start, index, n as usize)?;
                start += n;
                index += n;
            }
        }
        Ok(())
    }

    /// Writes `object`'s pattern into its extents (in order: the object's
    /// blocks are counted across them).
    ///
    /// # Errors
    /// [`CheckError::OutOfDevice`], [`CheckError::Io`].
    pub fn write_object(&mut self, object: u64, extents: &[Extent]) -> Result<(), CheckError> {
        self.bounds(object, extents)?;
        let t = Instant::now();
        let mut buf = std::mem::take(&mut self.buf);
        let (bs, epoch) = (self.block_size, self.epoch);
        let r = self.pieces(extents, |block, index, n| {
            let len = n * bs;
            fill(&mut buf[..len], bs, epoch, object, index);
            self.file
                .write_all_at(&buf[..len], block * bs as u64)
                .map_err(|source| CheckError::Io {
                    path: self.path.clone(),
                    source,
                })
        });
        self.buf = buf;
        r?;
        self.write_time += t.elapsed();
        self.stats.objects_written += 1;
        self.stats.bytes_written += extents.iter().map(Extent::len).sum::<u64>() * bs as u64;
        Ok(())
    }

    /// Reads `object`'s extents back and compares every byte with its
    /// pattern.
    ///
    /// # Errors
    /// [`CheckError::Mismatch`] at the first wrong byte,
    /// [`CheckError::OutOfDevice`], [`CheckError::Io`].
    pub fn check_object(&mut self, object: u64, extents: &[Extent]) -> Result<(), CheckError> {
        self.bounds(object, extents)?;
        let t = Instant::now();
        let mut buf = std::mem::take(&mut self.buf);
        let mut expect = std::mem::take(&mut self.expect);
        let (bs, epoch) = (self.block_size, self.epoch);
        let r = self.pieces(extents, |block, index, n| {
            let len = n * bs;
            self.file
                .read_exact_at(&mut buf[..len], block * bs as u64)
                .map_err(|source| CheckError::Io {
                    path: self.path.clone(),
                    source,
                })?;
            fill(&mut expect[..len], bs, epoch, object, index);
            if buf[..len] == expect[..len] {
                return Ok(());
            }
            Err(CheckError::Mismatch(Box::new(describe(
                &buf[..len],
                &expect[..len],
                bs,
                epoch,
                object,
                block,
                index,
            ))))
        });
        self.buf = buf;
        self.expect = expect;
        r?;
        self.check_time += t.elapsed();
        self.stats.objects_checked += 1;
        self.stats.bytes_checked += extents.iter().map(Extent::len).sum::<u64>() * bs as u64;
        Ok(())
    }
}

/// Describes the first difference between `found` and `expected`, which
/// hold blocks `first_block..` of the device (`first_index..` of `object`).
fn describe(
    found: &[u8],
    expected: &[u8],
    bs: usize,
    epoch: u64,
    object: u64,
    first_block: u64,
    first_index: u64,
) -> Mismatch {
    let at = found
        .iter()
        .zip(expected)
        .position(|(a, b)| a != b)
        .expect("called only when the buffers differ");
    let b = at / bs;
    let off = at % bs;
    let block = b * bs..(b + 1) * bs;
    let (fb, eb) = (&found[block.clone()], &expected[block]);
    let end = (off + 16).min(bs);
    let wrong = fb.iter().zip(eb).filter(|(a, b)| a != b).count() as u64;
    Mismatch {
        object,
        block_index: first_index + b as u64,
        device_block: first_block + b as u64,
        byte_offset: off as u64,
        expected: eb[off..end].to_vec(),
        found: fb[off..end].to_vec(),
        wrong_bytes: wrong,
        found_data: identify(fb, bs, epoch),
    }
}

/// Whose pattern `block` is, if any.
fn identify(block: &[u8], bs: usize, epoch: u64) -> FoundData {
    if block.iter().all(|&x| x == 0) {
        return FoundData::Zeros;
    }
    let word = |i: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&block[i * 8..i * 8 + 8]);
        u64::from_le_bytes(a)
    };
    let (object, block_index) = (word(0) ^ ID0, word(1) ^ ID1);
    let mut want = vec![0u8; bs];
    fill(&mut want, bs, epoch, object, block_index);
    if want == block {
        FoundData::Object {
            object,
            block_index,
        }
    } else {
        FoundData::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(capacity: &str) -> PatternDevice {
        let geo = Geometry::parse(capacity, "4KiB").unwrap();
        PatternDevice::new(tempfile::tempfile().unwrap(), "t".into(), geo).unwrap()
    }

    fn ext(s: u64, n: u64) -> Extent {
        Extent::new(s, n).unwrap()
    }

    #[test]
    fn patterns_differ_everywhere() {
        let mut a = vec![0u8; 4096 * 2];
        let mut b = vec![0u8; 4096 * 2];
        fill(&mut a, 4096, 1, 5, 0);
        fill(&mut b, 4096, 1, 6, 0);
        let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
        assert!(same < 100, "{same} equal bytes");
        assert_ne!(a[..4096], a[4096..]);
        fill(&mut b, 4096, 2, 5, 0);
        assert_ne!(a[16..4096], b[16..4096], "the epoch changes the data");
    }

    #[test]
    fn a_device_held_by_a_writer_is_busy_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        std::fs::write(&path, vec![0x77u8; 8192]).unwrap();
        let writer = File::open(&path).unwrap();
        rustix::fs::flock(&writer, rustix::fs::FlockOperation::LockExclusive).unwrap();
        let geo = Geometry::parse("64MiB", "4KiB").unwrap();
        let Err(e) = PatternDevice::open(&path, geo) else {
            panic!("a device held by a writer opened");
        };
        assert!(matches!(e, CheckError::Busy { .. }), "{e}");
        assert!(e.to_string().contains("in use"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), vec![0x77u8; 8192]);
        drop(writer);
        let d = PatternDevice::open(&path, geo).unwrap();
        assert_eq!(d.path(), path.as_path());
    }

    #[test]
    fn scattered_objects_round_trip() {
        let mut d = device("64MiB");
        let parts = [ext(3000, 3), ext(7, 2000), ext(5000, 1)];
        d.write_object(42, &parts).unwrap();
        d.check_object(42, &parts).unwrap();
        let s = d.stats();
        assert_eq!(s.bytes_written, 2004 * 4096);
        assert_eq!((s.objects_written, s.objects_checked), (1, 1));
        // The same blocks in another order are different object blocks.
        let swapped = [ext(7, 2000), ext(3000, 3), ext(5000, 1)];
        let e = d.check_object(42, &swapped).unwrap_err();
        match e {
            CheckError::Mismatch(m) => {
                assert_eq!((m.block_index, m.device_block), (0, 7));
                assert_eq!(
                    m.found_data,
                    FoundData::Object {
                        object: 42,
                        block_index: 3
                    }
                );
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn finds_overwrites_zeros_and_noise() {
        let mut d = device("1MiB");
        d.write_object(1, &[ext(0, 4)]).unwrap();
        d.write_object(2, &[ext(3, 2)]).unwrap();
        let e = d.check_object(1, &[ext(0, 4)]).unwrap_err().to_string();
        assert!(
            e.contains("object 1 block 3 (device block 3), byte 0 of the block"),
            "{e}"
        );
        assert!(e.contains("object 2's block 0"), "{e}");
        let e = d.check_object(9, &[ext(10, 1)]).unwrap_err().to_string();
        assert!(e.contains("all zeros"), "{e}");
        d.file.write_all_at(&[0xAA], 4 * 4096 + 100).unwrap();
        let e = d.check_object(2, &[ext(3, 2)]).unwrap_err();
        let CheckError::Mismatch(m) = e else { panic!() };
        assert_eq!((m.block_index, m.byte_offset, m.wrong_bytes), (1, 100, 1));
        assert_eq!(m.found[0], 0xAA);
        assert_eq!(m.found_data, FoundData::Unknown);
        let e = d.write_object(3, &[ext(250, 10)]).unwrap_err();
        assert!(matches!(e, CheckError::OutOfDevice { capacity: 256, .. }));
        assert!(e.is_allocator_fault());
    }

    #[test]
    fn a_new_epoch_rejects_old_data() {
        let mut d = device("1MiB");
        d.write_object(1, &[ext(0, 1)]).unwrap();
        d.begin_run(2);
        assert!(d.check_object(1, &[ext(0, 1)]).is_err());
    }
}
