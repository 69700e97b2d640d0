//! The fixture traces through every engine, with every byte verified on a
//! temporary device; the formats' round trips and damage; and an engine that
//! hands out a block twice, which verification must catch.

use std::path::{Path, PathBuf};

use blockalloc::{
    AllocError, Allocator, EngineKind, Extent, FreeError, Geometry, Status, VerifyError,
};
use blockalloc_bench::{
    replay, replay_engine, BenchEngine, CheckError, FoundData, Limits, Mode, NoObserver, Observer,
    PatternDevice, ReplayConfig, ReplayError, ReplayReport, RoundProgress, StopReason,
    TimerCalibration, TraceInfo,
};
use blockalloc_trace::{TraceError, TraceFormat, TraceOp, TraceSink, TraceSource, TraceSummary};

fn fixture(name: &str) -> PathBuf {
    // The trace format's fixtures, kept beside the format's crate.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../trace/tests/fixtures")
        .join(name)
}

/// Binary fixtures with their CSV twins (same operations).
const TWINS: [(&str, &str); 2] = [
    ("seed-32MiB.trace", "seed-32MiB.csv"),
    ("churn-32MiB.trace", "churn-32MiB.csv"),
];

const ALL: [&str; 6] = [
    "seed-32MiB.trace",
    "seed-32MiB.csv",
    "churn-32MiB.trace",
    "churn-32MiB.csv",
    "shift-64MiB.trace",
    "log-style.csv",
];

fn ops(path: &Path) -> Vec<TraceOp> {
    TraceSource::open(path)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn info(path: &Path, block_size: u64) -> TraceInfo {
    let mut src = TraceSource::open(path).unwrap();
    let summary = TraceSummary::scan(&mut src, block_size).unwrap();
    TraceInfo {
        name: path.display().to_string(),
        header: src.header().clone(),
        summary: Some(summary),
    }
}

/// The geometry a fixture was made for (log-style has no capacity: 16 MiB).
fn geometry(path: &Path) -> Geometry {
    let src = TraceSource::open(path).unwrap();
    let h = src.header();
    Geometry::new(
        h.capacity_bytes.unwrap_or(16 << 20),
        h.block_size.unwrap_or(4096),
    )
    .unwrap()
}

fn config(geo: Geometry, mode: Mode) -> ReplayConfig {
    ReplayConfig {
        mode,
        check_invariants: true,
        round_ops: None,
        ..ReplayConfig::new(geo)
    }
}

fn run_verified(
    engine: BenchEngine,
    path: &Path,
    cfg: &ReplayConfig,
) -> Result<ReplayReport, ReplayError> {
    let mut dev = PatternDevice::new(
        tempfile::tempfile().unwrap(),
        "test device".into(),
        cfg.geometry,
    )
    .unwrap();
    replay_engine(
        engine,
        TraceSource::open(path).unwrap(),
        &info(path, cfg.geometry.block_size()),
        cfg,
        Some(&mut dev),
        TimerCalibration::ZERO,
        &mut NoObserver,
    )
}

#[test]
fn every_fixture_through_every_engine_with_verification() {
    for name in ALL {
        let path = fixture(name);
        let geo = geometry(&path);
        let summary = info(&path, geo.block_size()).summary.unwrap();
        for mode in [Mode::Contiguous, Mode::Scattered] {
            let mut cfg = config(geo, mode);
            if summary.rounds == 0 {
                cfg.round_ops = Some(4);
            }
            for kind in EngineKind::ALL {
                let who = format!("{name} {kind} {mode}");
                let r = run_verified(BenchEngine::Core(kind), &path, &cfg)
                    .unwrap_or_else(|e| panic!("{who}: {e}"));
                let d = r.data_check.unwrap();
                let live_at_end = r.run.allocations - r.run.frees;
                assert_eq!(d.objects_written, r.run.allocations, "{who}");
                assert_eq!(
                    d.objects_checked,
                    r.run.frees + live_at_end,
                    "{who}: each freed object before its free, each live one at the end"
                );
                assert!(d.bytes_checked > 0, "{who}");
                match r.run.stopped {
                    StopReason::EndOfTrace => {
                        assert_eq!(r.requests_replayed, summary.requests(), "{who}");
                        assert!(r.run.utilization_at_first_failure.is_none());
                    }
                    StopReason::NoSpace => {
                        assert!(r.run.utilization_at_first_failure.unwrap() > 0.1, "{who}");
                        assert_eq!(r.failed_allocations, 1);
                    }
                    other => panic!("{who}: stopped {other}"),
                }
                assert!(r.run.rounds > 0, "{who}");
                assert_eq!(r.run.per_round.len() as u64, r.run.rounds);
            }
        }
    }
}

#[test]
fn generated_traces_end_with_an_allocation_nobody_can_serve() {
    for name in ["seed-32MiB.trace", "shift-64MiB.trace"] {
        let path = fixture(name);
        let geo = geometry(&path);
        for kind in EngineKind::ALL {
            let r = run_verified(
                BenchEngine::Core(kind),
                &path,
                &config(geo, Mode::Contiguous),
            )
            .unwrap();
            assert_eq!(r.run.stopped, StopReason::NoSpace, "{name} {kind}");
        }
    }
}

#[test]
fn binary_and_csv_twins_agree_and_convert_back_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    for (bin, csv) in TWINS {
        let (bin, csv) = (fixture(bin), fixture(csv));
        assert_eq!(ops(&bin), ops(&csv));
        let (hb, hc) = (
            TraceSource::open(&bin).unwrap().header().clone(),
            TraceSource::open(&csv).unwrap().header().clone(),
        );
        assert_eq!(hb, hc, "metadata survives conversion");
        for (from, to, format) in [
            (&bin, &csv, TraceFormat::Csv),
            (&csv, &bin, TraceFormat::Binary),
        ] {
            let out = dir.path().join("out");
            let src = TraceSource::open(from).unwrap();
            let sink = TraceSink::create(&out, Some(format), src.header()).unwrap();
            blockalloc_trace::convert(src, sink).unwrap();
            assert_eq!(
                std::fs::read(&out).unwrap(),
                std::fs::read(to).unwrap(),
                "{} -> {}",
                from.display(),
                to.display()
            );
        }
        // Same replay from either format.
        let geo = geometry(&bin);
        let a = run_verified(BenchEngine::default(), &bin, &config(geo, Mode::Contiguous)).unwrap();
        let b = run_verified(BenchEngine::default(), &csv, &config(geo, Mode::Contiguous)).unwrap();
        assert_eq!(
            (
                a.run.allocations,
                a.run.frees,
                a.run.rounds,
                a.run.final_status
            ),
            (
                b.run.allocations,
                b.run.frees,
                b.run.rounds,
                b.run.final_status
            )
        );
    }
}

