//! `blockalloc trace …`, `blockalloc replay` and `bench --record/--plot` as
//! scripts use them.

use std::path::Path;
use std::process::{Command, Output};

use blockalloc_bench::{CONTRACT_FIELDS, LATENCY_FIELDS, ROUND_FIELDS};
use serde_json::Value;

fn blockalloc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_blockalloc"))
        .args(args)
        .output()
        .expect("run blockalloc")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(args: &[&str]) -> Output {
    let out = blockalloc(args);
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

fn json_lines(out: &Output) -> Vec<Value> {
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each stdout line is JSON"))
        .collect()
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A small seed trace: fills 1 GiB in about ten rounds of 100 requests.
fn seed_trace(dir: &Path) -> std::path::PathBuf {
    gen_seed(dir, "1GiB", "100")
}

fn gen_seed(dir: &Path, capacity: &str, round_size: &str) -> std::path::PathBuf {
    let path = dir.join(format!("seed-{capacity}.trace"));
    ok(&[
        "trace",
        "gen",
        "--workload",
        "seed",
        "--capacity",
        capacity,
        "--round-size",
        round_size,
        "-o",
        p(&path),
    ]);
    path
}

/// `trace gen` takes every bench workload, and says which flags a workload
/// does not use.
#[test]
fn gen_takes_every_bench_workload() {
    let dir = tempfile::tempdir().unwrap();
    for workload in ["seed", "shift", "fill-shift", "aging"] {
        let path = dir.path().join(format!("{workload}.trace"));
        ok(&[
            "trace",
            "gen",
            "--workload",
            workload,
            "--capacity",
            "64MiB",
            "--round-size",
            "50",
            "-o",
            p(&path),
        ]);
        let out = ok(&["trace", "info", p(&path), "--json", "-"]);
        assert!(text(&out.stdout).contains(workload), "{workload}");
    }
    let out = blockalloc(&[
        "trace",
        "gen",
        "--workload",
        "fill-shift",
        "--free-prob",
        "0.5",
        "--capacity",
        "64MiB",
        "-o",
        "-",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains(
            "--free-prob does not apply to the fill-shift workload (only to seed, lognormal)"
        ),
        "{err}"
    );
}

#[test]
fn gen_then_replay_follows_the_bench_contract_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let trace = seed_trace(dir.path());
    let svg = dir.path().join("replay.svg");
    let out = ok(&[
        "replay",
        p(&trace),
        "--engine",
        "all",
        "--json",
        "-",
        "--plot",
        p(&svg),
    ]);
    let lines = json_lines(&out);
    assert!(lines.len() >= 4, "one line per engine");
    for v in &lines {
        for field in CONTRACT_FIELDS {
            assert!(v.get(field).is_some(), "missing {field}: {v}");
        }
        for stat in LATENCY_FIELDS {
            assert!(v["alloc_ns"].get(stat).is_some(), "alloc_ns.{stat}");
        }
        assert_eq!(v["stopped"], "no_space");
        assert_eq!(v["capacity_bytes"], 1u64 << 30);
        assert_eq!(v["workload"], "seed");
        assert!(v["utilization_at_first_failure"].as_f64().unwrap() > 0.3);
        let rounds = v["per_round"].as_array().unwrap();
        assert_eq!(rounds.len() as u64, v["rounds"]);
        for r in rounds {
            for field in ROUND_FIELDS {
                assert!(r[field].is_number(), "per_round.{field}: {r}");
            }
            assert!(r["round"].is_u64());
        }
        assert!(v["trace"].as_str().unwrap().ends_with("seed-1GiB.trace"));
        assert!(v["data_check"].is_null());
    }
    let err = text(&out.stderr);
    assert!(
        err.contains("util@fail"),
        "table on stderr with --json -: {err}"
    );
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg"));
    // Series lines are 2 px wide, axes and grid 1 px: two panels per engine.
    let series = svg
        .split("<polyline")
        .filter(|s| s.split('>').next().unwrap().contains("stroke-width=\"2\""))
        .count();
    assert_eq!(series, 2 * lines.len(), "one line per engine in each panel");
    for v in &lines {
        assert!(
            svg.contains(v["engine"].as_str().unwrap()),
            "legend names {}",
            v["engine"]
        );
    }
}

#[test]
fn bench_record_replays_to_the_same_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("bench.trace");
    let svg = dir.path().join("bench.svg");
    let bench = ok(&[
        "bench",
        "--capacity",
        "1GiB",
        "--round-size",
        "100",
        "--engine",
        "segfit,pool",
        "--json",
        "-",
        "--record",
        p(&rec),
        "--plot",
        p(&svg),
    ]);
    assert!(
        text(&bench.stderr).contains("recorded"),
        "{}",
        text(&bench.stderr)
    );
    let replay = ok(&[
        "replay",
        p(&rec),
        "--engine",
        "segfit,pool",
        "--json",
        "-",
        "-q",
    ]);
    let (a, b) = (json_lines(&bench), json_lines(&replay));
    assert_eq!(a.len(), 2);
    for (x, y) in a.iter().zip(&b) {
        for field in [
            "engine",
            "stopped",
            "utilization_at_first_failure",
            "allocations",
            "frees",
            "rounds",
            "final_utilization",
            "seed",
            "round_size",
            "free_prob",
        ] {
            assert_eq!(x[field], y[field], "{field} of {}", x["engine"]);
        }
    }
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains("segfit (first failure at"));
    assert!(svg.contains("pool (first failure at"));

    let out = blockalloc(&["bench", "--record", p(&rec), "--threads", "2"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn verify_on_a_device_file() {
    let dir = tempfile::tempdir().unwrap();
    let trace = gen_seed(dir.path(), "128MiB", "20");
    let dev = dir.path().join("dev.img");
    let out = ok(&[
        "replay",
        p(&trace),
        "--engine",
        "segfit,bitmap",
        "--verify",
        "--device",
        p(&dev),
        "--json",
        "-",
    ]);
    for v in json_lines(&out) {
        let d = &v["data_check"];
        assert_eq!(d["objects_written"], v["allocations"]);
        assert!(d["bytes_checked"].as_u64().unwrap() > 64 << 20);
        assert!(d["write_mib_per_sec"].as_f64().unwrap() > 0.0);
        assert!(d["check_mib_per_sec"].as_f64().unwrap() > 0.0);
    }
    assert!(text(&out.stderr).contains("compared byte by byte"));
    assert_eq!(std::fs::metadata(&dev).unwrap().len(), 128 << 20);

    // An existing device is not overwritten without --force.
    let again = blockalloc(&["replay", p(&trace), "--verify", "--device", p(&dev)]);
    assert_eq!(again.status.code(), Some(2));
    assert!(text(&again.stderr).contains("--force"));
    ok(&[
        "replay",
        p(&trace),
        "--verify",
        "--device",
        p(&dev),
        "--force",
        "-q",
    ]);
    // Without --device: a temporary file.
    ok(&["replay", p(&trace), "--verify", "-q"]);
    // --device only with --verify.
    let out = blockalloc(&["replay", p(&trace), "--device", p(&dev)]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn convert_round_trips_and_info_summarises() {
    let dir = tempfile::tempdir().unwrap();
    let trace = seed_trace(dir.path());
    let csv = dir.path().join("seed.csv");
    let back = dir.path().join("back.bin");
    ok(&["trace", "convert", p(&trace), "-o", p(&csv)]);
    let head = std::fs::read_to_string(&csv).unwrap();
    assert!(
        head.contains("\nop,object,bytes\nalloc,0,"),
        "{}",
        &head[..300]
    );
    assert!(head.contains("# capacity_bytes=1073741824\n"));
    ok(&["trace", "convert", p(&csv), "-o", p(&back)]);
    assert_eq!(
        std::fs::read(&trace).unwrap(),
        std::fs::read(&back).unwrap()
    );

    let out = ok(&["trace", "info", p(&csv), "--json"]);
    let v: Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    assert_eq!(v["format"], "csv");
    assert_eq!(v["meta"]["workload"], "seed");
    let s = &v["summary"];
    assert_eq!(
        s["ops"].as_u64().unwrap(),
        s["allocs"].as_u64().unwrap()
            + s["frees"].as_u64().unwrap()
            + s["rounds"].as_u64().unwrap()
    );
    assert!(
        s["peak_live_blocks"].as_u64().unwrap() > 262_144,
        "ends past the capacity"
    );
    let out = ok(&["trace", "info", p(&trace)]);
    assert!(text(&out.stdout).contains("peak live"));

    for w in ["shift", "lognormal", "lognormal:256KiB:1", "churn"] {
        let f = dir.path().join("w.csv");
        let mut args = vec!["trace", "gen", "--workload", w, "--capacity", "64MiB"];
        args.extend(["--round-size", "50", "--max-ops", "3000", "-o", p(&f)]);
        let out = ok(&args);
        assert!(text(&out.stderr).contains("it ends because"), "{w}");
        ok(&["trace", "info", p(&f)]);
    }
}

#[test]
fn bad_input_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let trace = seed_trace(dir.path());
    let mut bytes = std::fs::read(&trace).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    let bad = dir.path().join("bad.trace");
    std::fs::write(&bad, &bytes).unwrap();
    for args in [
        vec!["replay", p(&bad)],
        vec!["trace", "info", p(&bad)],
        vec!["trace", "convert", p(&bad), "-o", "-"],
    ] {
        let out = blockalloc(&args);
        assert_eq!(out.status.code(), Some(4), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains("corrupt trace at byte offset"), "{err}");
    }
    std::fs::write(&bad, &bytes[..mid]).unwrap();
    let out = blockalloc(&["replay", p(&bad)]);
    assert_eq!(out.status.code(), Some(4));
    assert!(text(&out.stderr).contains("truncated"));

    let csv = dir.path().join("log.csv");
    std::fs::write(&csv, "alloc,1,4096\nfree,1\nfree,1\n").unwrap();
    let out = blockalloc(&["replay", p(&csv)]);
    assert_eq!(out.status.code(), Some(2), "no capacity");
    assert!(text(&out.stderr).contains("--capacity"));
    let out = blockalloc(&["replay", p(&csv), "--capacity", "1GiB"]);
    assert_eq!(out.status.code(), Some(4));
    assert!(text(&out.stderr).contains("operation 3 (line 3): free of object 1"));
    std::fs::write(&csv, "alloc,1,4096\nmove,1\n").unwrap();
    let out = blockalloc(&["trace", "info", p(&csv)]);
    assert_eq!(out.status.code(), Some(4));
    assert!(text(&out.stderr).contains("line 2"));

    let out = blockalloc(&["replay", "/nonexistent/x.trace"]);
    assert_eq!(out.status.code(), Some(1));
    for args in [
        &[
            "trace",
            "gen",
            "--capacity",
            "1GiB",
            "--workload",
            "zipf",
            "-o",
            "-",
        ][..],
        &[
            "trace",
            "gen",
            "--capacity",
            "1GiB",
            "--workload",
            "shift",
            "--free-prob",
            "0.5",
            "-o",
            "-",
        ],
        &[
            "trace",
            "gen",
            "--capacity",
            "1GiB",
            "--fill",
            "0.5",
            "-o",
            "-",
        ],
        &["trace", "gen", "--workload", "seed", "-o", "-"],
        &["replay", "-"],
    ] {
        let out = blockalloc(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn keep_going_and_round_ops() {
    let dir = tempfile::tempdir().unwrap();
    let trace = seed_trace(dir.path());
    let out = ok(&[
        "replay",
        p(&trace),
        "--capacity",
        "256MiB",
        "--keep-going",
        "--round-ops",
        "100",
        "--json",
        "-",
        "-q",
    ]);
    let v = &json_lines(&out)[0];
    assert_eq!(v["stopped"], "end_of_trace");
    assert!(v["failed_allocations"].as_u64().unwrap() > 0);
    assert!(v["utilization_at_first_failure"].as_f64().is_some());
    assert_eq!(v["round_size"], 100);
    assert!(v["rounds"].as_u64().unwrap() >= 13);
}

#[test]
fn help_is_complete() {
    let out = ok(&["replay", "--help"]);
    let help = text(&out.stdout);
    for needle in [
        "--engine",
        "--capacity",
        "--block-size",
        "--mode",
        "--verify",
        "--device",
        "--force",
        "--keep-going",
        "--round-ops",
        "--max-ops",
        "--max-rounds",
        "--time-limit",
        "--json",
        "--plot",
        "--verbose",
        "--quiet",
        "DATA VERIFICATION",
        "EXIT STATUS",
        "HOW LATENCY IS MEASURED",
    ] {
        assert!(help.contains(needle), "replay help lacks {needle}");
    }
    let out = ok(&["trace", "gen", "--help"]);
    let help = text(&out.stdout);
    for needle in [
        "WHERE A TRACE ENDS",
        "churn",
        "lognormal",
        "--volume",
        "--fill",
        "--max-ops",
    ] {
        assert!(help.contains(needle), "gen help lacks {needle}");
    }
    let out = ok(&["trace", "--help"]);
    assert!(text(&out.stdout).contains("FORMATS"));
    let out = ok(&["bench", "--help"]);
    let help = text(&out.stdout);
    assert!(help.contains("--record") && help.contains("--plot"));
    let out = ok(&["--help"]);
    let help = text(&out.stdout);
    assert!(help.contains("replay") && help.contains("trace"));
}

#[test]
fn convert_refuses_what_info_and_replay_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("out.trace");
    for (name, body, needle) in [
        (
            "unknown-free.csv",
            "alloc,1,4096\nfree,2\n",
            "free of object 2",
        ),
        (
            "duplicate.csv",
            "alloc,1,4096\nalloc,1,8192\n",
            "already live",
        ),
        (
            "huge.csv",
            "alloc,1,4096\nalloc,2,18446744073709551615\n",
            "18446744073709551615 bytes for object 2",
        ),
    ] {
        let trace = dir.path().join(name);
        std::fs::write(&trace, format!("# capacity_bytes=64MiB\n{body}")).unwrap();
        let mut errors = Vec::new();
        for args in [
            vec!["trace", "info", p(&trace)],
            vec!["replay", p(&trace), "-q"],
            vec!["trace", "convert", p(&trace), "-o", p(&out_path)],
            vec!["trace", "convert", p(&trace), "-o", "-"],
        ] {
            let out = blockalloc(&args);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(4), "{args:?}: {err}");
            assert!(err.contains("operation 2 (line 3)"), "{args:?}: {err}");
            assert!(err.contains(needle), "{args:?}: {err}");
            errors.push(err);
        }
        assert!(errors.windows(2).all(|w| w[0] == w[1]), "{errors:?}");
        assert!(!out_path.exists(), "{name}: no partial output");
    }
}

#[test]
fn a_failed_convert_leaves_the_output_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.csv");
    std::fs::write(&good, "alloc,1,4096\nfree,1\n").unwrap();
    let out_path = dir.path().join("out.trace");
    ok(&["trace", "convert", p(&good), "-o", p(&out_path)]);
    let before = std::fs::read(&out_path).unwrap();
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "alloc,1,4096\nfree,1\nfree,1\n").unwrap();
    let out = blockalloc(&["trace", "convert", p(&bad), "-o", p(&out_path)]);
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(std::fs::read(&out_path).unwrap(), before);
    // Converting a file onto itself reads it whole before replacing it.
    let csv = dir.path().join("self.csv");
    std::fs::write(&csv, "alloc,1,4096\nfree,1\n").unwrap();
    ok(&[
        "trace",
        "convert",
        p(&csv),
        "-o",
        p(&csv),
        "--format",
        "csv",
    ]);
    let out = ok(&["trace", "info", p(&csv), "--json"]);
    let v: Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    assert_eq!(v["summary"]["ops"], 2);
}

#[test]
fn info_json_carries_the_size_bucket_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    std::fs::write(
        &csv,
        "alloc,1,0\nalloc,2,4096\nalloc,3,5000\nalloc,4,4095\n",
    )
    .unwrap();
    let out = ok(&["trace", "info", p(&csv), "--json"]);
    let v: Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    // The counts stay where they were.
    assert_eq!(v["summary"]["size_histogram"][13], 2);
    let buckets = v["size_buckets"].as_array().unwrap();
    let as_tuple = |b: &Value| {
        (
            b["min_bytes"].as_u64().unwrap(),
            b["max_bytes"].as_u64().unwrap(),
            b["objects"].as_u64().unwrap(),
        )
    };
    let got: Vec<_> = buckets.iter().map(as_tuple).collect();
    assert_eq!(got, vec![(0, 0, 1), (2048, 4095, 1), (4096, 8191, 2)]);
}

/// A churn bench ends with its workload; the trace it records replays to
/// the same run.
#[test]
fn bench_churn_records_a_trace_that_replays_the_same_run() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("churn.trace");
    let bench = ok(&[
        "bench",
        "--workload",
        "churn",
        "--capacity",
        "256MiB",
        "--round-size",
        "100",
        "--churn-volume",
        "0.5",
        "--churn-fill",
        "0.9",
        "--engine",
        "segfit",
        "--json",
        "-",
        "-q",
        "--record",
        p(&rec),
    ]);
    let replay = ok(&["replay", p(&rec), "--engine", "segfit", "--json", "-", "-q"]);
    let (a, b) = (&json_lines(&bench)[0], &json_lines(&replay)[0]);
    assert_eq!(a["stopped"], "end_of_workload", "{a}");
    assert_eq!(b["stopped"], "end_of_trace", "{b}");
    assert_eq!(b["workload"], "churn");
    assert!(a["allocations"].as_u64().unwrap() > 1000, "{a}");
    for field in ["allocations", "frees", "rounds", "final_utilization"] {
        assert_eq!(a[field], b[field], "{field}");
    }
}

/// Every field of the JSON contract is named in the help of the commands
/// that write it, however the list grows.
#[test]
fn help_lists_every_contract_field() {
    for cmd in ["bench", "replay"] {
        let help = text(&ok(&[cmd, "--help"]).stdout);
        for field in CONTRACT_FIELDS
            .iter()
            .chain(&LATENCY_FIELDS)
            .chain(&ROUND_FIELDS)
        {
            assert!(help.contains(field), "`{cmd} --help` lacks {field}");
        }
    }
}

/// Every workload of the registry is a `trace gen` workload, and an unknown
/// name's message lists them all.
#[test]
fn trace_gen_knows_every_workload_of_the_registry() {
    let dir = tempfile::tempdir().unwrap();
    for w in blockalloc_bench::WORKLOADS {
        let path = dir.path().join(format!("{}.trace", w.name));
        ok(&[
            "trace",
            "gen",
            "--workload",
            w.name,
            "--capacity",
            "64MiB",
            "--round-size",
            "100",
            "--max-ops",
            "2000",
            "-o",
            p(&path),
        ]);
        let info = text(&ok(&["trace", "info", p(&path)]).stdout);
        assert!(info.contains(w.name), "{info}");
    }
    let out = blockalloc(&[
        "trace",
        "gen",
        "--workload",
        "nope",
        "--capacity",
        "1GiB",
        "-o",
        "-",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    for w in blockalloc_bench::WORKLOADS {
        assert!(err.contains(w.name), "{err} lacks {}", w.name);
    }
}

/// Writes `body` as `dir/name`.
fn write_trace(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path
}

#[test]
fn a_trace_without_allocations_or_frees_is_valid_but_replay_refuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, body: &str| write_trace(dir.path(), name, body);
    let binary = dir.path().join("converted.trace");
    // No allocations or frees: a valid, empty trace. info and convert
    // describe and copy it; replay has nothing to measure and says so.
    for (name, body, rounds) in [
        ("empty.csv", "", 0),
        ("columns-only.csv", "op,object,bytes\n", 0),
        (
            "header-only.csv",
            "# blockalloc trace (op,object,bytes)\n# block_size=4096\n# capacity_bytes=1048576\nop,object,bytes\n",
            0,
        ),
        ("rounds-only.csv", "# capacity_bytes=1048576\nround,,1\n", 1),
    ] {
        let trace = write(name, body);
        let out = ok(&["trace", "info", p(&trace)]);
        let expect = format!("operations {rounds} (0 allocs, 0 frees, {rounds} round markers)");
        assert!(text(&out.stdout).contains(&expect), "{name}: {}", text(&out.stdout));
        ok(&["trace", "convert", p(&trace), "-o", p(&binary)]);
        for t in [&trace, &binary] {
            let out = blockalloc(&["replay", p(t), "--capacity", "1MiB"]);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{name}: {err}");
            assert!(
                err.contains(&format!(
                    "{} holds no allocations or frees ({rounds} round markers): nothing to replay",
                    p(t)
                )),
                "{name}: {err}"
            );
            assert!(out.stdout.is_empty(), "{name}: {}", text(&out.stdout));
        }
    }
}

#[test]
fn crlf_line_ends_read_as_lf() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, body: &str| write_trace(dir.path(), name, body);
    // CRLF line ends read as LF ones: the same operations, header included.
    let lf = "# capacity_bytes=1048576\nop,object,bytes\nalloc,1,4096\nalloc,0x2,8KiB\nfree,1,\nround,,1\n";
    let crlf = write("crlf.csv", &lf.replace('\n', "\r\n"));
    let lf = write("lf.csv", lf);
    let as_csv = |t: &Path| ok(&["trace", "convert", p(t), "--format", "csv", "-o", "-"]).stdout;
    assert_eq!(text(&as_csv(&crlf)), text(&as_csv(&lf)));
    let out = ok(&["trace", "info", p(&crlf)]);
    assert!(
        text(&out.stdout).contains("capacity 1 MiB"),
        "{}",
        text(&out.stdout)
    );
    ok(&["replay", p(&crlf), "-q"]);
}

#[test]
fn a_zero_byte_allocation_is_valid_and_replays_as_one_block() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, body: &str| write_trace(dir.path(), name, body);
    let binary = dir.path().join("converted.trace");
    // A zero-byte allocation is valid: it replays as one block, as every
    // size is rounded up to whole blocks, at least one.
    let zero = write("zero.csv", "# capacity_bytes=1048576\nalloc,1,0\nfree,1,\n");
    let out = ok(&["trace", "info", p(&zero)]);
    assert!(
        text(&out.stdout).contains("0 B to 0 B"),
        "{}",
        text(&out.stdout)
    );
    let out = ok(&["replay", p(&zero), "--json", "-"]);
    let runs = json_lines(&out);
    assert_eq!(runs[0]["allocations"], 1, "{runs:?}");
    assert!(
        text(&out.stderr).contains("peak live 1 blocks"),
        "{}",
        text(&out.stderr)
    );
    ok(&["trace", "convert", p(&zero), "-o", p(&binary)]);
    let back = ok(&["trace", "convert", p(&binary), "--format", "csv", "-o", "-"]);
    assert!(
        text(&back.stdout).contains("alloc,1,0\n"),
        "{}",
        text(&back.stdout)
    );
}

