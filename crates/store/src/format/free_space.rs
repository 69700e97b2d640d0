//! The checkpoint payload: a free list as bytes, in one of two encodings.
//!
//! * **List** ([`Encoding::List`]): per free extent in address order, two
//!   LEB128 varints: the gap from the end of the previous extent (from block
//!   0 for the first), then the length in blocks. 2 to 20 bytes per extent;
//!   a few bytes for a nearly empty device, but unbounded relative to the
//!   device: free space shattered to one free block in two costs about one
//!   byte per block.
//! * **Chunked** ([`Encoding::Chunked`]): the device, from block 0, in
//!   chunks of [`CHUNK_BLOCKS`] blocks (the last one shorter), one record
//!   per chunk, in order. A record is one kind byte, then
//!   - [`CHUNK_LIST`]: a varint count `n`, then `n` extents as in the list
//!     encoding, clipped to the chunk, the first gap counted from the
//!     chunk's first block;
//!   - [`CHUNK_BITMAP`]: `ceil(chunk blocks / 8)` bytes, bit `i` (byte
//!     `i / 8`, bit `i % 8`, least significant first) set when the chunk's
//!     block `i` is free; bits past the device's end are zero.
//!
//!   The writer picks, per chunk, the smaller record (the list on a tie), so
//!   a record never exceeds `1 + 4096` bytes and the whole payload never
//!   exceeds [`max_payload_len`] `= chunks + ceil(capacity_blocks / 8)`
//!   bytes, whatever the free space looks like.
//!
//! The writer measures both encodings without building either
//! ([`measure`]) and writes the smaller one (the list on a tie) straight into
//! the checkpoint's buffer, so the bytes written and the memory used follow
//! the content: a nearly empty device writes a few bytes, never the bound.
//!
//! Decoding validates everything a checksum cannot vouch for: extents are
//! non-empty, in order, maximal (no two touch; in the chunked form, pieces
//! that meet at a chunk boundary are one extent and are merged), inside the
//! data area `[meta_blocks, capacity_blocks)`, and every byte is consumed.

use blockalloc::Extent;

use super::{bad, get_varint, DecodeError, Layout, PAGE};

/// Blocks per chunk of the chunked encoding: a bitmap of one 4096-byte page.
pub const CHUNK_BLOCKS: u64 = 8 * PAGE;
/// Kind byte of a chunk record holding an extent list.
pub const CHUNK_LIST: u8 = 0;
/// Kind byte of a chunk record holding a bitmap.
pub const CHUNK_BITMAP: u8 = 1;

/// How a checkpoint payload encodes its free list; the checkpoint header's
/// flags say which.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// Every free extent as two varints.
    List,
    /// Per chunk of [`CHUNK_BLOCKS`] blocks, an extent list or a bitmap.
    Chunked,
}

/// The sizes of both encodings of one free list, measured without building
/// either.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    /// Bytes of the list encoding.
    pub list: u64,
    /// Bytes of the chunked encoding.
    pub chunked: u64,
    /// Free extents.
    pub extents: u64,
    /// Free blocks.
    pub free_blocks: u64,
}

impl Sizes {
    /// The encoding the writer uses: the smaller one, the list on a tie.
    pub fn best(&self) -> Encoding {
        if self.list <= self.chunked {
            Encoding::List
        } else {
            Encoding::Chunked
        }
    }

    /// Bytes of `encoding`.
    pub fn len(&self, encoding: Encoding) -> u64 {
        match encoding {
            Encoding::List => self.list,
            Encoding::Chunked => self.chunked,
        }
    }
}

/// Chunks of the chunked encoding on a device of `capacity_blocks` blocks.
pub fn chunks(capacity_blocks: u64) -> u64 {
    capacity_blocks.div_ceil(CHUNK_BLOCKS)
}

/// The largest payload the writer produces for a device of
/// `capacity_blocks` blocks, whatever its free space: one kind byte per
/// chunk plus one bit per block.
pub fn max_payload_len(capacity_blocks: u64) -> u64 {
    chunks(capacity_blocks) + capacity_blocks.div_ceil(8)
}

fn varint_len(v: u64) -> u64 {
    (64 - u64::from(v.leading_zeros())).div_ceil(7).max(1)
}

/// One chunk and the free extents that overlap it (unclipped).
struct Chunk<'a> {
    start: u64,
    end: u64,
    overlapping: &'a [Extent],
}