#[test]
fn damaged_fixtures_are_typed_errors_naming_the_offset() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(fixture("churn-32MiB.trace")).unwrap();
    let read = |bytes: &[u8]| -> Result<Vec<TraceOp>, TraceError> {
        let p = dir.path().join("bad.trace");
        std::fs::write(&p, bytes).unwrap();
        TraceSource::open(&p)?.collect()
    };
    let e = read(&good[..good.len() / 2]).unwrap_err();
    assert!(matches!(e, TraceError::Truncated { .. }), "{e}");
    assert!(e.to_string().contains("byte offset"), "{e}");
    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 0x01;
    let e = read(&flipped).unwrap_err();
    match &e {
        TraceError::Corrupt { offset, what } => {
            assert!(*offset < good.len() as u64 / 2, "names the chunk: {offset}");
            assert!(what.contains("checksum"), "{what}");
        }
        other => panic!("{other}"),
    }
    assert!(e.is_bad_data());
    // A replay meets the same error as a value.
    let p = dir.path().join("bad.trace");
    std::fs::write(&p, &flipped).unwrap();
    let geo = geometry(&fixture("churn-32MiB.trace"));
    let r = replay_engine(
        BenchEngine::default(),
        TraceSource::open(&p).unwrap(),
        &TraceInfo::default(),
        &config(geo, Mode::Contiguous),
        None,
        TimerCalibration::ZERO,
        &mut NoObserver,
    );
    assert!(matches!(
        r,
        Err(ReplayError::Trace(TraceError::Corrupt { .. }))
    ));
}

/// An engine that, once, hands out (part of) the extent it handed out just
/// before — still live — instead of fresh space. Its bookkeeping stays
/// consistent (the fake extent's free is swallowed), so only the data can
/// tell.
struct DoubleHandOut {
    inner: Box<dyn Allocator>,
    calls: u64,
    at: u64,
    last: Option<Extent>,
    fake: Option<Extent>,
}

