//! `trace info`: one validating pass, then a summary for people or JSON.

use blockalloc::ByteSize;
use blockalloc_bench::report::human_bytes;
use blockalloc_trace::{TraceSource, TraceSummary};
use serde_json::json;

use super::args::InfoArgs;

/// Prints the summary.
///
/// # Errors
/// Trace errors: a damaged or invalid trace fails with its position.
pub fn run(a: &InfoArgs) -> anyhow::Result<()> {
    let mut source = TraceSource::open(&a.trace)?;
    let header = source.header().clone();
    let format = source.format();
    let block_size = a
        .block_size
        .map(ByteSize::bytes)
        .or(header.block_size)
        .unwrap_or(4096)
        .max(1);
    let s = TraceSummary::scan(&mut source, block_size)?;
    if a.json {
        let meta: serde_json::Map<String, serde_json::Value> = header
            .meta
            .iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        let v = json!({
            "trace": a.trace.display().to_string(),
            "format": format.name(),
            "header_block_size": header.block_size,
            "header_capacity_bytes": header.capacity_bytes,
            "meta": meta,
            "summary": s,
        });
        println!("{v}");
        return Ok(());
    }
    let opt = |v: Option<u64>| v.map_or_else(|| "unknown".to_string(), |b| ByteSize(b).to_string());
    println!("trace      {} ({format})", a.trace.display());
    println!(
        "made for   capacity {}, block size {}",
        opt(header.capacity_bytes),
        opt(header.block_size)
    );
    for (k, v) in &header.meta {
        println!("  {k} = {v}");
    }
    println!(
        "operations {} ({} allocs, {} frees, {} round markers{})",
        s.ops,
        s.allocs,
        s.frees,
        s.rounds,
        if s.max_phase > 1 {
            format!(", phases 1..{}", s.max_phase)
        } else {
            String::new()
        }
    );
    if let (Some(min), Some(max), Some(mean)) = (
        s.min_object_bytes,
        s.max_object_bytes,
        s.mean_object_bytes(),
    ) {
        println!(
            "objects    {} to {}, mean {}; {} allocated in all",
            human_bytes(min),
            human_bytes(max),
            human_bytes(mean as u64),
            human_bytes(s.bytes_allocated)
        );
    }
    let of_capacity = |blocks: u64| match header.capacity_bytes {
        Some(c) if c > 0 => format!(
            " = {:.2}% of the capacity",
            (blocks * block_size) as f64 * 100.0 / c as f64
        ),
        _ => String::new(),
    };
    println!(
        "peak live  {} in {} objects; {} blocks of {}{}",
        human_bytes(s.peak_live_bytes),
        s.peak_live_objects,
        s.peak_live_blocks,
        ByteSize(block_size),
        of_capacity(s.peak_live_blocks)
    );
    println!(
        "at the end {} in {} live objects",
        human_bytes(s.live_bytes_at_end),
        s.live_objects_at_end
    );
    let most = s.size_histogram.iter().copied().max().unwrap_or(0).max(1);
    if s.allocs > 0 {
        println!("sizes (objects per power-of-two bucket):");
    }
    for (i, &n) in s.size_histogram.iter().enumerate() {
        if n == 0 {
            continue;
        }
        let range = if i == 0 {
            "0 B".to_string()
        } else {
            let lo = 1u128 << (i - 1);
            format!("{}..{}", human_u128(lo), human_u128(lo * 2))
        };
        let bar = "#".repeat(((n as f64 / most as f64) * 40.0).ceil() as usize);
        println!("  {range:>22}  {n:>10}  {bar}");
    }
    Ok(())
}

fn human_u128(v: u128) -> String {
    u64::try_from(v).map_or_else(|_| "16EiB".to_string(), human_bytes)
}