impl Chunk<'_> {
    /// The free pieces inside the chunk, as `(start, end)`.
    fn pieces(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.overlapping
            .iter()
            .map(|e| (e.start().max(self.start), e.end().min(self.end)))
    }

    fn bitmap_bytes(&self) -> u64 {
        (self.end - self.start).div_ceil(8)
    }

    /// The record the writer uses and its length: the list unless the
    /// bitmap is shorter. Stops counting the list once it is longer, so a
    /// shattered chunk costs a few thousand pieces, not all of them.
    fn record(&self) -> (u8, u64) {
        let bitmap = 1 + self.bitmap_bytes();
        let mut list = 1 + varint_len(self.overlapping.len() as u64);
        let mut prev = self.start;
        for (s, e) in self.pieces() {
            list += varint_len(s - prev) + varint_len(e - s);
            if list > bitmap {
                return (CHUNK_BITMAP, bitmap);
            }
            prev = e;
        }
        (CHUNK_LIST, list)
    }
}

/// The chunks of a device, each with the free extents overlapping it.
fn walk_chunks(free: &[Extent], capacity_blocks: u64) -> impl Iterator<Item = Chunk<'_>> {
    let mut i = 0;
    (0..chunks(capacity_blocks)).map(move |k| {
        let start = k * CHUNK_BLOCKS;
        let end = (start + CHUNK_BLOCKS).min(capacity_blocks);
        let mut j = i;
        while j < free.len() && free[j].start() < end {
            j += 1;
        }
        let chunk = Chunk {
            start,
            end,
            overlapping: &free[i..j],
        };
        // An extent running past this chunk is also the next chunk's first.
        i = if j > i && free[j - 1].end() > end {
            j - 1
        } else {
            j
        };
        chunk
    })
}

/// Measures both encodings of `free` (address order, maximal extents, all
/// below `capacity_blocks`).
pub fn measure(free: &[Extent], capacity_blocks: u64) -> Sizes {
    let (mut list, mut prev, mut free_blocks) = (0u64, 0u64, 0u64);
    for e in free {
        debug_assert!(e.start() >= prev && e.end() <= capacity_blocks);
        list += varint_len(e.start() - prev) + varint_len(e.len());
        prev = e.end();
        free_blocks += e.len();
    }
    let chunked = walk_chunks(free, capacity_blocks)
        .map(|c| c.record().1)
        .sum();
    Sizes {
        list,
        chunked,
        extents: free.len() as u64,
        free_blocks,
    }
}

/// Writes `free` in `encoding` into `out`, which must be exactly
/// [`measure`]'s length for that encoding.
pub fn write(free: &[Extent], capacity_blocks: u64, encoding: Encoding, out: &mut [u8]) {
    let mut w = SliceWriter { out, at: 0 };
    match encoding {
        Encoding::List => {
            let mut prev = 0;
            for e in free {
                w.varint(e.start() - prev);
                w.varint(e.len());
                prev = e.end();
            }
        }
        Encoding::Chunked => {
            for c in walk_chunks(free, capacity_blocks) {
                let (kind, _) = c.record();
                w.byte(kind);
                if kind == CHUNK_LIST {
                    w.varint(c.overlapping.len() as u64);
                    let mut prev = c.start;
                    for (s, e) in c.pieces() {
                        w.varint(s - prev);
                        w.varint(e - s);
                        prev = e;
                    }
                } else {
                    let bits = w.take(c.bitmap_bytes() as usize);
                    bits.fill(0);
                    for (s, e) in c.pieces() {
                        set_bits(bits, s - c.start, e - c.start);
                    }
                }
            }
        }
    }
    assert_eq!(w.at, w.out.len(), "the buffer has the measured length");
}

struct SliceWriter<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl SliceWriter<'_> {
    fn byte(&mut self, b: u8) {
        self.out[self.at] = b;
        self.at += 1;
    }

    /// As [`super::put_varint`], into the slice.
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.byte((v as u8) | 0x80);
            v >>= 7;
        }
        self.byte(v as u8);
    }

    fn take(&mut self, n: usize) -> &mut [u8] {
        let s = &mut self.out[self.at..self.at + n];
        self.at += n;
        s
    }
}

/// Sets bits `[from, to)` of a bitmap, least significant bit first.
fn set_bits(bits: &mut [u8], from: u64, to: u64) {
    let mut i = from;
    while i < to && !i.is_multiple_of(8) {
        bits[(i / 8) as usize] |= 1 << (i % 8);
        i += 1;
    }
    while i + 8 <= to {
        bits[(i / 8) as usize] = 0xff;
        i += 8;
    }
    while i < to {
        bits[(i / 8) as usize] |= 1 << (i % 8);
        i += 1;
    }
}

