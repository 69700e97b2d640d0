//! The binary trace format: [`TraceWriter`] and [`TraceReader`].
//!
//! Built for streams of tens of millions of operations: both sides stream
//! (one chunk of at most [`MAX_CHUNK_PAYLOAD`] bytes in memory), operations
//! take 2–4 bytes each, and every chunk carries a CRC-32C so that damage is
//! a [`TraceError::Corrupt`] naming its byte offset, never a wrong replay.
//!
//! # Layout (all integers little-endian)
//!
//! **Header**
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `BLKTRACE` |
//! | 8 | 2 | format version, [`VERSION`] |
//! | 10 | 2 | flags, 0 (readers refuse others) |
//! | 12 | 4 | block size in bytes, 0 = unknown |
//! | 16 | 8 | capacity in bytes, 0 = unknown |
//! | 24 | 4 | `M`: metadata length, at most [`MAX_META`] |
//! | 28 | M | metadata: UTF-8 lines `key=value\n` |
//! | 28+M | 4 | CRC-32C of bytes `0 .. 28+M` |
//!
//! **Chunks**, one after another:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | `L`: payload length, 1 ..= [`MAX_CHUNK_PAYLOAD`] |
//! | 4 | 4 | `N`: operations in the payload, 1 ..= `L` |
//! | 8 | 4 | CRC-32C of `L`, `N` (their 8 bytes) and the payload |
//! | 12 | L | `N` encoded operations |
//!
//! **End** (44 bytes): a chunk head with `L = 0, N = 0`, then the totals —
//! operations, allocations, frees, round markers (4 × u64) — and a CRC-32C of
//! the 40 bytes before it. Nothing may follow. A file without an end is
//! [`TraceError::Truncated`]; totals that disagree with the chunks are
//! [`TraceError::Corrupt`].
//!
//! **Operations.** One tag byte: bits 0–1 the kind (0 alloc, 1 free, 2 round
//! end; 3 is invalid), bits 2–7 a small number `s`.
//!
//! * Alloc and free carry the object id as a delta from the previous
//!   operation's id in the same chunk (0 at a chunk's start), wrapping,
//!   zigzag-encoded: `s = 1..=63` stores zigzag values 0..=62 in the tag;
//!   `s = 0` means a LEB128 varint follows. Sequential ids (`+1`) cost no
//!   extra byte.
//! * Alloc then carries its size as a LEB128 varint `v`: `v = n << 1 | 1`
//!   for `n` whole blocks of the header's block size, `v = bytes << 1`
//!   otherwise.
//! * Round end stores its phase in `s` (0..=63).
//!
//! Each chunk decodes on its own (the delta base restarts), so a reader can
//! name the damaged chunk and a future reader could seek.

use std::io::{self, Read, Write};

use crate::error::TraceError;
use crate::op::{step_item, TraceHeader, TraceOp, MAX_PHASE};

/// The first 8 bytes of every binary trace.
pub const MAGIC: [u8; 8] = *b"BLKTRACE";
/// The version this build writes and reads.
pub const VERSION: u16 = 1;
/// Longest metadata section accepted.
pub const MAX_META: u32 = 1 << 20;
/// Writers close a chunk once its payload reaches this size.
pub const CHUNK_TARGET: usize = 64 << 10;
/// Longest chunk payload a reader accepts.
pub const MAX_CHUNK_PAYLOAD: u32 = 1 << 20;

const HEADER_FIXED: usize = 28;
const CHUNK_HEAD: usize = 12;
/// Chunk head (12) + totals (32) … with its CRC replacing the chunk CRC: the
/// end is `0u32, 0u32, 4 × u64, crc`.
const END_LEN: usize = 8 + 32 + 4;
/// Longest encoded operation: tag + 10-byte varint id + 10-byte varint size.
const MAX_OP_LEN: usize = 21;

const KIND_ALLOC: u8 = 0;
const KIND_FREE: u8 = 1;
const KIND_ROUND: u8 = 2;

/// Operation counts kept by writers and checked by readers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// All operations, round markers included.
    pub ops: u64,
    /// Allocations.
    pub allocs: u64,
    /// Frees.
    pub frees: u64,
    /// Round markers.
    pub rounds: u64,
}

impl Totals {
    fn count(&mut self, op: &TraceOp) {
        self.ops += 1;
        match op {
            TraceOp::Alloc { .. } => self.allocs += 1,
            TraceOp::Free { .. } => self.frees += 1,
            TraceOp::RoundEnd { .. } => self.rounds += 1,
        }
    }
}

fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Writes a binary trace, one chunk at a time.
///
/// Call [`finish`](Self::finish) at the end: a trace dropped without it has
/// no end marker, and readers report it as truncated — which is what an
/// interrupted recording is.
///
/// ```
/// use blockalloc_trace::{TraceHeader, TraceOp, TraceReader, TraceWriter};
///
/// let header = TraceHeader { block_size: Some(4096), ..TraceHeader::default() };
/// let mut w = TraceWriter::new(Vec::new(), &header)?;
/// w.write(TraceOp::Alloc { object: 0, bytes: 8192 })?;
/// w.write(TraceOp::Free { object: 0 })?;
/// let bytes = w.finish()?;
///
/// let r = TraceReader::new(&bytes[..])?;
/// assert_eq!(r.header().block_size, Some(4096));
/// let ops: Vec<TraceOp> = r.collect::<Result<_, _>>()?;
/// assert_eq!(ops.len(), 2);
/// # Ok::<(), blockalloc_trace::TraceError>(())
/// ```
#[derive(Debug)]
pub struct TraceWriter<W: Write> {
    out: W,
    payload: Vec<u8>,
    chunk_ops: u32,
    prev_object: u64,
    /// Block size for the compact size encoding, 0 when unknown.
    unit: u64,
    totals: Totals,
}

impl<W: Write> TraceWriter<W> {
    /// Writes the header to `out` and returns a writer for the operations.
    /// Wrap files in a `BufWriter`: the writer issues small writes.
    ///
    /// # Errors
    /// [`TraceError::BadHeader`] for a header that cannot be written,
    /// [`TraceError::Io`] when `out` fails.
    pub fn new(mut out: W, header: &TraceHeader) -> Result<Self, TraceError> {
        header.validate()?;
        let mut meta = String::new();
        for (k, v) in &header.meta {
            meta.push_str(k);
            meta.push('=');
            meta.push_str(v);
            meta.push('\n');
        }
        if meta.len() > MAX_META as usize {
            return Err(TraceError::BadHeader(format!(
                "metadata of {} bytes is longer than {MAX_META}",
                meta.len()
            )));
        }
        let block_size = header.block_size.unwrap_or(0);
        let mut h = Vec::with_capacity(HEADER_FIXED + meta.len() + 4);
        h.extend_from_slice(&MAGIC);
        h.extend_from_slice(&VERSION.to_le_bytes());
        h.extend_from_slice(&0u16.to_le_bytes());
        // validate() bounds the block size to 1 GiB.
        h.extend_from_slice(&(block_size as u32).to_le_bytes());
        h.extend_from_slice(&header.capacity_bytes.unwrap_or(0).to_le_bytes());
        h.extend_from_slice(&(meta.len() as u32).to_le_bytes());
        h.extend_from_slice(meta.as_bytes());
        let crc = crc32c::crc32c(&h);
        h.extend_from_slice(&crc.to_le_bytes());
        out.write_all(&h).map_err(|e| TraceError::io(None, e))?;
        Ok(TraceWriter {
            out,
            payload: Vec::with_capacity(CHUNK_TARGET + MAX_OP_LEN),
            chunk_ops: 0,
            prev_object: 0,
            unit: block_size,
            totals: Totals::default(),
        })
    }

    /// Appends one operation.
    ///
    /// # Errors
    /// [`TraceError::Unencodable`] for a phase above
    /// [`MAX_PHASE`] or a size of 2^63 bytes or more;
    /// [`TraceError::Io`].
    pub fn write(&mut self, op: TraceOp) -> Result<(), TraceError> {
        match op {
            TraceOp::Alloc { object, bytes } => {
                let v = if self.unit != 0 && bytes != 0 && bytes % self.unit == 0 {
                    (bytes / self.unit) << 1 | 1
                } else if bytes < 1 << 63 {
                    bytes << 1
                } else {
                    return Err(TraceError::Unencodable(format!(
                        "an object of {bytes} bytes"
                    )));
                };
                self.put_object(KIND_ALLOC, object);
                put_varint(&mut self.payload, v);
            }
            TraceOp::Free { object } => self.put_object(KIND_FREE, object),
            TraceOp::RoundEnd { phase } => {
                if phase > MAX_PHASE {
                    return Err(TraceError::Unencodable(format!(
                        "phase {phase} (at most {MAX_PHASE})"
                    )));
                }
                self.payload.push(KIND_ROUND | phase << 2);
            }
        }
        self.totals.count(&op);
        self.chunk_ops += 1;
        if self.payload.len() >= CHUNK_TARGET {
            self.flush_chunk()?;
        }
        Ok(())
    }

