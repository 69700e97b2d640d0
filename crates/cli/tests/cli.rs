//! The `blockalloc` binary as scripts use it.

use std::process::{Command, Output};

use serde_json::Value;

fn blockalloc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_blockalloc"))
        .args(args)
        .output()
        .expect("run blockalloc")
}

/// Each line of `stdout` as JSON.
fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A small, fast bench: every engine fills 1 GiB in a few rounds.
const TINY: [&str; 4] = ["--capacity", "1GiB", "--round-size", "100"];

#[test]
fn help_is_complete() {
    let out = blockalloc(&["bench", "--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for flag in [
        "--capacity",
        "--block-size",
        "--round-size",
        "--free-prob",
        "--sizes",
        "--mode",
        "--engine",
        "--workload",
        "--seed",
        "--max-rounds",
        "--max-ops",
        "--time-limit",
        "--json",
        "--verify",
        "--verbose",
        "--quiet",
        "HOW LATENCY IS MEASURED",
        "One operation in 16",
        "--sizes and --free-prob are IGNORED",
        "EXIT STATUS",
        "segfit",
    ] {
        assert!(help.contains(flag), "help lacks {flag}");
    }
    let top = blockalloc(&["--help"]);
    assert!(top.status.success());
    assert!(text(&top.stdout).contains("bench"));
}

#[test]
fn bad_values_fail_clearly() {
    for (args, needle) in [
        (&["bench", "--free-prob", "2"][..], "--free-prob"),
        (&["bench", "--capacity", "12XB"], "unknown unit"),
        (&["bench", "--sizes", "zipf:1"], "bad size distribution"),
        (
            &["bench", "--engine", "segfit,nope"],
            "unknown engine \"nope\"",
        ),
        (&["bench", "--mode", "sideways"], "--mode"),
        (&["bench", "--no-such-flag"], "--no-such-flag"),
        (&["bench", "--round-size", "0"], "--round-size"),
        (&["bench", "--quiet", "--verbose"], "cannot be used with"),
    ] {
        let out = blockalloc(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn json_to_stdout_is_pure_json_lines() {
    let mut args = vec!["bench", "--engine", "all", "--json", "-"];
    args.extend(TINY);
    let out = blockalloc(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.len() >= 4, "one line per engine: {stdout}");
    for line in &lines {
        let v: Value = serde_json::from_str(line).expect("each stdout line is JSON");
        assert_eq!(v["stopped"], "no_space");
        assert_eq!(v["capacity_bytes"], 1u64 << 30);
        assert!(v["utilization_at_first_failure"].as_f64().unwrap() > 0.0);
        assert!(v["per_round"].as_array().unwrap().len() as u64 == v["rounds"]);
    }
    // The table went to stderr.
    let err = text(&out.stderr);
    assert!(err.contains("util@fail") && err.contains("segfit"), "{err}");
}

#[test]
fn json_to_a_file_and_table_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.jsonl");
    let mut args = vec!["bench", "--engine", "pool,segfit", "--json"];
    let p = path.to_str().unwrap();
    args.push(p);
    args.extend(TINY);
    args.extend(["--verbose", "--workload", "shift"]);
    let out = blockalloc(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json = std::fs::read_to_string(&path).unwrap();
    let engines: Vec<String> = json
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["engine"].to_string())
        .collect();
    assert_eq!(engines, ["\"pool\"", "\"segfit\""]);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("util@fail"), "{stdout}");
    assert!(
        stdout.contains("pool round 1 (phase 1): 100 allocs in"),
        "{stdout}"
    );

    let bad = blockalloc(&["bench", "--json", "/nonexistent/dir/x.jsonl"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(text(&bad.stderr).contains("cannot create"));
}

#[test]
fn quiet_prints_nothing_and_limits_apply() {
    let mut args = vec![
        "bench",
        "--quiet",
        "--max-rounds",
        "2",
        "--capacity",
        "1TiB",
    ];
    args.extend(["--round-size", "500"]);
    let out = blockalloc(&args);
    assert!(out.status.success());
    assert!(out.stdout.is_empty() && out.stderr.is_empty());

    let out = blockalloc(&[
        "bench",
        "--max-ops",
        "700",
        "--capacity",
        "1TiB",
        "--round-size",
        "500",
        "--json",
        "-",
        "--quiet",
    ]);
    let v: Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    assert_eq!(v["stopped"], "max_ops");
    assert!(v["utilization_at_first_failure"].is_null());
}

#[cfg(feature = "peers")]
#[test]
fn peers_that_cannot_serve_the_device_are_skipped() {
    let out = blockalloc(&[
        "bench",
        "--engine",
        "segfit,peer-offset-allocator",
        "--max-rounds",
        "1",
        "--round-size",
        "100",
        "--json",
        "-",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).lines().count(), 1);
    assert!(text(&out.stderr).contains("warning: peer-offset-allocator skipped"));

    let out = blockalloc(&["bench", "--engine", "peer-offset-allocator"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("no engine could run"));
}

#[cfg(not(feature = "peers"))]
#[test]
fn peers_need_the_feature() {
    let out = blockalloc(&["bench", "--engine", "peer-range-alloc"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--features peers"));
}

#[test]
fn threaded_runs_take_the_shared_handles_tunables() {
    let mut args = vec![
        "bench",
        "--threads",
        "1,2",
        "--region-size",
        "16MiB",
        "--keep-empty-regions",
        "0",
        "--json",
        "-",
    ];
    args.extend(TINY);
    let out = blockalloc(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let runs = json_lines(&stdout);
    assert_eq!(runs.len(), 2, "{stdout}");
    for (v, threads) in runs.iter().zip([1, 2]) {
        assert_eq!(v["threads"], threads);
        assert_eq!(v["stopped"], "no_space");
        assert_eq!(v["locks"]["region_blocks"], 4096, "16 MiB of 4 KiB blocks");
        assert_eq!(v["locks"]["keep_empty_regions"], 0);
        assert!(v["locks"]["leases"].as_u64().unwrap() > 0);
    }
    assert!(runs[1]["speedup_vs_one_thread"].is_number());
    // The tunables belong to threaded runs.
    let out = blockalloc(&["bench", "--region-size", "16MiB"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--threads"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn threaded_runs_repeat_in_interleaved_passes() {
    let mut args = vec![
        "bench",
        "--threads",
        "1,2",
        "--repeat",
        "3",
        "--arenas",
        "4",
        "--json",
        "-",
    ];
    args.extend(TINY);
    let out = blockalloc(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let runs = json_lines(&stdout);
    assert_eq!(runs.len(), 6, "{stdout}");
    for (i, v) in runs.iter().enumerate() {
        assert_eq!(v["threads"], [1, 2][i % 2], "passes interleave the counts");
        assert_eq!(v["repeat"], i / 2);
        // Each pass's speed-up is over its own 1-thread run.
        let own = runs[i - i % 2]["ops_per_sec"].as_f64().unwrap();
        let x = v["speedup_vs_one_thread"].as_f64().unwrap();
        assert!((x - v["ops_per_sec"].as_f64().unwrap() / own).abs() < 1e-9);
    }
    // The summary names the medians.
    let mut args = vec!["bench", "--threads", "1,2", "--repeat", "2"];
    args.extend(TINY);
    let out = blockalloc(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let human = text(&out.stdout) + &text(&out.stderr);
    assert!(
        human.contains("2 threads:") && human.contains("medians of 2 passes"),
        "{human}"
    );
    // Zero passes or arenas is a usage error; --repeat belongs to threaded runs.
    for bad in [
        &["bench", "--threads", "2", "--repeat", "0"][..],
        &["bench", "--threads", "2", "--arenas", "0"][..],
        &["bench", "--repeat", "2"][..],
    ] {
        let out = blockalloc(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
}

#[test]
fn reference_best_fit_stands_beside_every_engine() {
    let mut args = vec![
        "bench",
        "--workload",
        "aging",
        "--aging-cycles",
        "2",
        "--engine",
        "segfit,pool",
        "--reference",
        "best-fit",
        "--json",
        "-",
    ];
    args.extend(TINY);
    let out = blockalloc(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines = json_lines(&text(&out.stdout));
    let engines: Vec<&str> = lines
        .iter()
        .map(|v| v["engine"].as_str().unwrap())
        .collect();
    assert_eq!(
        engines,
        ["best-fit", "segfit", "pool"],
        "the reference runs first"
    );
    let reference = &lines[0]["utilization_at_first_failure"];
    assert!(reference.as_f64().unwrap() > 0.5);
    for v in &lines {
        assert_eq!(v["workload"], "aging");
        assert_eq!(v["reference"]["engine"], "best-fit");
        assert_eq!(&v["reference"]["utilization_at_first_failure"], reference);
    }
    assert_eq!(lines[1]["phase"], 3, "segfit fails among the large objects");
    let err = text(&out.stderr);
    assert!(err.contains("best-fit util@fail"), "{err}");

    // Without --reference there is no reference field.
    let mut args = vec!["bench", "--engine", "best-fit", "--json", "-"];
    args.extend(TINY);
    let out = blockalloc(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines = json_lines(&text(&out.stdout));
    assert_eq!(lines.len(), 1);
    assert!(lines[0].get("reference").is_none());
}
