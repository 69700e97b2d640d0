//! What background zeroing buys object writes, and what it costs a
//! workload running beside it (see `blockalloc_store::zero`).
//!
//! On ext4 and XFS a block that `fallocate` reserved but nothing wrote is
//! an *unwritten extent*: the first write into it converts the extent, a
//! metadata transaction that the writer's `fdatasync` waits for. The notes
//! of `docs/background.md` measured 1 GiB in synced 4 KiB writes: 13.5 s
//! into fallocated space, 4.0 s into space zeroed beforehand (3.4×).
//!
//! ```text
//! cargo run --release -p blockalloc-store --example zero_bench -- --dir DIR \
//!     [--size 4GiB] [--c-size 8GiB] [--work 256MiB] [--share 0.1] [--reps 3] \
//!     [--seconds 5] [--cap 2.5] [--parts ab,c] [--quick]
//! ```
//!
//! `DIR` must be on the file system to measure (not tmpfs: it has no
//! unwritten extents); `scripts/zeroing-bench.sh` runs this on a fresh
//! ext4 and XFS over a loop device. The defaults take about 3 minutes and
//! need `2 × --size` free, then `--c-size`; `--quick` takes about 15 s
//! (1 GiB files, 2 GiB for (c), short runs, one repetition). Three parts,
//! all with objects written through a second descriptor of the device
//! file (`O_DIRECT`, aligned buffer, `pwrite`, `fdatasync`):
//!
//! * **(a) / (b)**: two device files of `--size`, each created with
//!   `fallocate` only (`ZeroMode::None`) and formatted. (a) is left
//!   unwritten; (b) is zeroed by the store's own background zeroer at share
//!   1.0 (`plan_zeroing` + `start_zeroing(1.0)`, waited for; its time and
//!   rate are reported). Then, for each object size (4 KiB, 64 KiB, 1 MiB,
//!   4 MiB) and each of four variants — `fdatasync` per object or per 16
//!   objects, extents allocated and committed in the timed loop ("with
//!   commit": the commit's journal sync is part of the cost) or all
//!   allocated beforehand in untimed commits ("data only": the file
//!   system's cost alone, as the notes measured) — one run writes into
//!   (a) and one into (b), back to back, in alternating order over
//!   `--reps` repetitions. Each run takes fresh extents: the store hands
//!   out space in address order, so every run writes a region no earlier
//!   run touched, unwritten in (a) and zeroed in (b). A run stops after
//!   its object count or `--cap` seconds, whichever comes first.
//! * **(c)**: a third file (`--c-size`, made afresh for each repetition);
//!   a workload area (`--work` bytes of 64 KiB objects) is allocated and
//!   written once, and the rest of the device is planned for zeroing. The
//!   workload overwrites its objects round robin, `fdatasync` per object,
//!   for `--seconds` per window: alone, with the zeroer at `--share`, and
//!   with it at 0.5, in alternating order (the zeroer stopped between
//!   windows, resuming where it stopped). The zeroer works only above the workload area (it starts
//!   past the highest block handed out), so the two share the device and
//!   nothing else. A window ends early if the zeroer runs out of space to
//!   zero (the table says so).
//!
//! Files are created in `DIR` and removed at the end (also on error).
//! Output: Markdown tables. MiB/s counts object bytes only.

use std::error::Error;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockalloc::Extent;
use blockalloc_store::device::{DirectIo, FileDevice, Preallocation, ZeroMode};
use blockalloc_store::{FormatOptions, Store};

type Res<T> = Result<T, Box<dyn Error>>;

const BS: u64 = 4096;
const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// Objects per `fdatasync` in batched mode.
const BATCH: u64 = 16;
/// Object size of the concurrent workload (c).
const WORK_OBJECT: u64 = 64 * KIB;