    fn put_object(&mut self, kind: u8, object: u64) {
        let z = zigzag(object.wrapping_sub(self.prev_object) as i64);
        self.prev_object = object;
        if z < 63 {
            self.payload.push(kind | ((z as u8 + 1) << 2));
        } else {
            self.payload.push(kind);
            put_varint(&mut self.payload, z);
        }
    }

    fn flush_chunk(&mut self) -> Result<(), TraceError> {
        if self.chunk_ops == 0 {
            return Ok(());
        }
        let mut head = [0u8; CHUNK_HEAD];
        head[0..4].copy_from_slice(&(self.payload.len() as u32).to_le_bytes());
        head[4..8].copy_from_slice(&self.chunk_ops.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&head[0..8]), &self.payload);
        head[8..12].copy_from_slice(&crc.to_le_bytes());
        self.out
            .write_all(&head)
            .and_then(|()| self.out.write_all(&self.payload))
            .map_err(|e| TraceError::io(None, e))?;
        self.payload.clear();
        self.chunk_ops = 0;
        self.prev_object = 0;
        Ok(())
    }

    /// Counts of what was written so far.
    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// Writes the last chunk and the end marker, flushes, and returns the
    /// output.
    ///
    /// # Errors
    /// [`TraceError::Io`].
    pub fn finish(mut self) -> Result<W, TraceError> {
        self.flush_chunk()?;
        let t = self.totals;
        let mut end = Vec::with_capacity(END_LEN);
        end.extend_from_slice(&[0u8; 8]);
        for v in [t.ops, t.allocs, t.frees, t.rounds] {
            end.extend_from_slice(&v.to_le_bytes());
        }
        let crc = crc32c::crc32c(&end);
        end.extend_from_slice(&crc.to_le_bytes());
        self.out
            .write_all(&end)
            .and_then(|()| self.out.flush())
            .map_err(|e| TraceError::io(None, e))?;
        Ok(self.out)
    }
}

