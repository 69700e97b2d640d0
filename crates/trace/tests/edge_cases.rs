//! Traces at the edges of the format, read through the library: what each
//! is taken to mean (the CLI's answers are in `crates/cli/tests/trace.rs`).

use std::io::Cursor;

use blockalloc_trace::{TraceFormat, TraceHeader, TraceOp, TraceSink, TraceSource, TraceSummary};

fn source(text: &str) -> TraceSource {
    TraceSource::from_reader(Cursor::new(text.as_bytes().to_vec())).unwrap()
}

fn ops(src: TraceSource) -> Vec<TraceOp> {
    src.map(Result::unwrap).collect()
}

#[test]
fn an_empty_or_header_only_csv_is_a_valid_trace_without_operations() {
    for text in [
        "",
        "\n\n",
        "op,object,bytes\n",
        "# capacity_bytes=4096\nop,object,bytes\n",
    ] {
        let mut src = source(text);
        assert_eq!(src.format(), TraceFormat::Csv, "{text:?}");
        let s = TraceSummary::scan(&mut src, 4096).unwrap();
        assert_eq!((s.ops, s.requests()), (0, 0), "{text:?}");
    }
}

#[test]
fn an_empty_binary_trace_round_trips() {
    let header = TraceHeader {
        block_size: Some(4096),
        capacity_bytes: Some(1 << 20),
        meta: Vec::new(),
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.trace");
    TraceSink::create(&path, Some(TraceFormat::Binary), &header)
        .unwrap()
        .finish()
        .unwrap();
    let mut src = TraceSource::open(&path).unwrap();
    assert_eq!(src.header().capacity_bytes, Some(1 << 20));
    assert_eq!(TraceSummary::scan(&mut src, 4096).unwrap().ops, 0);
}

#[test]
fn crlf_line_ends_read_as_lf() {
    let lf = "# capacity_bytes=1048576\n# workload=seed\nop,object,bytes\nalloc,1,4096\nfree,1,\nround,,2\n";
    let crlf = lf.replace('\n', "\r\n");
    let (a, b) = (source(lf), source(&crlf));
    assert_eq!(a.header(), b.header());
    assert_eq!(b.header().capacity_bytes, Some(1 << 20));
    assert_eq!(ops(a), ops(b));
}

#[test]
fn a_zero_byte_allocation_is_valid_and_counts_one_block() {
    let mut src = source("alloc,1,0\nalloc,2,1\nfree,1\n");
    let s = TraceSummary::scan(&mut src, 4096).unwrap();
    assert_eq!((s.allocs, s.frees), (2, 1));
    assert_eq!(s.min_object_bytes, Some(0));
    assert_eq!(s.peak_live_blocks, 2, "every object takes a block at least");
}

#[test]
fn a_capacity_of_u64_max_bytes_is_kept_through_both_formats() {
    let header = TraceHeader {
        block_size: Some(4096),
        capacity_bytes: Some(u64::MAX),
        meta: Vec::new(),
    };
    let dir = tempfile::tempdir().unwrap();
    for format in [TraceFormat::Binary, TraceFormat::Csv] {
        let path = dir.path().join(format!("max.{format}"));
        let mut sink = TraceSink::create(&path, Some(format), &header).unwrap();
        sink.write(TraceOp::Alloc {
            object: 1,
            bytes: 4096,
        })
        .unwrap();
        sink.finish().unwrap();
        let src = TraceSource::open(&path).unwrap();
        assert_eq!(src.header().capacity_bytes, Some(u64::MAX), "{format}");
    }
}