impl DoubleHandOut {
    fn new(at: u64, capacity: u64) -> Self {
        DoubleHandOut {
            inner: EngineKind::Bitmap.build(capacity).unwrap(),
            calls: 0,
            at,
            last: None,
            fake: None,
        }
    }
}

impl Allocator for DoubleHandOut {
    fn name(&self) -> &'static str {
        "double-hand-out"
    }
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }
    fn used(&self) -> u64 {
        self.inner.used()
    }
    fn allocate(&mut self, len: u64, hint: Option<u64>) -> Result<Extent, AllocError> {
        self.calls += 1;
        if self.calls >= self.at && self.fake.is_none() {
            if let Some(prev) = self.last.filter(|p| p.len() >= len) {
                let e = Extent::new(prev.start(), len).unwrap();
                self.fake = Some(e);
                return Ok(e);
            }
        }
        let e = self.inner.allocate(len, hint)?;
        self.last = Some(e);
        Ok(e)
    }
    fn allocate_scattered(&mut self, len: u64, out: &mut Vec<Extent>) -> Result<(), AllocError> {
        out.push(self.allocate(len, None)?);
        Ok(())
    }
    fn free(&mut self, extent: Extent) -> Result<(), FreeError> {
        if self.fake == Some(extent) {
            return Ok(());
        }
        self.inner.free(extent)
    }
    fn status(&self) -> Status {
        self.inner.status()
    }
    fn memory_bytes(&self) -> usize {
        self.inner.memory_bytes()
    }
    fn for_each_free_extent(&self, f: &mut dyn FnMut(Extent)) {
        self.inner.for_each_free_extent(f)
    }
    fn verify(&self) -> Result<(), VerifyError> {
        self.inner.verify()
    }
}

fn replay_broken(
    path: &Path,
    at: u64,
    device: Option<&mut PatternDevice>,
) -> Result<ReplayReport, ReplayError> {
    let geo = geometry(path);
    replay(
        Box::new(DoubleHandOut::new(at, geo.capacity_blocks())),
        TraceSource::open(path).unwrap(),
        &info(path, geo.block_size()),
        &config(geo, Mode::Contiguous),
        device,
        TimerCalibration::ZERO,
        &mut NoObserver,
    )
}

#[test]
fn verification_catches_a_block_handed_out_twice() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("two.csv");
    std::fs::write(
        &path,
        "# capacity_bytes=1MiB\n# block_size=4096\nalloc,10,16KiB\nalloc,11,8KiB\nfree,10\nfree,11\n",
    )
    .unwrap();
    // Without data verification the bug goes unnoticed.
    let r = replay_broken(&path, 2, None).unwrap();
    assert_eq!(r.run.stopped, StopReason::EndOfTrace);

    let geo = geometry(&path);
    let mut dev = PatternDevice::new(tempfile::tempfile().unwrap(), "dev".into(), geo).unwrap();
    let e = replay_broken(&path, 2, Some(&mut dev)).unwrap_err();
    assert!(e.is_engine_fault());
    let msg = e.to_string();
    match e {
        ReplayError::Data {
            engine,
            op,
            source: CheckError::Mismatch(m),
        } => {
            assert_eq!(engine, "double-hand-out");
            assert_eq!(op, Some(3), "caught at the free of object 10");
            assert_eq!((m.object, m.block_index), (10, 0));
            assert_eq!(
                m.found_data,
                FoundData::Object {
                    object: 11,
                    block_index: 0
                }
            );
        }
        other => panic!("{other}"),
    }
    assert!(
        msg.contains("operation 3: data check failed: object 10 block 0 (device block"),
        "{msg}"
    );
    assert!(msg.contains("object 11's block 0"), "{msg}");
}

#[test]
fn verification_catches_it_in_a_long_trace_too() {
    let path = fixture("churn-32MiB.trace");
    let geo = geometry(&path);
    for at in [50, 1200, 2400] {
        let r = replay_broken(&path, at, None);
        assert!(r.is_ok(), "unnoticed without verification");
        let mut dev = PatternDevice::new(tempfile::tempfile().unwrap(), "dev".into(), geo).unwrap();
        match replay_broken(&path, at, Some(&mut dev)) {
            Err(ReplayError::Data {
                source: CheckError::Mismatch(m),
                ..
            }) => {
                assert!(
                    matches!(m.found_data, FoundData::Object { object, .. } if object != m.object),
                    "at {at}: {m}"
                );
            }
            other => panic!("at {at}: {other:?}"),
        }
    }
}