/// The first bit at or after `from` that is set (`set`) or clear (`!set`),
/// or the bitmap's length in bits.
fn find_bit(bits: &[u8], from: u64, set: bool) -> u64 {
    let n = 8 * bits.len() as u64;
    let mut i = from;
    while i < n {
        let byte = bits[(i / 8) as usize];
        let wanted = (if set { byte } else { !byte }) >> (i % 8);
        if wanted != 0 {
            return i + u64::from(wanted.trailing_zeros());
        }
        i = (i / 8 + 1) * 8;
    }
    n
}

/// Calls `f(start, end)` for each run of set bits of `bits`, block `base`
/// being bit 0.
fn runs(
    bits: &[u8],
    base: u64,
    mut f: impl FnMut(u64, u64) -> Result<(), DecodeError>,
) -> Result<(), DecodeError> {
    let n = 8 * bits.len() as u64;
    let mut i = 0;
    loop {
        let start = find_bit(bits, i, true);
        if start == n {
            return Ok(());
        }
        let end = find_bit(bits, start, false);
        f(base + start, base + end)?;
        i = end;
    }
}

/// Collects decoded pieces into maximal extents inside the data area.
struct Collector<'a> {
    layout: &'a Layout,
    out: Vec<Extent>,
}

impl Collector<'_> {
    /// Adds free blocks `[start, end)`, merging with the previous extent
    /// when they meet (only at a chunk boundary: within a chunk, touching
    /// pieces are refused before they get here).
    fn push(&mut self, start: u64, end: u64) -> Result<(), DecodeError> {
        let l = self.layout;
        if start < l.meta_blocks || end > l.capacity_blocks {
            return Err(bad(format!(
                "free blocks {start}..{end} lie outside the data area (blocks {}..{})",
                l.meta_blocks, l.capacity_blocks
            )));
        }
        match self.out.last_mut() {
            Some(last) if last.end() == start => {
                *last = Extent::from_range(last.start(), end).expect("a longer extent");
            }
            _ => self
                .out
                .push(Extent::from_range(start, end).expect("end > start")),
        }
        Ok(())
    }
}

/// Decodes a payload in `encoding` into maximal free extents.
/// `extents_hint` (the header's count) only sizes the result up front, and
/// only as far as the payload's length allows.
///
/// # Errors
/// Malformed varints, unknown chunk kinds, a payload that ends early or
/// has bytes left over, extents that are empty, touch, run past their chunk
/// or lie outside the data area.
pub fn decode(
    payload: &[u8],
    encoding: Encoding,
    layout: &Layout,
    extents_hint: u64,
) -> Result<Vec<Extent>, DecodeError> {
    // A list extent takes at least 2 bytes, a bitmap byte holds at most 4
    // runs.
    let most = match encoding {
        Encoding::List => payload.len() as u64 / 2,
        Encoding::Chunked => payload.len() as u64 * 4,
    };
    let mut c = Collector {
        layout,
        out: Vec::with_capacity(extents_hint.min(most) as usize),
    };
    match encoding {
        Encoding::List => decode_list(payload, &mut c)?,
        Encoding::Chunked => decode_chunked(payload, &mut c)?,
    }
    Ok(c.out)
}

fn decode_list(payload: &[u8], c: &mut Collector<'_>) -> Result<(), DecodeError> {
    let (mut pos, mut prev_end) = (0usize, 0u64);
    while pos < payload.len() {
        let i = c.out.len();
        let gap = get_varint(payload, &mut pos)?;
        let len = get_varint(payload, &mut pos)?;
        if i > 0 && gap == 0 {
            return Err(bad(format!(
                "free extent {i} touches the previous one (they should have been merged)"
            )));
        }
        let start = prev_end
            .checked_add(gap)
            .ok_or_else(|| bad(format!("free extent {i} starts past block 2^64")))?;
        let e = Extent::new(start, len).map_err(|err| bad(format!("free extent {i}: {err}")))?;
        c.push(e.start(), e.end())?;
        prev_end = e.end();
    }
    Ok(())
}