struct Opts {
    dir: PathBuf,
    size: u64,
    c_size: u64,
    work: u64,
    share: f64,
    reps: usize,
    seconds: f64,
    cap: f64,
    /// Objects per run, by object size.
    counts: [(u64, u64); 4],
    /// Run (a)/(b) and (c).
    ab: bool,
    c: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: zero_bench --dir DIR [--size BYTES] [--c-size BYTES] [--work BYTES] \
         [--share F] [--reps N] [--seconds S] [--cap S] [--parts ab,c] [--quick]"
    );
    std::process::exit(2)
}

/// `4096`, `64KiB`, `4MiB`, `4GiB` (also `K`, `M`, `G`, `KB`…, all binary).
fn parse_bytes(s: &str) -> Res<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("not a size: {s:?}"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => KIB,
        "m" | "mb" | "mib" => MIB,
        "g" | "gb" | "gib" => GIB,
        "t" | "tb" | "tib" => GIB << 10,
        _ => return Err(format!("not a size: {s:?}").into()),
    };
    Ok(n * mult)
}

fn parse_args() -> Res<Opts> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let mut o = if quick {
        Opts {
            dir: PathBuf::new(),
            size: GIB,
            c_size: 2 * GIB,
            work: 32 * MIB,
            share: 0.1,
            reps: 1,
            seconds: 1.5,
            cap: 0.5,
            counts: [(4 * KIB, 1024), (64 * KIB, 256), (MIB, 32), (4 * MIB, 16)],
            ab: true,
            c: true,
        }
    } else {
        Opts {
            dir: PathBuf::new(),
            size: 4 * GIB,
            c_size: 8 * GIB,
            work: 256 * MIB,
            share: 0.1,
            reps: 3,
            seconds: 5.0,
            cap: 2.5,
            counts: [(4 * KIB, 8192), (64 * KIB, 1024), (MIB, 96), (4 * MIB, 32)],
            ab: true,
            c: true,
        }
    };
    let mut dir = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().unwrap_or_else(|| usage());
        match a.as_str() {
            "--quick" => {}
            "--dir" => dir = Some(PathBuf::from(val())),
            "--size" => o.size = parse_bytes(&val())?,
            "--c-size" => o.c_size = parse_bytes(&val())?,
            "--work" => o.work = parse_bytes(&val())?,
            "--share" => o.share = val().parse()?,
            "--reps" => o.reps = val().parse()?,
            "--seconds" => o.seconds = val().parse()?,
            "--cap" => o.cap = val().parse()?,
            "--parts" => {
                let v = val();
                let parts: Vec<&str> = v.split(',').map(str::trim).collect();
                if parts.iter().any(|p| *p != "ab" && *p != "c") {
                    return Err(format!("--parts takes ab, c or ab,c, not {v:?}").into());
                }
                o.ab = parts.contains(&"ab");
                o.c = parts.contains(&"c");
            }
            "-h" | "--help" => usage(),
            other => {
                eprintln!("unknown argument {other:?}");
                usage()
            }
        }
    }
    o.dir = dir.unwrap_or_else(|| usage());
    if !(o.share > 0.0 && o.share <= 1.0) || o.reps == 0 || o.seconds <= 0.0 || o.cap <= 0.0 {
        return Err("--share must be in (0, 1], --reps, --seconds and --cap above 0".into());
    }
    Ok(o)
}

/// Removes the files it names when dropped (also on error or panic).
#[derive(Default)]
struct Cleanup(Vec<PathBuf>);