#[test]
fn a_capacity_of_u64_max_replays_but_verify_refuses_a_device_that_long() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, body: &str| write_trace(dir.path(), name, body);
    // A capacity of u64::MAX bytes: rounded down to whole blocks, which the
    // extent engines replay; a --verify device cannot be that long, and
    // says so before anything runs (and leaves no file behind).
    let max = write(
        "max.csv",
        "# capacity_bytes=18446744073709551615\nalloc,1,4096\nfree,1,\n",
    );
    ok(&["trace", "info", p(&max)]);
    ok(&["replay", p(&max), "-q"]);
    let device = dir.path().join("device");
    for args in [
        vec!["replay", p(&max), "--verify"],
        vec!["replay", p(&max), "--verify", "--device", p(&device)],
    ] {
        let out = blockalloc(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("cannot be made 18446744073709547520 bytes long")
                && err.contains("replay a smaller --capacity"),
            "{args:?}: {err}"
        );
        assert!(!device.exists(), "{args:?}");
    }
}

#[test]
fn a_bad_trace_is_reported_with_its_file_name() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("bad.csv");
    std::fs::write(&trace, "# capacity_bytes=1MiB\nalloc,1,4096\nfree,2,\n").unwrap();
    let out_path = dir.path().join("out.trace");
    for args in [
        vec!["trace", "info", p(&trace)],
        vec!["replay", p(&trace)],
        vec!["trace", "convert", p(&trace), "-o", p(&out_path)],
    ] {
        let out = blockalloc(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{args:?}: {err}");
        assert!(
            err.contains(&format!(
                "{}: operation 2 (line 3): free of object 2",
                p(&trace)
            )),
            "{args:?}: {err}"
        );
    }
}
