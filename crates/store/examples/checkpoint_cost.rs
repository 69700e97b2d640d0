//! What a checkpoint costs, by device size and free-space state: bytes
//! written, encoding chosen, time to encode, to write and `fdatasync` to a
//! file, and to decode (as recovery does). Encode and decode are given as
//! wall time and as this thread's CPU time, which a busy machine inflates
//! less.
//!
//! ```text
//! cargo run --release -p blockalloc-store --example checkpoint_cost [DIR [MAX_EXTENTS]]
//! ```
//!
//! `DIR` holds the scratch file (default: the system's temporary
//! directory). States with more than `MAX_EXTENTS` free extents (default
//! 2^25; each costs 16 bytes of memory twice, for the list and its decoded
//! copy) are skipped and reported as such.

use std::io::{Seek, SeekFrom, Write};
use std::time::{Duration, Instant};

use blockalloc::Extent;
use blockalloc_store::format::checkpoint::{self, SlotState, Stamp};
use blockalloc_store::format::{free_space, Layout};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Free extents above which a state is skipped by default.
const MAX_EXTENTS: u64 = 1 << 25;

/// A free-space state: `(mean gap, mean length)` in blocks, both drawn
/// uniformly from `1..=2 * mean - 1`; `None` is one free extent.
struct State {
    name: &'static str,
    shape: Option<(u64, u64)>,
}

const STATES: [State; 4] = [
    State {
        name: "empty",
        shape: None,
    },
    // About one free extent per 32 MiB, 30 % free: what long mixed
    // workloads leave.
    State {
        name: "typical",
        shape: Some((5734, 2458)),
    },
    // One free extent per 16 blocks on average.
    State {
        name: "fragmented",
        shape: Some((12, 4)),
    },
    // One free block in two: the most free extents a device can hold.
    State {
        name: "worst",
        shape: Some((1, 1)),
    },
];

fn free_list(l: &Layout, shape: Option<(u64, u64)>, rng: &mut StdRng) -> Vec<Extent> {
    let Some((gap, len)) = shape else {
        return vec![Extent::from_range(l.meta_blocks, l.capacity_blocks).unwrap()];
    };
    let draw = |rng: &mut StdRng, mean: u64| {
        if mean == 1 {
            1
        } else {
            rng.random_range(1..2 * mean)
        }
    };
    let mut out = Vec::new();
    let mut at = l.meta_blocks;
    loop {
        let start = at + draw(rng, gap);
        let end = (start + draw(rng, len)).min(l.capacity_blocks);
        if start >= end {
            return out;
        }
        out.push(Extent::from_range(start, end).unwrap());
        at = end;
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// This thread's CPU time.
fn cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

fn main() {
    let dir = std::env::args()
        .nth(1)
        .map_or_else(std::env::temp_dir, Into::into);
    let max_extents: u64 = std::env::args()
        .nth(2)
        .map_or(MAX_EXTENTS, |s| s.parse().expect("MAX_EXTENTS is a number"));
    let mut file = tempfile::tempfile_in(&dir).expect("a scratch file");
    let mut rng = StdRng::seed_from_u64(1);
    println!(
        "{:>7} {:>10} {:>11} {:>9} {:>12} {:>12} {:>14} {:>10} {:>14}",
        "device",
        "state",
        "extents",
        "encoding",
        "written",
        "slot",
        "encode ms/cpu",
        "write+sync",
        "decode ms/cpu"
    );
    for (label, bytes) in [
        ("1GiB", 1u64 << 30),
        ("64GiB", 64 << 30),
        ("1TiB", 1 << 40),
        ("16TiB", 16 << 40),
    ] {
        let l = Layout::plan(bytes, 4096, None, None).unwrap();
        for st in &STATES {
            let expected = st
                .shape
                .map_or(1, |(g, n)| (l.capacity_blocks - l.meta_blocks) / (g + n));
            if expected > max_extents {
                let bound = checkpoint::max_len(l.capacity_blocks);
                println!(
                    "{label:>7} {:>10} {expected:>11} {:>9} {:>12} {:>12}  skipped: \
                     {} MiB of extents in memory; at most {bound} bytes written",
                    st.name,
                    "-",
                    "-",
                    l.slot_len,
                    (expected * 16) >> 20
                );
                continue;
            }
            let free = free_list(&l, st.shape, &mut rng);
            let stamp = Stamp {
                slot: 0,
                uuid: [1; 16],
                seq: 1,
                journal_seq: 1,
                journal_pos: 0,
            };
            let (t0, c0) = (Instant::now(), cpu());
            let buf = checkpoint::encode(&stamp, &free, &l).expect("the planned slot holds it");
            let (encode, encode_cpu) = (t0.elapsed(), cpu() - c0);
            let t1 = Instant::now();
            file.seek(SeekFrom::Start(0)).unwrap();
            file.write_all(buf.as_slice()).unwrap();
            file.sync_data().unwrap();
            let write = t1.elapsed();
            let (t2, c2) = (Instant::now(), cpu());
            let SlotState::Valid(h) =
                checkpoint::decode_header(&buf.as_slice()[..4096], 0, [1; 16], l.slot_len)
            else {
                panic!("header does not decode");
            };
            let payload = &buf.as_slice()[4096..4096 + h.payload_len as usize];
            let back = checkpoint::decode_free_list(payload, &h, &l).unwrap();
            let (decode, decode_cpu) = (t2.elapsed(), cpu() - c2);
            assert_eq!(back, free);
            let sizes = free_space::measure(&free, l.capacity_blocks);
            println!(
                "{label:>7} {:>10} {:>11} {:>9} {:>12} {:>12} {:>14} {:>10} {:>14}   (list {} B, chunked {} B)",
                st.name,
                free.len(),
                format!("{:?}", h.encoding),
                buf.len(),
                l.slot_len,
                format!("{}/{}", ms(encode), ms(encode_cpu)),
                ms(write),
                format!("{}/{}", ms(decode), ms(decode_cpu)),
                sizes.list,
                sizes.chunked
            );
        }
    }
}
