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

/// Every workload the bench knows runs on threads too.
#[test]
fn threaded_runs_take_every_workload() {
    for workload in ["seed", "shift", "fill-shift", "aging"] {
        let mut args = vec![
            "bench",
            "--threads",
            "2",
            "--workload",
            workload,
            "--json",
            "-",
        ];
        args.extend(TINY);
        let out = blockalloc(&args);
        assert!(out.status.success(), "{workload}: {}", text(&out.stderr));
        let runs = json_lines(&text(&out.stdout));
        assert_eq!(runs.len(), 1, "{workload}");
        assert_eq!(runs[0]["workload"], workload);
        assert_eq!(runs[0]["threads"], 2);
        assert_eq!(runs[0]["stopped"], "no_space");
    }
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

/// A formatted 64 MiB device with some objects on it, in `dir`.
fn used_device(dir: &std::path::Path) -> String {
    let dev = dir.join("dev.img");
    let d = dev.to_str().unwrap().to_string();
    let out = blockalloc(&[
        "format", "--device", &d, "--size", "64MiB", "--zero", "none",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = blockalloc(&["bench", "--device", &d, "--round-size", "100", "-q"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    d
}

/// A small CSV trace in `dir`.
fn small_trace(dir: &std::path::Path) -> String {
    let path = dir.join("t.csv");
    std::fs::write(
        &path,
        "# capacity_bytes=64MiB\nalloc,1,4096\nalloc,2,10000\nfree,1\n",
    )
    .unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn json_takes_an_optional_path_on_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let dev = used_device(dir.path());
    let trace = small_trace(dir.path());
    let file = dir.path().join("out.json");
    let f = file.to_str().unwrap();
    // `--json` alone, `--json -` and `--json PATH` on every command that
    // has JSON output.
    let one_object: [&[&str]; 3] = [
        &["inspect", "--device", &dev],
        &["check", "--device", &dev],
        &["trace", "info", &trace],
    ];
    for base in one_object {
        for tail in [&["--json"][..], &["--json", "-"]] {
            let args: Vec<&str> = base.iter().chain(tail).copied().collect();
            let out = blockalloc(&args);
            assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
            let v: Value = serde_json::from_str(text(&out.stdout).trim())
                .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", text(&out.stdout)));
            assert!(v.is_object(), "{args:?}");
        }
        let args: Vec<&str> = base.iter().chain(&["--json", f]).copied().collect();
        let out = blockalloc(&args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        let v: Value = serde_json::from_str(std::fs::read_to_string(&file).unwrap().trim())
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        assert!(v.is_object(), "{args:?}");
        // The text still goes to stdout.
        assert!(!text(&out.stdout).trim_start().starts_with('{'), "{args:?}");
        std::fs::remove_file(&file).unwrap();
    }
    let tiny_segfit = [
        "--engine",
        "segfit",
        "--capacity",
        "64MiB",
        "--round-size",
        "100",
    ];
    let out = blockalloc(&[&["bench", "--json"][..], &tiny_segfit].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(json_lines(&text(&out.stdout)).len(), 1);
    assert!(text(&out.stderr).contains("util@fail"), "table on stderr");
}

#[test]
fn json_before_a_positional_does_not_take_it() {
    let dir = tempfile::tempdir().unwrap();
    let trace = small_trace(dir.path());
    let out_path = dir.path().join("replay.jsonl");
    let o = out_path.to_str().unwrap();
    // Both orders read the trace and write JSON to stdout.
    for args in [
        &["replay", "--json", &trace, "-q"][..],
        &["replay", &trace, "--json", "-q"],
        &["replay", "-q", &trace, "--json"],
        &["trace", "info", "--json", &trace],
        &["trace", "info", &trace, "--json"],
    ] {
        let out = blockalloc(args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        let lines = json_lines(&text(&out.stdout));
        assert_eq!(lines.len(), 1, "{args:?}");
    }
    // With a path and the positional, the path is the JSON file.
    for args in [
        &["replay", "--json", o, &trace, "-q"][..],
        &["replay", &trace, "--json", o, "-q"],
        &["replay", &format!("--json={o}"), &trace, "-q"],
    ] {
        let out = blockalloc(args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        assert!(out.stdout.is_empty(), "{args:?}");
        let v = json_lines(&std::fs::read_to_string(&out_path).unwrap());
        assert_eq!(v[0]["trace_requests"], 3, "{args:?}");
        std::fs::remove_file(&out_path).unwrap();
    }
    // `--json=PATH` never names the trace: the trace is still missing.
    let out = blockalloc(&["replay", &format!("--json={trace}")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("<TRACE>"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn every_help_documents_the_json_shape() {
    for cmd in [
        &["bench"][..],
        &["replay"],
        &["inspect"],
        &["check"],
        &["trace", "info"],
    ] {
        let args: Vec<&str> = cmd.iter().chain(&["--help"]).copied().collect();
        let help = text(&blockalloc(&args).stdout);
        assert!(help.contains("--json [<PATH|->]"), "{cmd:?}: {help}");
        assert!(help.contains("`--json PATH`"), "{cmd:?}");
        assert!(help.contains("`--json -`"), "{cmd:?}");
    }
}

#[test]
fn inspect_histogram_has_headers_byte_ranges_and_percent() {
    let dir = tempfile::tempdir().unwrap();
    let dev = used_device(dir.path());
    let out = blockalloc(&["inspect", "--device", &dev]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    for needle in [
        "from-blocks",
        "to-blocks",
        "from-bytes",
        "extents",
        "% of free",
    ] {
        assert!(t.contains(needle), "{needle}: {t}");
    }
    // The percentages of the buckets add up to 100.
    let sum: f64 = t
        .lines()
        .filter_map(|l| l.trim_end().strip_suffix('%'))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum();
    assert!((sum - 100.0).abs() < 0.1, "{sum}: {t}");
    let out = blockalloc(&["inspect", "--device", &dev, "--json"]);
    let v: Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    let bucket = &v["free_histogram"][0];
    for key in ["min_blocks", "max_blocks", "extents", "blocks"] {
        assert!(bucket[key].is_u64(), "{key}: {bucket}");
    }
    assert_eq!(
        bucket["min_bytes"].as_u64().unwrap(),
        bucket["min_blocks"].as_u64().unwrap() * 4096
    );
    assert_eq!(
        bucket["max_bytes"].as_u64().unwrap(),
        bucket["max_blocks"].as_u64().unwrap() * 4096
    );
    assert!(bucket["percent_of_free"].as_f64().unwrap() > 0.0);
}

/// Every number followed by a unit, as `(number, unit)`.
fn quantities(t: &str) -> Vec<(String, String)> {
    let words: Vec<&str> = t
        .split(|c: char| c.is_whitespace() || "(),;:=".contains(c))
        .filter(|w| !w.is_empty())
        .collect();
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "ns", "µs", "us", "ms", "s"];
    let mut out = Vec::new();
    for (i, w) in words.iter().enumerate() {
        // A unit glued to its number ("64MiB", "0.009s") is the old style.
        for u in units {
            if let Some(num) = w.strip_suffix(u) {
                if !num.is_empty() && num.parse::<f64>().is_ok() {
                    out.push((num.to_string(), format!("glued:{u}")));
                }
            }
        }
        if i > 0 && units.contains(w) && words[i - 1].parse::<f64>().is_ok() {
            out.push((words[i - 1].to_string(), (*w).to_string()));
        }
    }
    out
}

#[test]
fn human_output_prints_units_one_way() {
    let dir = tempfile::tempdir().unwrap();
    let dev = used_device(dir.path());
    let trace = small_trace(dir.path());
    let mut seen = 0;
    for args in [
        &["inspect", "--device", &dev][..],
        &["check", "--device", &dev],
        &["trace", "info", &trace],
    ] {
        let out = blockalloc(args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        let t = text(&out.stdout);
        for (num, unit) in quantities(&t) {
            seen += 1;
            assert!(!unit.starts_with("glued"), "{args:?}: {num}{unit} in {t}");
            // At most three significant digits, or an exact integer.
            let digits = num.chars().filter(char::is_ascii_digit).count();
            assert!(
                !num.contains('.') || digits <= 3,
                "{args:?}: {num} {unit} in {t}"
            );
        }
    }
    assert!(seen > 10, "{seen}");
    let out = blockalloc(&["inspect", "--device", &dev]);
    let t = text(&out.stdout);
    assert!(t.contains("64 MiB in 16384 blocks of 4 KiB"), "{t}");
    assert!(
        t.lines()
            .any(|l| l.contains("recovery") && (l.ends_with("ms") || l.ends_with("µs"))),
        "{t}"
    );
}

#[test]
fn format_and_the_durable_bench_print_units_one_way() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("units.img");
    let d = dev.to_str().unwrap();
    let out = blockalloc(&["format", "--device", d, "--size", "1GiB", "--sparse"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let formatted = text(&out.stdout);
    assert!(
        formatted.contains("1 GiB in 262144 blocks of 4 KiB"),
        "{formatted}"
    );
    assert!(!formatted.contains("KiB free"), "{formatted}");
    let out = blockalloc(&[
        "bench",
        "--device",
        d,
        "--round-size",
        "100",
        "--max-rounds",
        "2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let bench = text(&out.stdout) + &text(&out.stderr);
    let latency = bench
        .lines()
        .find(|l| l.starts_with("commit latency"))
        .unwrap_or_else(|| panic!("{bench}"));
    assert!(!latency.contains(" us"), "{latency}");
    for t in [&formatted, &latency.to_string()] {
        for (num, unit) in quantities(t) {
            assert!(!unit.starts_with("glued"), "{num}{unit} in {t}");
            let digits = num.chars().filter(char::is_ascii_digit).count();
            assert!(!num.contains('.') || digits <= 3, "{num} {unit} in {t}");
        }
    }
}

/// Runs `args` with stdout a pipe whose reader is gone before anything is
/// written.
fn with_closed_stdout(args: &[&str]) -> Output {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_blockalloc"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

#[test]
fn a_closed_pipe_ends_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let trace = small_trace(dir.path());
    let dev = used_device(dir.path());
    for args in [
        &["trace", "info", &trace][..],
        &["trace", "info", &trace, "--json"],
        &["inspect", "--device", &dev],
        &["check", "--device", &dev],
        &["replay", &trace, "--json", "-q"],
        &[
            "bench",
            "--engine",
            "segfit",
            "--capacity",
            "64MiB",
            "--json",
            "-q",
        ],
        &["trace", "convert", &trace, "-o", "-"],
        &[
            "trace",
            "gen",
            "--capacity",
            "64MiB",
            "--round-size",
            "50",
            "-o",
            "-",
        ],
        &["completions", "bash"],
        &["man"],
    ] {
        let out = with_closed_stdout(args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("Broken pipe"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn an_error_names_its_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.trace");
    let m = missing.to_str().unwrap();
    for args in [
        &["trace", "info", m][..],
        &["replay", m],
        &["trace", "convert", m, "-o", "-"],
    ] {
        let out = blockalloc(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = text(&out.stderr);
        assert_eq!(err.matches("(os error 2)").count(), 1, "{args:?}: {err}");
        assert!(err.contains(m), "{args:?}: {err}");
    }
    let missing = dir.path().join("missing.img");
    let m = missing.to_str().unwrap();
    for args in [
        &["inspect", "--device", m][..],
        &["check", "--device", m],
        &["bench", "--device", m],
        &["reconcile", "--device", m, "--live", "-"],
    ] {
        let out = blockalloc(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = text(&out.stderr);
        assert_eq!(err.matches("(os error 2)").count(), 1, "{args:?}: {err}");
        assert_eq!(err.matches("cannot open").count(), 1, "{args:?}: {err}");
        assert!(err.contains(m), "{args:?}: {err}");
    }
}

/// Every subcommand, as the completion scripts and man pages must name them.
const SUBCOMMANDS: [&str; 11] = [
    "bench",
    "format",
    "inspect",
    "check",
    "trace",
    "replay",
    "completions",
    "man",
    "convert",
    "gen",
    "info",
];

#[test]
fn completions_name_every_subcommand() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = blockalloc(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        for sub in SUBCOMMANDS {
            assert!(script.contains(sub), "{shell} lacks {sub}");
        }
        assert!(script.contains("--json"), "{shell}");
    }
    let script = blockalloc(&["completions", "bash"]).stdout;
    assert!(text(&script).contains("blockalloc__subcmd__trace__subcmd__gen"));
    // The script is valid bash, where bash is installed.
    if let Ok(mut bash) = Command::new("bash")
        .args(["-n"])
        .stdin(std::process::Stdio::piped())
        .spawn()
    {
        use std::io::Write;
        bash.stdin.take().unwrap().write_all(&script).unwrap();
        assert!(bash.wait().unwrap().success(), "bash -n rejects the script");
    }
    let out = blockalloc(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
}

/// Runs `groff` over a page, where it is installed: `Some(warnings)`.
fn groff_warnings(page: &[u8]) -> Option<String> {
    use std::io::Write;
    let mut groff = Command::new("groff")
        .args(["-K", "utf8", "-man", "-Tutf8", "-ww", "-z"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .ok()?;
    groff.stdin.take().unwrap().write_all(page).unwrap();
    let out = groff.wait_with_output().unwrap();
    assert!(out.status.success());
    Some(text(&out.stderr))
}

#[test]
fn man_pages_list_the_subcommands_and_parse() {
    let out = blockalloc(&["man"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = text(&out.stdout);
    assert!(page.contains(".TH blockalloc 1"), "{page}");
    assert!(page.contains(".SH SUBCOMMANDS"), "{page}");
    for sub in &SUBCOMMANDS[..8] {
        assert!(page.contains(&format!("blockalloc\\-{sub}(1)")), "{sub}");
    }
    assert!(!page.contains("blockalloc\\-help(1)"), "no page for `help`");
    if let Some(warnings) = groff_warnings(&out.stdout) {
        assert_eq!(warnings, "");
    }

    let dir = tempfile::tempdir().unwrap();
    let pages = dir.path().join("man1");
    let out = blockalloc(&["man", "--out-dir", pages.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
    for name in [
        "blockalloc",
        "blockalloc-bench",
        "blockalloc-replay",
        "blockalloc-trace",
        "blockalloc-trace-gen",
        "blockalloc-trace-convert",
        "blockalloc-trace-info",
        "blockalloc-inspect",
        "blockalloc-check",
        "blockalloc-format",
    ] {
        let page = std::fs::read(pages.join(format!("{name}.1"))).unwrap();
        assert!(text(&page).contains(".TH "), "{name}");
        if let Some(warnings) = groff_warnings(&page) {
            assert_eq!(warnings, "", "{name}");
        }
    }
    let bench = std::fs::read_to_string(pages.join("blockalloc-bench.1")).unwrap();
    assert!(bench.contains("HOW LATENCY IS MEASURED"));
}

#[test]
fn help_cites_no_documents_a_user_lacks() {
    for cmd in [
        &[][..],
        &["bench"],
        &["format"],
        &["inspect"],
        &["check"],
        &["trace"],
        &["trace", "gen"],
        &["trace", "convert"],
        &["trace", "info"],
        &["replay"],
        &["completions"],
        &["man"],
    ] {
        let args: Vec<&str> = cmd.iter().chain(&["--help"]).copied().collect();
        let out = blockalloc(&args);
        assert!(out.status.success(), "{cmd:?}");
        let help = text(&out.stdout).to_lowercase();
        for private in ["design note", "seed 00", "note 00"] {
            assert!(!help.contains(private), "{cmd:?} cites {private:?}");
        }
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

/// The churn workload: every engine runs it, with `--verify`, to the end of
/// the workload or to the first failure; the recommended engine to the end.
#[test]
fn bench_runs_churn_to_the_end_of_the_workload() {
    let churn = [
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
        "--verify",
        "--json",
        "-",
        "-q",
    ];
    let args: Vec<&str> = churn.iter().chain(&["--engine", "all"]).copied().collect();
    let out = blockalloc(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines = json_lines(&text(&out.stdout));
    assert!(lines.len() >= 4);
    for v in &lines {
        assert_eq!(v["workload"], "churn");
        let stopped = v["stopped"].as_str().unwrap();
        assert!(
            ["end_of_workload", "no_space"].contains(&stopped),
            "{}: {stopped}",
            v["engine"]
        );
        assert!(v["frees"].as_u64().unwrap() > 0, "{v}");
    }
    let segfit = lines.iter().find(|v| v["engine"] == "segfit").unwrap();
    assert_eq!(segfit["stopped"], "end_of_workload");
    assert!(segfit["utilization_at_first_failure"].is_null());

    let args: Vec<&str> = churn.iter().chain(&["--threads", "2"]).copied().collect();
    let out = blockalloc(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v = &json_lines(&text(&out.stdout))[0];
    assert_eq!(v["threads"], 2);
    let stopped = v["stopped"].as_str().unwrap();
    assert!(["end_of_workload", "no_space"].contains(&stopped), "{v}");
    assert!(v["frees"].as_u64().unwrap() > 0, "{v}");
}

/// An unknown `--workload` is refused with every name of the registry.
#[test]
fn unknown_workload_lists_every_workload() {
    let out = blockalloc(&["bench", "--workload", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    for w in blockalloc_bench::WORKLOADS {
        assert!(err.contains(w.name), "{err} lacks {}", w.name);
    }
}