impl Cleanup {
    fn add(&mut self, p: &Path) {
        self.0.push(p.to_path_buf());
    }
    fn remove(&mut self, p: &Path) {
        let _ = std::fs::remove_file(p);
        self.0.retain(|q| q != p);
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// `len` bytes at a 4096-aligned address inside `v` (no `unsafe`: the
/// vector has 4096 bytes to spare).
fn aligned(v: &mut [u8], len: usize) -> &mut [u8] {
    let off = v.as_ptr().align_offset(4096);
    &mut v[off..off + len]
}

/// The second descriptor objects are written through: `O_DIRECT` where
/// the file system has it.
fn open_data(path: &Path) -> Res<(File, bool)> {
    let direct = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(path);
    match direct {
        Ok(f) => Ok((f, true)),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
            let f = OpenOptions::new().read(true).write(true).open(path)?;
            Ok((f, false))
        }
        Err(e) => Err(e.into()),
    }
}

/// Waits (up to 30 s) until the file system holding `dir` has `bytes`
/// available: XFS frees a removed file's blocks in the background, so its
/// space shows up a little after the unlink. `syncfs` pushes that along.
fn wait_for_room(dir: &Path, bytes: u64) -> Res<()> {
    rustix::fs::syncfs(File::open(dir)?)?;
    let t = Instant::now();
    loop {
        let st = rustix::fs::statvfs(dir)?;
        if st.f_bavail.saturating_mul(st.f_frsize) >= bytes || t.elapsed().as_secs() >= 30 {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A device file created with `fallocate` only (unwritten extents) and
/// formatted; returns the store and the seconds creating and formatting
/// took.
fn make_store(path: &Path, len: u64, files: &mut Cleanup) -> Res<(Store, f64)> {
    let t = Instant::now();
    let prealloc = Preallocation {
        allocate: true,
        zero: ZeroMode::None,
    };
    // Refuses an existing non-empty file, so only this run's are removed.
    let dev = FileDevice::create(path, len, prealloc, DirectIo::Auto)?;
    files.add(path);
    if !dev.is_direct() {
        eprintln!("note: {} is not opened O_DIRECT", path.display());
    }
    let store = Store::format(dev, FormatOptions::default())?;
    Ok((store, t.elapsed().as_secs_f64()))
}

/// Allocates `count` extents of `blocks` each, in untimed commits of 256.
fn allocate_bulk(store: &Store, blocks: u64, count: u64) -> Res<Vec<Extent>> {
    let mut out = Vec::with_capacity(count as usize);
    let mut left = count;
    while left > 0 {
        let n = left.min(256);
        let mut t = store.begin();
        t.allocate_each(&vec![blocks; n as usize], None, &mut out)?;
        t.commit()?;
        left -= n;
    }
    Ok(out)
}

/// One timed run.
#[derive(Clone, Copy, Default)]
struct Sample {
    bytes: u64,
    objects: u64,
    data_syncs: u64,
    store_syncs: u64,
    secs: f64,
}

impl Sample {
    fn add(&mut self, o: &Sample) {
        self.bytes += o.bytes;
        self.objects += o.objects;
        self.data_syncs += o.data_syncs;
        self.store_syncs += o.store_syncs;
        self.secs += o.secs;
    }
    fn mibs(&self) -> f64 {
        self.bytes as f64 / MIB as f64 / self.secs
    }
    fn syncs_per_s(&self) -> f64 {
        (self.data_syncs + self.store_syncs) as f64 / self.secs
    }
}

#[derive(Clone, Copy, PartialEq)]
struct Variant {
    per_object: bool,
    with_commit: bool,
}

impl Variant {
    const ALL: [Variant; 4] = [
        Variant {
            per_object: true,
            with_commit: false,
        },
        Variant {
            per_object: false,
            with_commit: false,
        },
        Variant {
            per_object: true,
            with_commit: true,
        },
        Variant {
            per_object: false,
            with_commit: true,
        },
    ];
    fn sync_name(&self) -> &'static str {
        if self.per_object {
            "per object"
        } else {
            "per 16"
        }
    }
    fn alloc_name(&self) -> &'static str {
        if self.with_commit {
            "with commit"
        } else {
            "data only"
        }
    }
}

/// Writes up to `count` objects of `size` bytes into fresh extents of
/// `store` through `file`, as `v` says, stopping after `cap` seconds.
fn run(
    store: &Store,
    file: &File,
    buf: &[u8],
    size: u64,
    count: u64,
    v: Variant,
    cap: f64,
) -> Res<Sample> {
    let blocks = size / BS;
    let batch = if v.per_object { 1 } else { BATCH };
    let mut pre = if v.with_commit {
        Vec::new()
    } else {
        allocate_bulk(store, blocks, count)?
    };
    pre.reverse();
    let syncs0 = store.stats().syncs;
    let mut s = Sample::default();
    let mut exts = Vec::with_capacity(batch as usize);
    let t = Instant::now();
    while s.objects < count && t.elapsed().as_secs_f64() < cap {
        let n = batch.min(count - s.objects);
        exts.clear();
        if v.with_commit {
            let mut txn = store.begin();
            txn.allocate_each(&vec![blocks; n as usize], None, &mut exts)?;
            txn.commit()?;
        } else {
            exts.extend((0..n).map(|_| pre.pop().expect("allocated beforehand")));
        }
        for e in &exts {
            debug_assert_eq!(e.len(), blocks);
            file.write_all_at(&buf[..size as usize], e.start() * BS)?;
        }
        file.sync_data()?;
        s.data_syncs += 1;
        s.objects += n;
    }
    s.secs = t.elapsed().as_secs_f64();
    s.bytes = s.objects * size;
    s.store_syncs = store.stats().syncs - syncs0;
    Ok(s)
}

fn fmt_size(b: u64) -> String {
    if b >= GIB && b.is_multiple_of(GIB) {
        format!("{} GiB", b / GIB)
    } else if b >= MIB && b.is_multiple_of(MIB) {
        format!("{} MiB", b / MIB)
    } else if b >= MIB {
        format!("{:.1} MiB", b as f64 / MIB as f64)
    } else if b >= KIB && b.is_multiple_of(KIB) {
        format!("{} KiB", b / KIB)
    } else {
        format!("{b} B")
    }
}

/// `lo–hi` (or one value) with `prec` decimals.
fn range(xs: &[f64], prec: usize) -> String {
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if xs.len() < 2 || format!("{lo:.prec$}") == format!("{hi:.prec$}") {
        format!("{hi:.prec$}")
    } else {
        format!("{lo:.prec$}–{hi:.prec$}")
    }
}

/// Decimals that keep about three significant digits.
fn prec(x: f64) -> usize {
    if x >= 100.0 {
        0
    } else if x >= 10.0 {
        1
    } else {
        2
    }
}

/// The mount that holds `dir`, from `/proc/mounts`: (device, mount point,
/// type).
fn mount_of(dir: &Path) -> Option<(String, String, String)> {
    let dir = std::fs::canonicalize(dir).ok()?;
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 4).then(|| (f[0].to_string(), f[1].to_string(), f[2].to_string()))
        })
        .filter(|(_, m, _)| dir.starts_with(m))
        .max_by_key(|(_, m, _)| m.len())
}

