//! What the journal's per-sector stamps cost a commit: CPU time to encode
//! and to read back one entry in format version 2 (every 512-byte sector
//! stamped and checksummed) and in version 1 (a header and a payload
//! checksum), by entry size; the pages each takes; and, for scale, the CPU
//! time of a whole commit through the store on a memory device (no device
//! latency), and of the ring scan recovery does at open.
//!
//! ```text
//! cargo run --release -p blockalloc-store --example journal_cost
//! ```
//!
//! Times are this thread's CPU time per operation, the median of 9 runs.

use std::sync::Arc;
use std::time::Duration;

use blockalloc::Extent;
use blockalloc_store::device::MemDevice;
use blockalloc_store::format::{journal, journal_v1, JournalOp, PAGE};
use blockalloc_store::{FormatOptions, Store};

/// This thread's CPU time.
fn cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Median over 9 runs of the CPU time per call of `f`, run `n` times.
fn per_call(n: u32, mut f: impl FnMut()) -> f64 {
    let mut runs: Vec<f64> = (0..9)
        .map(|_| {
            let c0 = cpu();
            for _ in 0..n {
                f();
            }
            (cpu() - c0).as_secs_f64() * 1e9 / n as f64
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[4]
}

fn payload(ops: u64) -> Vec<u8> {
    let mut p = Vec::new();
    for i in 0..ops {
        JournalOp::Alloc(Extent::new(1_000_000 + i * 977, 1 + i % 13).unwrap()).encode(&mut p);
    }
    p
}

fn main() {
    let uuid = *b"0123456789abcdef";
    println!(
        "| entry | payload bytes | pages v1 / v2 | encode v1 / v2 ns | read v1 / v2 ns | \
         added per entry ns |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, ops) in [
        ("one allocation", 1u64),
        ("one page", 450),
        ("16 pages", 7200),
    ] {
        let p = payload(ops);
        let (p1, p2) = (journal_v1::pages_for(p.len()), journal::pages_for(p.len()));
        let n = (200_000 / (p2 as u32 * 8)).max(100);
        let e1 = per_call(n, || {
            std::hint::black_box(journal_v1::encode_entry(7, 3, 42, 1, &p));
        });
        let e2 = per_call(n, || {
            std::hint::black_box(journal::encode_entry(7, 3, &uuid, 1, &p));
        });
        let b1 = journal_v1::encode_entry(7, 3, 42, 1, &p);
        let b2 = journal::encode_entry(7, 3, &uuid, 1, &p);
        let ring_of = |b: &[u8]| {
            let mut r = vec![0u8; (64 * PAGE) as usize];
            let at = (3 * PAGE) as usize;
            r[at..at + b.len()].copy_from_slice(b);
            r
        };
        let (r1, r2) = (ring_of(b1.as_slice()), ring_of(b2.as_slice()));
        let d1 = per_call(n, || {
            let page = &r1[(3 * PAGE) as usize..];
            let h = journal_v1::decode_header(page).unwrap();
            let off = journal_v1::JE_PAYLOAD_OFF;
            let ops = journal_v1::decode_ops(&page[off..off + h.payload_len as usize], &h);
            std::hint::black_box(ops.unwrap());
        });
        let d2 = per_call(n, || {
            std::hint::black_box(journal::look(&r2, 3, 7, &uuid));
        });
        println!(
            "| {name} | {} | {p1} / {p2} | {e1:.0} / {e2:.0} | {d1:.0} / {d2:.0} | {:.0} |",
            p.len(),
            e2 - e1
        );
    }
    // A whole commit (one allocation) through the store, no device latency.
    let dev = Arc::new(MemDevice::new(1 << 30));
    let store = Store::format(dev, FormatOptions::default()).unwrap();
    let commit = per_call(2000, || {
        let mut t = store.begin();
        t.allocate(1, None).unwrap();
        t.commit().unwrap();
    });
    println!("\none commit of one allocation on a memory device: {commit:.0} ns CPU");
    let ring = journal::blank_pages((64 << 20) / PAGE as usize, &uuid);
    let scan = per_call(5, || {
        std::hint::black_box(journal::damaged_sectors(ring.as_slice(), &uuid));
    });
    println!(
        "ring scan at open (64 MiB, the largest ring): {:.1} ms CPU",
        scan / 1e6
    );
}