/// Reads a binary trace as a stream of operations.
///
/// The reader holds one chunk at a time. It yields `Err` once, for the first
/// problem found, and then ends.
#[derive(Debug)]
pub struct TraceReader<R: Read> {
    input: R,
    header: TraceHeader,
    payload: Vec<u8>,
    pos: usize,
    chunk_left: u32,
    /// File offset of `payload[0]`.
    payload_offset: u64,
    /// File offset of the next byte `input` will give.
    offset: u64,
    prev_object: u64,
    unit: u64,
    totals: Totals,
    done: bool,
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` at a clean EOF before the
/// first byte; `Truncated` at an EOF inside.
fn read_full<R: Read>(
    input: &mut R,
    buf: &mut [u8],
    offset: u64,
    what: &'static str,
) -> Result<bool, TraceError> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                return Err(TraceError::Truncated {
                    offset: offset + got as u64,
                    what,
                })
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(TraceError::io(None, e)),
        }
    }
    Ok(true)
}

fn read_exact_or_truncated<R: Read>(
    input: &mut R,
    buf: &mut [u8],
    offset: u64,
    what: &'static str,
) -> Result<(), TraceError> {
    if buf.is_empty() || read_full(input, buf, offset, what)? {
        Ok(())
    } else {
        Err(TraceError::Truncated { offset, what })
    }
}

fn le_u16(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

impl<R: Read> TraceReader<R> {
    /// Reads and checks the header. Wrap files in a `BufReader`.
    ///
    /// # Errors
    /// [`TraceError::Corrupt`] for a wrong magic, flags or header checksum,
    /// [`TraceError::UnsupportedVersion`], [`TraceError::Truncated`],
    /// [`TraceError::Io`].
    pub fn new(mut input: R) -> Result<Self, TraceError> {
        let mut fixed = [0u8; HEADER_FIXED];
        read_exact_or_truncated(&mut input, &mut fixed, 0, "header")?;
        if fixed[0..8] != MAGIC {
            return Err(TraceError::Corrupt {
                offset: 0,
                what: "not a binary blockalloc trace (bad magic)".into(),
            });
        }
        let version = le_u16(&fixed[8..]);
        if version != VERSION {
            return Err(TraceError::UnsupportedVersion {
                version,
                supported: VERSION,
            });
        }
        let meta_len = le_u32(&fixed[24..]);
        if meta_len > MAX_META {
            return Err(TraceError::Corrupt {
                offset: 24,
                what: format!("metadata length {meta_len} is above {MAX_META}"),
            });
        }
        let mut rest = vec![0u8; meta_len as usize + 4];
        read_exact_or_truncated(&mut input, &mut rest, HEADER_FIXED as u64, "header")?;
        let (meta, crc) = rest.split_at(meta_len as usize);
        let want = crc32c::crc32c_append(crc32c::crc32c(&fixed), meta);
        if want != le_u32(crc) {
            return Err(TraceError::Corrupt {
                offset: 0,
                what: "header checksum mismatch".into(),
            });
        }
        let flags = le_u16(&fixed[10..]);
        if flags != 0 {
            return Err(TraceError::Corrupt {
                offset: 10,
                what: format!("unknown header flags {flags:#06x}"),
            });
        }
        let block_size = u64::from(le_u32(&fixed[12..]));
        let capacity = le_u64(&fixed[16..]);
        let bad_meta = |what: String| TraceError::Corrupt {
            offset: HEADER_FIXED as u64,
            what,
        };
        let text =
            std::str::from_utf8(meta).map_err(|_| bad_meta("metadata is not UTF-8".into()))?;
        let mut pairs = Vec::new();
        for line in text.lines() {
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| bad_meta(format!("metadata line {line:?} has no '='")))?;
            pairs.push((k.to_string(), v.to_string()));
        }
        let header = TraceHeader {
            block_size: (block_size != 0).then_some(block_size),
            capacity_bytes: (capacity != 0).then_some(capacity),
            meta: pairs,
        };
        header.validate().map_err(|e| bad_meta(e.to_string()))?;
        Ok(TraceReader {
            input,
            header,
            payload: Vec::new(),
            pos: 0,
            chunk_left: 0,
            payload_offset: 0,
            offset: (HEADER_FIXED + meta_len as usize + 4) as u64,
            prev_object: 0,
            unit: block_size,
            totals: Totals::default(),
            done: false,
        })
    }

    /// The header.
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// Counts of the operations read so far.
    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// Byte offset of the next operation (or chunk).
    pub fn offset(&self) -> u64 {
        if self.chunk_left > 0 {
            self.payload_offset + self.pos as u64
        } else {
            self.offset
        }
    }

    fn corrupt(&self, at: usize, what: impl Into<String>) -> TraceError {
        TraceError::Corrupt {
            offset: self.payload_offset + at as u64,
            what: what.into(),
        }
    }

    /// Reads the next chunk head and payload; `Ok(false)` at the end marker.
    fn next_chunk(&mut self) -> Result<bool, TraceError> {
        if self.pos != self.payload.len() {
            return Err(self.corrupt(self.pos, "bytes left over after the chunk's operations"));
        }
        let start = self.offset;
        let mut head = [0u8; CHUNK_HEAD];
        if !read_full(&mut self.input, &mut head, start, "chunk header")? {
            return Err(TraceError::Truncated {
                offset: start,
                what: "end marker missing (interrupted writer?)",
            });
        }
        let (len, ops) = (le_u32(&head[0..]), le_u32(&head[4..]));
        if len == 0 && ops == 0 {
            self.read_end(start, head)?;
            return Ok(false);
        }
        let corrupt = |what: String| TraceError::Corrupt {
            offset: start,
            what,
        };
        if len > MAX_CHUNK_PAYLOAD {
            return Err(corrupt(format!(
                "chunk length {len} is above {MAX_CHUNK_PAYLOAD}"
            )));
        }
        if ops == 0 || ops > len {
            return Err(corrupt(format!(
                "chunk of {len} bytes claims {ops} operations"
            )));
        }
        self.payload.resize(len as usize, 0);
        let payload_offset = start + CHUNK_HEAD as u64;
        read_exact_or_truncated(&mut self.input, &mut self.payload, payload_offset, "chunk")?;
        let crc = crc32c::crc32c_append(crc32c::crc32c(&head[0..8]), &self.payload);
        if crc != le_u32(&head[8..]) {
            return Err(corrupt("chunk checksum mismatch".into()));
        }
        self.offset = payload_offset + u64::from(len);
        self.payload_offset = payload_offset;
        self.pos = 0;
        self.chunk_left = ops;
        self.prev_object = 0;
        Ok(true)
    }

    fn read_end(&mut self, start: u64, head: [u8; CHUNK_HEAD]) -> Result<(), TraceError> {
        let mut end = [0u8; END_LEN];
        end[..CHUNK_HEAD].copy_from_slice(&head);
        read_exact_or_truncated(
            &mut self.input,
            &mut end[CHUNK_HEAD..],
            start + CHUNK_HEAD as u64,
            "end marker",
        )?;
        let corrupt = |what: &str| TraceError::Corrupt {
            offset: start,
            what: what.to_string(),
        };
        if crc32c::crc32c(&end[..END_LEN - 4]) != le_u32(&end[END_LEN - 4..]) {
            return Err(corrupt("end marker checksum mismatch"));
        }
        let t = Totals {
            ops: le_u64(&end[8..]),
            allocs: le_u64(&end[16..]),
            frees: le_u64(&end[24..]),
            rounds: le_u64(&end[32..]),
        };
        if t != self.totals {
            return Err(corrupt(&format!(
                "the end marker counts {} operations ({} allocs, {} frees, {} round markers) \
                 but the chunks hold {} ({} allocs, {} frees, {} round markers)",
                t.ops,
                t.allocs,
                t.frees,
                t.rounds,
                self.totals.ops,
                self.totals.allocs,
                self.totals.frees,
                self.totals.rounds
            )));
        }
        let mut extra = [0u8; 1];
        if read_full(&mut self.input, &mut extra, start + END_LEN as u64, "")? {
            return Err(TraceError::Corrupt {
                offset: start + END_LEN as u64,
                what: "data after the end marker".into(),
            });
        }
        self.offset = start + END_LEN as u64;
        Ok(())
    }

    fn varint(&mut self) -> Result<u64, TraceError> {
        let at = self.pos;
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.payload.get(self.pos) else {
                return Err(self.corrupt(at, "varint runs past the chunk"));
            };
            self.pos += 1;
            if shift == 63 && b > 1 {
                return Err(self.corrupt(at, "varint overflows 64 bits"));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.corrupt(at, "varint longer than 10 bytes"))
    }

    fn object(&mut self, small: u8) -> Result<u64, TraceError> {
        let z = if small == 0 {
            self.varint()?
        } else {
            u64::from(small - 1)
        };
        let object = self.prev_object.wrapping_add(unzigzag(z) as u64);
        self.prev_object = object;
        Ok(object)
    }

    fn decode(&mut self) -> Result<TraceOp, TraceError> {
        let at = self.pos;
        let Some(&tag) = self.payload.get(at) else {
            return Err(self.corrupt(at, "fewer operations than the chunk header says"));
        };
        self.pos += 1;
        let small = tag >> 2;
        Ok(match tag & 3 {
            KIND_ALLOC => {
                let object = self.object(small)?;
                let v = self.varint()?;
                let bytes = if v & 1 == 1 {
                    if self.unit == 0 {
                        return Err(
                            self.corrupt(at, "size in blocks, but the header has no block size")
                        );
                    }
                    (v >> 1)
                        .checked_mul(self.unit)
                        .ok_or_else(|| self.corrupt(at, "object size overflows 64 bits"))?
                } else {
                    v >> 1
                };
                TraceOp::Alloc { object, bytes }
            }
            KIND_FREE => TraceOp::Free {
                object: self.object(small)?,
            },
            KIND_ROUND => TraceOp::RoundEnd { phase: small },
            _ => return Err(self.corrupt(at, format!("unknown operation tag {tag:#04x}"))),
        })
    }

    fn step(&mut self) -> Result<Option<TraceOp>, TraceError> {
        if self.chunk_left == 0 && !self.next_chunk()? {
            return Ok(None);
        }
        let op = self.decode()?;
        self.chunk_left -= 1;
        self.totals.count(&op);
        Ok(Some(op))
    }
}

impl<R: Read> Iterator for TraceReader<R> {
    type Item = Result<TraceOp, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        step_item(self.step(), &mut self.done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> TraceHeader {
        let mut h = TraceHeader {
            block_size: Some(4096),
            capacity_bytes: Some(1 << 30),
            meta: Vec::new(),
        };
        h.set("workload", "test");
        h
    }

    fn encode(ops: &[TraceOp]) -> Vec<u8> {
        let mut w = TraceWriter::new(Vec::new(), &header()).unwrap();
        for &op in ops {
            w.write(op).unwrap();
        }
        w.finish().unwrap()
    }

    fn decode(bytes: &[u8]) -> Result<Vec<TraceOp>, TraceError> {
        TraceReader::new(bytes)?.collect()
    }

    #[test]
    fn zigzag_round_trips() {
        for d in [0i64, 1, -1, 62, -62, i64::MAX, i64::MIN, 12345, -99999] {
            assert_eq!(unzigzag(zigzag(d)), d);
        }
        assert_eq!(zigzag(1), 2);
        assert_eq!(zigzag(-1), 1);
    }

    #[test]
    fn edge_values_round_trip() {
        let ops = vec![
            TraceOp::Alloc {
                object: 0,
                bytes: 0,
            },
            TraceOp::Alloc {
                object: u64::MAX,
                bytes: (1 << 63) - 1,
            },
            TraceOp::Alloc {
                object: 1,
                bytes: 4096 * 1000,
            },
            TraceOp::Alloc {
                object: 2,
                bytes: 4095,
            },
            TraceOp::Free { object: u64::MAX },
            TraceOp::RoundEnd { phase: 0 },
            TraceOp::RoundEnd { phase: 63 },
            TraceOp::Free { object: 0 },
        ];
        let bytes = encode(&ops);
        assert_eq!(decode(&bytes).unwrap(), ops);
        let r = TraceReader::new(&bytes[..]).unwrap();
        assert_eq!(r.header(), &header());
    }

    #[test]
    fn sequential_allocations_are_compact() {
        let ops: Vec<TraceOp> = (0..100_000u64)
            .map(|i| TraceOp::Alloc {
                object: i,
                bytes: 4096 * (1 + i % 1024),
            })
            .collect();
        let bytes = encode(&ops);
        assert!(bytes.len() < 100_000 * 4, "{} bytes", bytes.len());
        assert!(bytes.len() > CHUNK_TARGET * 2, "several chunks");
        assert_eq!(decode(&bytes).unwrap(), ops);
    }

    #[test]
    fn refuses_unencodable_values() {
        let mut w = TraceWriter::new(Vec::new(), &TraceHeader::default()).unwrap();
        assert!(w
            .write(TraceOp::Alloc {
                object: 0,
                bytes: 1 << 63
            })
            .is_err());
        assert!(w.write(TraceOp::RoundEnd { phase: 64 }).is_err());
        assert_eq!(w.totals().ops, 0);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let ops: Vec<TraceOp> = (0..3000u64)
            .map(|i| TraceOp::Alloc {
                object: i,
                bytes: i,
            })
            .collect();
        let bytes = encode(&ops);
        for cut in (0..bytes.len()).step_by(97).chain([bytes.len() - 1]) {
            let e = decode(&bytes[..cut]).unwrap_err();
            assert!(
                matches!(e, TraceError::Truncated { .. }),
                "cut at {cut}: {e}"
            );
        }
    }

    #[test]
    fn every_flipped_byte_is_an_error() {
        let ops: Vec<TraceOp> = (0..500u64)
            .flat_map(|i| {
                [
                    TraceOp::Alloc {
                        object: i,
                        bytes: i * 100,
                    },
                    TraceOp::Free { object: i },
                ]
            })
            .collect();
        let bytes = encode(&ops);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            let e = decode(&bad).expect_err("flipped byte accepted");
            assert!(e.is_bad_data(), "byte {i}: {e}");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(matches!(
            decode(&extra),
            Err(TraceError::Corrupt { what, .. }) if what.contains("after the end")
        ));
    }

    #[test]
    fn corrupt_chunk_names_its_offset() {
        let bytes = encode(&[TraceOp::Free { object: 7 }]);
        let header_len = HEADER_FIXED + "workload=test\n".len() + 4;
        let mut bad = bytes.clone();
        bad[header_len + CHUNK_HEAD] ^= 0xff;
        match decode(&bad) {
            Err(TraceError::Corrupt { offset, what }) => {
                assert_eq!(offset, header_len as u64);
                assert!(what.contains("checksum"), "{what}");
            }
            other => panic!("{other:?}"),
        }
        let mut v2 = bytes;
        v2[8] = 2;
        assert!(matches!(
            decode(&v2),
            Err(TraceError::UnsupportedVersion { version: 2, .. })
        ));
    }
}