fn main() -> Res<()> {
    let o = parse_args()?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    println!("```sh");
    println!(
        "cargo run --release -p blockalloc-store --example zero_bench -- {}",
        args.join(" ")
    );
    println!("```\n");
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    match mount_of(&o.dir) {
        Some((dev, mnt, fs)) => println!(
            "File system: {fs} on {dev} (mounted at {mnt}), Linux {}.",
            kernel.trim()
        ),
        None => println!("File system: unknown, Linux {}.", kernel.trim()),
    }
    let max_obj = o.counts.iter().map(|c| c.0).max().unwrap_or(MIB) as usize;
    let mut storage = vec![0u8; max_obj + 4096];
    let buf = aligned(&mut storage, max_obj);
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i as u64)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_right(29) as u8
            | 1;
    }
    let mut files = Cleanup::default();
    if o.ab {
        part_ab(&o, &mut files, buf)?;
    }
    if o.c {
        part_c(&o, &mut files, buf)?;
    }
    Ok(())
}

/// (a) and (b): both files exist side by side, so runs alternate.
fn part_ab(o: &Opts, files: &mut Cleanup, buf: &[u8]) -> Res<()> {
    let pa = o.dir.join("zero_bench-a.dev");
    let pb = o.dir.join("zero_bench-b.dev");
    wait_for_room(&o.dir, 2 * o.size)?;
    let need: u64 = o.counts.iter().map(|(s, n)| s * n).sum::<u64>() * 4 * o.reps as u64;
    let (sa, fmt_a) = make_store(&pa, o.size, files)?;
    let data_area = (sa.layout().capacity_blocks - sa.layout().meta_blocks) * BS;
    if need > data_area {
        return Err(format!(
            "the runs need {} of fresh space per file, more than --size {} holds",
            fmt_size(need),
            fmt_size(o.size)
        )
        .into());
    }
    let (sb, fmt_b) = make_store(&pb, o.size, files)?;
    let sb = Arc::new(sb);
    sb.plan_zeroing()?;
    let t = Instant::now();
    let z = sb.start_zeroing(1.0)?.ok_or("nothing to zero")?;
    while !z.is_finished() {
        std::thread::sleep(Duration::from_millis(20));
    }
    z.stop()?;
    let zero_secs = t.elapsed().as_secs_f64();
    let zp = sb.zero_progress().ok_or("no zeroing progress")?;
    if !zp.is_done() || zp.stopped.is_some() {
        return Err(format!("zeroing did not finish: {zp:?}").into());
    }

    let (fa, da) = open_data(&pa)?;
    let (fb, db) = open_data(&pb)?;

    // results[size][variant] = (samples of a, samples of b)
    let mut results: Vec<Vec<(Vec<Sample>, Vec<Sample>)>> =
        vec![vec![(Vec::new(), Vec::new()); 4]; o.counts.len()];
    for rep in 0..o.reps {
        for (si, &(size, count)) in o.counts.iter().enumerate() {
            for (vi, &v) in Variant::ALL.iter().enumerate() {
                let a_first = (rep + si + vi) % 2 == 0;
                for first in [true, false] {
                    if first == a_first {
                        let s = run(&sa, &fa, buf, size, count, v, o.cap)?;
                        results[si][vi].0.push(s);
                    } else {
                        let s = run(&sb, &fb, buf, size, count, v, o.cap)?;
                        results[si][vi].1.push(s);
                    }
                }
            }
        }
    }
    let total_b = sb.stats();
    drop((fa, fb));
    sa.close()?;
    Arc::try_unwrap(sb)
        .map_err(|_| "the zeroer still holds the store")?
        .close()?;
    files.remove(&pa);
    files.remove(&pb);

    println!(
        "\n### Object writes into unwritten vs background-zeroed space\n\n\
         Two {} files, `fallocate` only (`ZeroMode::None`), formatted: {:.2} s and {:.2} s. \
         (b) zeroed by `start_zeroing(1.0)`: {} of data area in {:.2} s = **{:.0} MiB/s** \
         (allocations that waited for a piece: {}). Objects written `O_DIRECT` ({}), \
         {} repetition(s) alternating (a)/(b), each run ≤ {} s on fresh extents.\n",
        fmt_size(o.size),
        fmt_a,
        fmt_b,
        fmt_size(zp.written_bytes),
        zero_secs,
        zp.written_bytes as f64 / MIB as f64 / zero_secs,
        zp.waits,
        if da && db { "yes" } else { "no: buffered" },
        o.reps,
        o.cap
    );
    println!(
        "| object | fdatasync | extents | objects/run | (a) unwritten MiB/s | (a) syncs/s | \
         (b) zeroed MiB/s | (b) syncs/s | (b) ÷ (a) |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|");
    let mut four_k = None;
    for (si, &(size, count)) in o.counts.iter().enumerate() {
        for (vi, v) in Variant::ALL.iter().enumerate() {
            let (ra, rb) = &results[si][vi];
            let (mut ta, mut tb) = (Sample::default(), Sample::default());
            ra.iter().for_each(|s| ta.add(s));
            rb.iter().for_each(|s| tb.add(s));
            let ma: Vec<f64> = ra.iter().map(Sample::mibs).collect();
            let mb: Vec<f64> = rb.iter().map(Sample::mibs).collect();
            let objs: Vec<f64> = ra.iter().chain(rb).map(|s| s.objects as f64).collect();
            let ratio = tb.mibs() / ta.mibs();
            if size == 4 * KIB && v.per_object && !v.with_commit {
                four_k = Some(ratio);
            }
            let objs_s = if objs.iter().all(|&n| n == count as f64) {
                count.to_string()
            } else {
                format!("{} (cap)", range(&objs, 0))
            };
            println!(
                "| {} | {} | {} | {} | {} | {:.0} | {} | {:.0} | {:.2}× |",
                fmt_size(size),
                v.sync_name(),
                v.alloc_name(),
                objs_s,
                range(&ma, prec(ta.mibs())),
                ta.syncs_per_s(),
                range(&mb, prec(tb.mibs())),
                tb.syncs_per_s(),
                ratio
            );
        }
    }
    println!(
        "\nsyncs/s counts every `fdatasync`: the objects' and, \"with commit\", the \
         store's journal syncs (one per commit). \"data only\": extents allocated \
         beforehand in untimed commits. MiB/s: per run (range over repetitions); \
         (b) ÷ (a) from the totals. The notes (`docs/background.md`, 1 GiB in synced \
         4 KiB writes): fallocate 13.5 s vs. fallocate + zeros 4.0 s = **3.4×**; \
         here 4 KiB, per object, data only: **{:.2}×**. Store (b) wrote {} of journal \
         in {} commits.",
        four_k.unwrap_or(f64::NAN),
        fmt_size(total_b.journal_bytes),
        total_b.commits
    );

    Ok(())
}

