//! `blockalloc bench --remote ADDR`: the seed workload against an
//! allocation server, per call (`--lease off`) or through leases
//! (`--lease auto|SIZE`), from `--clients` connections at once.
//!
//! Each client runs its own copy of the workload (seed + client index) with
//! rounds of round-size / clients requests. Every allocation is timed on its
//! own (an RPC costs ~100 µs, so the timer's ~40 ns does not matter; for
//! local allocations it is an upper bound). Leased allocations become
//! durable at the commit that ends each round, whose time is reported apart
//! and also spread over the round's allocations ("with commit").

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use blockalloc::ByteSize;
use blockalloc_bench::SizeSampler;
use blockalloc_client::{Client, ClientError, DeviceId, LeaseOptions, LeasingAllocator};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::bench::BenchSettings;
use crate::error::UsageError;
use crate::flags::BenchArgs;

/// How clients allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LeaseMode {
    /// Every allocation is an `Allocate` call.
    Off,
    /// Leases sized by the server.
    Auto,
    /// Leases of this many bytes.
    Size(u64),
}

impl LeaseMode {
    fn parse(s: &str) -> Result<LeaseMode, UsageError> {
        match s {
            "off" => Ok(LeaseMode::Off),
            "auto" => Ok(LeaseMode::Auto),
            size => match size.parse::<ByteSize>() {
                Ok(b) if b.bytes() > 0 => Ok(LeaseMode::Size(b.bytes())),
                _ => Err(UsageError::new(format!(
                    "--lease {s:?}: expected off, auto or a size such as 64MiB"
                ))),
            },
        }
    }

    fn name(self) -> String {
        match self {
            LeaseMode::Off => "off".into(),
            LeaseMode::Auto => "auto".into(),
            LeaseMode::Size(b) => ByteSize(b).to_string(),
        }
    }
}

/// One client's results.
#[derive(Default)]
struct ClientRun {
    alloc_ns: Vec<u64>,
    alloc_time: Duration,
    commit_time: Duration,
    frees: u64,
    rounds: u64,
    /// used / capacity when this client's allocation was the run's first
    /// to fail.
    util_at_failure: Option<f64>,
    /// The device's status then.
    status_at_failure: Option<blockalloc_client::DeviceStatus>,
    leases: u64,
    commit_calls: u64,
    remote_fallbacks: u64,
}

fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