fn decode_chunked(payload: &[u8], c: &mut Collector<'_>) -> Result<(), DecodeError> {
    let cap = c.layout.capacity_blocks;
    let mut pos = 0usize;
    for k in 0..chunks(cap) {
        let start = k * CHUNK_BLOCKS;
        let end = (start + CHUNK_BLOCKS).min(cap);
        let Some(&kind) = payload.get(pos) else {
            return Err(bad(format!(
                "payload ends before the record of chunk {k} (of {})",
                chunks(cap)
            )));
        };
        pos += 1;
        match kind {
            CHUNK_LIST => {
                let n = get_varint(payload, &mut pos)?;
                let mut prev = start;
                for i in 0..n {
                    let gap = get_varint(payload, &mut pos)?;
                    let len = get_varint(payload, &mut pos)?;
                    if i > 0 && gap == 0 {
                        return Err(bad(format!(
                            "chunk {k}: free extent {i} touches the previous one \
                             (they should have been merged)"
                        )));
                    }
                    let s = prev.checked_add(gap).filter(|&s| s < end);
                    let e = s.and_then(|s| s.checked_add(len)).filter(|&e| e <= end);
                    let (Some(s), Some(e)) = (s, e) else {
                        return Err(bad(format!(
                            "chunk {k}: free extent {i} runs past the chunk's end (block {end})"
                        )));
                    };
                    if len == 0 {
                        return Err(bad(format!("chunk {k}: free extent {i} is zero-length")));
                    }
                    c.push(s, e)?;
                    prev = e;
                }
            }
            CHUNK_BITMAP => {
                let n = (end - start).div_ceil(8) as usize;
                let Some(bits) = payload.get(pos..pos + n) else {
                    return Err(bad(format!("payload ends inside the bitmap of chunk {k}")));
                };
                pos += n;
                runs(bits, start, |s, e| {
                    if e > end {
                        return Err(bad(format!(
                            "chunk {k}: bitmap marks blocks past the device's end (block {end}) free"
                        )));
                    }
                    c.push(s, e)
                })?;
            }
            other => {
                return Err(bad(format!(
                "chunk {k}: unknown record kind {other} (expected {CHUNK_LIST} or {CHUNK_BITMAP})"
            )))
            }
        }
    }
    if pos != payload.len() {
        return Err(bad(format!(
            "{} bytes follow the last chunk record",
            payload.len() - pos
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::put_varint;

    fn layout(device_len: u64, block_size: u64) -> Layout {
        Layout::plan(device_len, block_size, None, None).unwrap()
    }

    fn ext(s: u64, e: u64) -> Extent {
        Extent::from_range(s, e).unwrap()
    }

    fn encode(free: &[Extent], l: &Layout, enc: Encoding) -> Vec<u8> {
        let sizes = measure(free, l.capacity_blocks);
        let mut out = vec![0xaa; sizes.len(enc) as usize];
        write(free, l.capacity_blocks, enc, &mut out);
        out
    }

    #[test]
    fn varint_lengths_match_the_writer() {
        for v in [0, 1, 127, 128, 16383, 16384, 1 << 35, u64::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            assert_eq!(varint_len(v), b.len() as u64, "{v}");
        }
    }

    #[test]
    fn pieces_meeting_at_chunk_boundaries_are_one_extent() {
        // 512-byte blocks, 64 MiB: 131072 blocks, 4 chunks.
        let l = layout(64 << 20, 512);
        let c = CHUNK_BLOCKS;
        let free = vec![
            ext(l.meta_blocks, c - 1),
            ext(c, 2 * c),             // exactly chunk 1
            ext(2 * c + 1, 3 * c + 5), // crosses into chunk 3
            ext(3 * c + 7, 4 * c),     // to the device's end
        ];
        for enc in [Encoding::List, Encoding::Chunked] {
            let p = encode(&free, &l, enc);
            assert_eq!(decode(&p, enc, &l, 0).unwrap(), free, "{enc:?}");
        }
        // One extent over the whole data area: one list record per chunk.
        let all = vec![ext(l.meta_blocks, l.capacity_blocks)];
        let p = encode(&all, &l, Encoding::Chunked);
        assert_eq!(decode(&p, Encoding::Chunked, &l, 0).unwrap(), all);
        assert!(p.len() < 30, "{} bytes", p.len());
    }

    #[test]
    fn alternate_blocks_free_is_bounded_by_the_bitmap() {
        let l = layout(64 << 20, 512);
        let m = l.meta_blocks | 1;
        let free: Vec<_> = (m..l.capacity_blocks)
            .step_by(2)
            .map(|b| ext(b, b + 1))
            .collect();
        let s = measure(&free, l.capacity_blocks);
        assert_eq!(s.best(), Encoding::Chunked);
        assert!(s.list >= 2 * free.len() as u64);
        assert!(s.chunked <= max_payload_len(l.capacity_blocks));
        assert_eq!(
            max_payload_len(l.capacity_blocks),
            4 + l.capacity_blocks / 8
        );
        let p = encode(&free, &l, Encoding::Chunked);
        // Every chunk is a bitmap record.
        assert_eq!(p.len(), 4 * (1 + 4096));
        for k in 0..4 {
            assert_eq!(p[k * 4097], CHUNK_BITMAP, "chunk {k}");
        }
        assert_eq!(decode(&p, Encoding::Chunked, &l, 0).unwrap(), free);
    }

    #[test]
    fn bitmap_runs_cover_partial_and_whole_bytes() {
        let mut bits = vec![0u8; 6];
        set_bits(&mut bits, 3, 5);
        set_bits(&mut bits, 7, 33);
        set_bits(&mut bits, 40, 48);
        let collect = |bits: &[u8]| {
            let mut got = Vec::new();
            runs(bits, 100, |s, e| {
                got.push((s, e));
                Ok(())
            })
            .unwrap();
            got
        };
        assert_eq!(collect(&bits), vec![(103, 105), (107, 133), (140, 148)]);
        assert_eq!(collect(&[0xff, 0xff]), vec![(100, 116)]);
        assert_eq!(collect(&[0x80, 0x01]), vec![(107, 109)]);
        assert_eq!(
            collect(&[0xaa]),
            vec![(101, 102), (103, 104), (105, 106), (107, 108)]
        );
        assert!(collect(&[0, 0, 0]).is_empty());
    }

    #[test]
    fn refuses_malformed_chunked_payloads() {
        let l = layout(64 << 20, 512);
        let m = l.meta_blocks;
        let c = CHUNK_BLOCKS;
        let list = |pairs: &[(u64, u64)]| {
            let mut p = vec![CHUNK_LIST];
            put_varint(&mut p, pairs.len() as u64);
            for &(g, n) in pairs {
                put_varint(&mut p, g);
                put_varint(&mut p, n);
            }
            p
        };
        let empty = list(&[]);
        let with_first = |first: Vec<u8>| {
            let mut p = first;
            for _ in 1..4 {
                p.extend_from_slice(&empty);
            }
            p
        };
        let check = |p: Vec<u8>, want: &str| {
            let e = decode(&p, Encoding::Chunked, &l, 0).unwrap_err();
            assert!(e.0.contains(want), "{want}: {e}");
        };
        assert!(decode(&with_first(list(&[(m, 5)])), Encoding::Chunked, &l, 0).is_ok());
        check(with_first(list(&[(m, 5), (0, 5)])), "touches");
        check(with_first(list(&[(m, 0)])), "zero-length");
        check(with_first(list(&[(0, 5)])), "outside the data area");
        check(with_first(list(&[(m, c)])), "past the chunk's end");
        check(
            with_first(list(&[(m, 1), (u64::MAX, 1)])),
            "past the chunk's end",
        );
        check(with_first(vec![7]), "unknown record kind 7");
        check(empty.repeat(3), "ends before the record of chunk 3");
        check(empty.repeat(5), "follow the last chunk record");
        let mut p = vec![CHUNK_BITMAP];
        p.extend_from_slice(&vec![0u8; (c / 8) as usize]);
        p[1] = 1; // block 0: metadata
        check(with_first(p.clone()), "outside the data area");
        check(p[..100].to_vec(), "inside the bitmap of chunk 0");
        // A device whose last chunk ends inside a byte: the padding bits
        // must stay clear.
        let odd = layout(64 << 20 | 3 << 9, 512);
        assert_eq!(odd.capacity_blocks % 8, 3);
        let mut p = empty.repeat(4);
        p.push(CHUNK_BITMAP);
        p.push(0b0000_1000);
        assert!(decode(&p, Encoding::Chunked, &odd, 0)
            .unwrap_err()
            .0
            .contains("past the device's end"));
        p.pop();
        p.push(0b0000_0100);
        assert_eq!(
            decode(&p, Encoding::Chunked, &odd, 0).unwrap(),
            vec![ext(4 * c + 2, 4 * c + 3)]
        );
    }
}