/// (c) The zeroer beside a workload of overwrites.
fn part_c(o: &Opts, files: &mut Cleanup, buf: &[u8]) -> Res<()> {
    let pc = o.dir.join("zero_bench-c.dev");
    let c_size = o.c_size;
    let n_work = (o.work / WORK_OBJECT).max(1);
    let mut shares = vec![None, Some(o.share)];
    if o.share != 0.5 {
        shares.push(Some(0.5));
    }
    struct Window {
        w: Sample,
        lat: Vec<f64>,
        zero_bytes: u64,
        zero_done: bool,
        waits: u64,
    }
    let mut windows: Vec<Vec<Window>> = (0..shares.len()).map(|_| Vec::new()).collect();
    let (mut rest, mut most_used, mut dc) = (0, 0.0f64, true);
    for rep in 0..o.reps {
        // A fresh file each repetition, so that the zeroer has room for all
        // of the repetition's windows.
        wait_for_room(&o.dir, c_size)?;
        let (sc, _) = make_store(&pc, c_size, files)?;
        let sc = Arc::new(sc);
        let work = allocate_bulk(&sc, WORK_OBJECT / BS, n_work)?;
        let (fc, direct) = open_data(&pc)?;
        dc &= direct;
        for e in &work {
            fc.write_all_at(&buf[..WORK_OBJECT as usize], e.start() * BS)?;
        }
        fc.sync_data()?;
        sc.plan_zeroing()?;
        let p = sc.zero_progress().ok_or("no zeroing planned")?;
        rest = (p.capacity_blocks - work.iter().map(|e| e.end()).max().unwrap_or(0)) * BS;
        let mut next = 0usize;
        let order: Vec<usize> = if rep % 2 == 0 {
            (0..shares.len()).collect()
        } else {
            (0..shares.len()).rev().collect()
        };
        for i in order {
            let before = sc.zero_progress().ok_or("no zeroing planned")?;
            let z = match shares[i] {
                Some(share) => match sc.start_zeroing(share)? {
                    Some(z) => Some(z),
                    None => {
                        eprintln!("note: nothing left to zero; window at share {share} skipped");
                        continue;
                    }
                },
                None => None,
            };
            let mut lat = Vec::new();
            let mut s = Sample::default();
            let t = Instant::now();
            while t.elapsed().as_secs_f64() < o.seconds {
                if z.as_ref().is_some_and(|z| z.is_finished()) {
                    break;
                }
                let e = work[next % work.len()];
                next += 1;
                let t1 = Instant::now();
                fc.write_all_at(&buf[..WORK_OBJECT as usize], e.start() * BS)?;
                fc.sync_data()?;
                lat.push(t1.elapsed().as_secs_f64());
                s.objects += 1;
                s.data_syncs += 1;
            }
            s.secs = t.elapsed().as_secs_f64();
            s.bytes = s.objects * WORK_OBJECT;
            let zero_done = z.as_ref().is_some_and(|z| z.is_finished());
            let after_window = sc.zero_progress().ok_or("no zeroing planned")?;
            if let Some(z) = z {
                z.stop()?;
            }
            if let Some(why) = &after_window.stopped {
                return Err(format!("the zeroer stopped: {why}").into());
            }
            lat.sort_by(f64::total_cmp);
            windows[i].push(Window {
                w: s,
                lat,
                zero_bytes: after_window.written_bytes - before.written_bytes,
                zero_done,
                waits: after_window.waits - before.waits,
            });
        }
        let end = sc.zero_progress().ok_or("no zeroing planned")?;
        most_used = most_used.max(end.written_bytes as f64 / rest as f64);
        drop(fc);
        Arc::try_unwrap(sc)
            .map_err(|_| "the zeroer still holds the store")?
            .close()?;
        files.remove(&pc);
    }

    println!(
        "\n### What background zeroing costs a concurrent workload\n\n\
         A {} file: {} of 64 KiB objects allocated and written once, then overwritten \
         round robin, `fdatasync` per object (`O_DIRECT`: {}), for {} s per window; the \
         zeroer (`start_zeroing(share)`) meanwhile zeroes the {} above them. {} \
         repetition(s), each on a fresh file, windows in alternating order; the zeroer \
         used at most {:.0} % of its area in one.\n",
        fmt_size(c_size),
        fmt_size(n_work * WORK_OBJECT),
        if dc { "yes" } else { "no: buffered" },
        o.seconds,
        fmt_size(rest),
        o.reps,
        most_used * 100.0
    );
    println!(
        "| zeroer | workload MiB/s | vs. alone | p50 ms | p99 ms | zeroer MiB/s meanwhile | \
         allocations waited |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let total = |ws: &[Window]| {
        let mut t = Sample::default();
        ws.iter().for_each(|w| t.add(&w.w));
        t
    };
    let alone = total(&windows[0]).mibs();
    for (i, share) in shares.iter().enumerate() {
        let ws = &windows[i];
        if ws.is_empty() {
            println!(
                "| share {} | — (nothing left to zero) | | | | | |",
                share.unwrap_or(0.0)
            );
            continue;
        }
        let t = total(ws);
        let mibs: Vec<f64> = ws.iter().map(|w| w.w.mibs()).collect();
        let q = |p: f64| {
            let v: Vec<f64> = ws
                .iter()
                .map(|w| w.lat[((w.lat.len() - 1) as f64 * p) as usize] * 1e3)
                .collect();
            range(&v, 2)
        };
        let zmibs: Vec<f64> = ws
            .iter()
            .map(|w| w.zero_bytes as f64 / MIB as f64 / w.w.secs)
            .collect();
        let short: Vec<String> = ws
            .iter()
            .filter(|w| w.zero_done)
            .map(|w| format!("{:.1} s", w.w.secs))
            .collect();
        let name = match share {
            None => "none (alone)".to_string(),
            Some(s) => format!("share {s}"),
        };
        let zcol = match share {
            None => "—".to_string(),
            Some(_) => {
                let m = zmibs.iter().sum::<f64>() / zmibs.len() as f64;
                let mut s = range(&zmibs, prec(m));
                if !short.is_empty() {
                    s += &format!(" (finished after {})", short.join(", "));
                }
                s
            }
        };
        println!(
            "| {name} | {} | {:.0} % | {} | {} | {zcol} | {} |",
            range(&mibs, prec(t.mibs())),
            t.mibs() / alone * 100.0,
            q(0.5),
            q(0.99),
            ws.iter().map(|w| w.waits).sum::<u64>()
        );
    }
    println!(
        "\nvs. alone: the row's total MiB/s over the alone windows' total. p50/p99: one \
         object's write + `fdatasync`, per window (range over windows)."
    );
    Ok(())
}