/// Runs `bench --remote`.
///
/// # Errors
/// Usage errors; the server unreachable or refusing requests.
pub fn run(a: &BenchArgs) -> anyhow::Result<()> {
    let addr = a.remote.clone().expect("called with --remote");
    let s = BenchSettings::from_args(a)?;
    let mode = LeaseMode::parse(&a.lease)?;
    // Bad TLS or token flags are usage errors before anything runs.
    a.connect.options()?;
    a.connect.token()?;
    if a.clients == 0 || a.clients > 1024 {
        return Err(UsageError::new("--clients must be from 1 to 1024").into());
    }
    let w = s.config.workload;
    let limits = s.config.limits;
    let per_client = (w.round_size / a.clients as u64).max(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (runs, wall, util, at_failure, block_size) = rt.block_on(async {
        let probe = a.connect.connect(&addr).await?;
        let st = probe.status().await?;
        let dev = st
            .first()
            .ok_or_else(|| anyhow::anyhow!("the server serves no device"))?;
        let block_size = dev.block_size;
        let t0 = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for c in 0..a.clients {
            let client = a.connect.connect(&addr).await?;
            let sampler = SizeSampler::new(w.sizes, block_size);
            let seed = w.seed.wrapping_add(c as u64);
            let free_prob = w.free_prob;
            let stop = Arc::clone(&stop);
            tasks.push(tokio::spawn(async move {
                client_run(
                    client, mode, c, sampler, seed, free_prob, per_client, limits, block_size,
                    &stop,
                )
                .await
            }));
        }
        let mut runs = Vec::new();
        for t in tasks {
            runs.push(t.await.context("a client task failed")??);
        }
        let wall = t0.elapsed();
        // The first failure of any client ends the run, as the first
        // failure ends a local run.
        let util = runs.iter().find_map(|r: &ClientRun| r.util_at_failure);
        let at_failure = runs.iter().find_map(|r| r.status_at_failure.clone());
        anyhow::Ok((runs, wall, util, at_failure, block_size))
    })?;
    let mut lat: Vec<u64> = runs
        .iter()
        .flat_map(|r| r.alloc_ns.iter().copied())
        .collect();
    lat.sort_unstable();
    let n = lat.len() as u64;
    let sum = |f: fn(&ClientRun) -> u64| runs.iter().map(f).sum::<u64>();
    let alloc_secs: f64 = runs.iter().map(|r| r.alloc_time.as_secs_f64()).sum();
    let commit_secs: f64 = runs.iter().map(|r| r.commit_time.as_secs_f64()).sum();
    let mean = if n > 0 {
        alloc_secs * 1e9 / n as f64
    } else {
        0.0
    };
    let with_commit = if n > 0 {
        (alloc_secs + commit_secs) * 1e9 / n as f64
    } else {
        0.0
    };
    let v = serde_json::json!({
        "kind": "remote",
        "remote": addr,
        "lease": mode.name(),
        "clients": a.clients,
        "block_size": block_size,
        "free_prob": w.free_prob,
        "seed": w.seed,
        "allocations": n,
        "frees": sum(|r| r.frees),
        "rounds": runs.iter().map(|r| r.rounds).max().unwrap_or(0),
        "stopped": if util.is_some() { "no_space" } else { "limit" },
        "utilization_at_first_failure": util,
        "free_blocks_at_first_failure": at_failure.as_ref().map(|d| d.free_blocks),
        "leased_unused_blocks_at_first_failure": at_failure.as_ref().map(|d| d.leased_unused_blocks),
        "largest_free_extent_at_first_failure": at_failure.as_ref().map(|d| d.largest_free_extent),
        "alloc_ns": {
            "mean": mean,
            "p50": percentile(&lat, 0.5),
            "p99": percentile(&lat, 0.99),
            "p999": percentile(&lat, 0.999),
            "max": lat.last().copied().unwrap_or(0),
        },
        "commit_secs": commit_secs,
        "ns_per_allocation_with_commit": with_commit,
        "allocations_per_sec": n as f64 / wall.as_secs_f64(),
        "wall_secs": wall.as_secs_f64(),
        "leases": sum(|r| r.leases),
        "commit_calls": sum(|r| r.commit_calls),
        "commit_calls_per_sec": sum(|r| r.commit_calls) as f64 / wall.as_secs_f64(),
        "per_call_fallbacks": sum(|r| r.remote_fallbacks),
    });
    match a.json.as_deref() {
        Some("-") => println!("{v}"),
        Some(p) => {
            let mut f = File::create(p).with_context(|| format!("cannot create {p}"))?;
            writeln!(f, "{v}").context("cannot write the JSON output")?;
        }
        None => {}
    }
    if !a.quiet {
        let mut out: Box<dyn Write> = if a.json.as_deref() == Some("-") {
            Box::new(std::io::stderr())
        } else {
            Box::new(std::io::stdout())
        };
        writeln!(
            out,
            "remote {addr}: lease {}, {} client(s), {n} allocations in {:.2} s ({:.0}/s)",
            mode.name(),
            a.clients,
            wall.as_secs_f64(),
            n as f64 / wall.as_secs_f64()
        )?;
        writeln!(
            out,
            "  allocate   mean {:.0} ns  p50 {} ns  p99 {} ns  p99.9 {} ns  max {} ns",
            mean,
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            percentile(&lat, 0.999),
            lat.last().copied().unwrap_or(0)
        )?;
        writeln!(
            out,
            "  commits    {:.3} s in {} calls ({:.0}/s); with commits {:.0} ns per allocation",
            commit_secs,
            sum(|r| r.commit_calls),
            sum(|r| r.commit_calls) as f64 / wall.as_secs_f64(),
            with_commit
        )?;
        if let (Some(u), Some(d)) = (util, &at_failure) {
            writeln!(
                out,
                "  stopped    no space at utilisation {u:.5}: {} blocks free (longest run {}), {} leased unused",
                d.free_blocks, d.largest_free_extent, d.leased_unused_blocks
            )?;
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn client_run(
    client: Client,
    mode: LeaseMode,
    index: usize,
    sampler: SizeSampler,
    seed: u64,
    free_prob: f64,
    per_round: u64,
    limits: blockalloc_bench::Limits,
    block_size: u64,
    stop: &AtomicBool,
) -> anyhow::Result<ClientRun> {
    let dev = DeviceId::Index(0);
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let leasing = match mode {
        LeaseMode::Off => None,
        LeaseMode::Auto | LeaseMode::Size(_) => {
            let want = match mode {
                LeaseMode::Size(b) => b.div_ceil(block_size),
                _ => 0,
            };
            let max_obj = blockalloc_bench::MAX_OBJECT_BYTES.div_ceil(block_size);
            Some(LeasingAllocator::new(
                client.clone(),
                LeaseOptions {
                    device: dev.clone(),
                    min_blocks: if want > 0 { want.min(max_obj) } else { max_obj },
                    want_blocks: want,
                    commit_interval: Duration::from_secs(3600),
                    client_id: format!("bench-{}-{index}", std::process::id()),
                    ..LeaseOptions::default()
                },
            ))
        }
    };
    let mut r = ClientRun::default();
    let start = Instant::now();
    let mut ops = 0u64;
    'rounds: loop {
        let mut to_free = Vec::new();
        for _ in 0..per_round {
            if stop.load(Ordering::Relaxed) {
                break 'rounds;
            }
            let blocks = sampler.sample_blocks(&mut rng).max(1);
            let t = Instant::now();
            let got = match &leasing {
                Some(l) => l.allocate(blocks).await,
                None => client.allocate(&dev, 1, blocks, None).await.map(|v| v[0]),
            };
            let dt = t.elapsed();
            match got {
                Ok(e) => {
                    r.alloc_ns.push(dt.as_nanos() as u64);
                    r.alloc_time += dt;
                    ops += 1;
                    if rng.random_bool(free_prob) {
                        to_free.push(e);
                    }
                }
                Err(ClientError::NoSpace(_)) => {
                    if !stop.swap(true, Ordering::Relaxed) {
                        let st = client.status().await?;
                        let d = &st[0];
                        r.util_at_failure = Some(d.used_blocks as f64 / d.capacity_blocks as f64);
                        r.status_at_failure = Some(d.clone());
                    }
                    break 'rounds;
                }
                Err(e) => return Err(e.into()),
            }
        }
        if let Some(l) = &leasing {
            let t = Instant::now();
            l.commit().await?;
            r.commit_time += t.elapsed();
        }
        r.frees += to_free.len() as u64;
        ops += to_free.len() as u64;
        match &leasing {
            Some(l) => {
                for e in to_free {
                    l.free(e).await?;
                }
                l.commit().await?;
            }
            None => {
                for chunk in to_free.chunks(4096) {
                    client.free(&dev, chunk).await?;
                }
            }
        }
        r.rounds += 1;
        let limit_hit = limits.max_rounds.is_some_and(|m| r.rounds >= m)
            || limits.max_ops.is_some_and(|m| ops >= m)
            || limits.time_limit.is_some_and(|t| start.elapsed() >= t);
        if limit_hit {
            break 'rounds;
        }
    }
    if let Some(l) = leasing {
        let st = l.stats();
        r.leases = st.leases;
        r.commit_calls = st.commit_calls;
        r.remote_fallbacks = st.remote_allocations;
        l.close().await?;
    }
    Ok(r)
}