#[test]
fn keep_going_skips_the_frees_of_failed_objects() {
    let path = fixture("seed-32MiB.trace");
    let geo = Geometry::parse("8MiB", "4KiB").unwrap();
    let cfg = ReplayConfig {
        keep_going: true,
        ..config(geo, Mode::Contiguous)
    };
    let mut dev = PatternDevice::new(tempfile::tempfile().unwrap(), "d".into(), geo).unwrap();
    let r = replay_engine(
        BenchEngine::default(),
        TraceSource::open(&path).unwrap(),
        &info(&path, 4096),
        &cfg,
        Some(&mut dev),
        TimerCalibration::ZERO,
        &mut NoObserver,
    )
    .unwrap();
    assert_eq!(r.run.stopped, StopReason::EndOfTrace);
    assert!(r.failed_allocations > 10, "{}", r.failed_allocations);
    assert!(r.skipped_frees > 0);
    assert!(r.run.utilization_at_first_failure.is_some());
    let s = info(&path, 4096).summary.unwrap();
    assert_eq!(r.run.allocations + r.failed_allocations, s.allocs);
    assert_eq!(r.run.frees + r.skipped_frees, s.frees);
}

#[test]
fn limits_and_invalid_traces() {
    let path = fixture("churn-32MiB.trace");
    let geo = geometry(&path);
    let run = |cfg: &ReplayConfig, path: &Path| {
        replay_engine(
            BenchEngine::default(),
            TraceSource::open(path).unwrap(),
            &TraceInfo::default(),
            cfg,
            None,
            TimerCalibration::ZERO,
            &mut NoObserver,
        )
    };
    let cfg = ReplayConfig {
        limits: Limits {
            max_ops: Some(777),
            ..Limits::default()
        },
        ..config(geo, Mode::Contiguous)
    };
    let r = run(&cfg, &path).unwrap();
    assert_eq!(r.run.stopped, StopReason::MaxOps);
    assert_eq!(r.requests_replayed, 777);
    assert_eq!(r.run.allocations + r.run.frees, 777);
    let cfg = ReplayConfig {
        limits: Limits {
            max_rounds: Some(3),
            ..Limits::default()
        },
        ..config(geo, Mode::Contiguous)
    };
    let r = run(&cfg, &path).unwrap();
    assert_eq!((r.run.stopped, r.run.rounds), (StopReason::MaxRounds, 3));

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "alloc,1,4096\nround\nfree,2\n").unwrap();
    let e = run(&config(geo, Mode::Contiguous), &bad).unwrap_err();
    assert!(e.to_string().contains("operation 3"), "{e}");
    assert!(e.to_string().contains("object 2"), "{e}");
    std::fs::write(&bad, "alloc,1,4096\nalloc,1,4096\n").unwrap();
    let e = run(&config(geo, Mode::Contiguous), &bad).unwrap_err();
    assert!(e.to_string().contains("operation 2"), "{e}");
    assert!(e.to_string().contains("already live"), "{e}");
}

/// Replays speak to the same observer as bench runs: one call per round,
/// whose allocations and frees add up to the report's.
#[test]
fn replay_rounds_reach_the_observer_with_their_counts() {
    #[derive(Default)]
    struct Tally {
        rounds: u64,
        allocs: u64,
        frees: u64,
        requests: u64,
    }
    impl Observer<ReplayReport, ReplayError> for Tally {
        fn round_finished(&mut self, p: &RoundProgress<'_>) {
            self.rounds += 1;
            assert_eq!(p.record.round, self.rounds);
            self.allocs += p.allocs;
            self.frees += p.frees;
            assert!(p.requests >= self.requests, "requests only grow");
            self.requests = p.requests;
        }
    }
    let path = fixture("churn-32MiB.trace");
    let geo = geometry(&path);
    let mut tally = Tally::default();
    let r = replay_engine(
        BenchEngine::default(),
        TraceSource::open(&path).unwrap(),
        &info(&path, geo.block_size()),
        &config(geo, Mode::Contiguous),
        None,
        TimerCalibration::ZERO,
        &mut tally,
    )
    .unwrap();
    assert_eq!(tally.rounds, r.run.rounds);
    assert_eq!(
        (tally.allocs, tally.frees),
        (r.run.allocations, r.run.frees)
    );
    assert_eq!(tally.requests, r.requests_replayed);
}
