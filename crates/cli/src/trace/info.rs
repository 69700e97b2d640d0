//! `trace info`: one validating pass, then a summary for people or JSON.

use blockalloc::ByteSize;
use blockalloc_bench::units;
use blockalloc_trace::{TraceSource, TraceSummary};
use serde_json::json;

use super::args::InfoArgs;
use crate::checks::{write_json_object, JsonTarget};
use crate::out::outln;

/// Bounds of bucket `i` of [`TraceSummary::size_histogram`] in bytes, both
/// inclusive: bucket 0 holds empty objects, bucket `i > 0` sizes in
/// `[2^(i-1), 2^i)`.
pub fn size_bucket_bounds(i: usize) -> (u64, u64) {
    match i {
        0 => (0, 0),
        64 => (1 << 63, u64::MAX),
        _ => (1 << (i - 1), (1 << i) - 1),
    }
}

/// The size histogram with its bounds, for the JSON output.
fn size_buckets_json(s: &TraceSummary) -> Vec<serde_json::Value> {
    s.size_histogram
        .iter()
        .enumerate()
        .filter(|(_, &n)| n > 0)
        .map(|(i, &n)| {
            let (min, max) = size_bucket_bounds(i);
            json!({"min_bytes": min, "max_bytes": max, "objects": n})
        })
        .collect()
}

/// Prints the summary.
///
/// # Errors
/// Trace errors: a damaged or invalid trace fails with its position.
pub fn run(a: &InfoArgs) -> anyhow::Result<()> {
    let json_target = JsonTarget::parse(a.json.as_deref())?;
    let mut source = TraceSource::open(&a.trace).map_err(super::in_trace(&a.trace))?;
    let header = source.header().clone();
    let format = source.format();
    let block_size = a
        .block_size
        .map(ByteSize::bytes)
        .or(header.block_size)
        .unwrap_or(4096)
        .max(1);
    let s = TraceSummary::scan(&mut source, block_size).map_err(super::in_trace(&a.trace))?;
    if let Some(target) = &json_target {
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
            "size_buckets": size_buckets_json(&s),
        });
        write_json_object(target, &v)?;
        if *target == JsonTarget::Stdout {
            return Ok(());
        }
    }
    let opt = |v: Option<u64>| v.map_or_else(|| "unknown".to_string(), units::bytes);
    outln!("trace      {} ({format})", a.trace.display())?;
    outln!(
        "made for   capacity {}, block size {}",
        opt(header.capacity_bytes),
        opt(header.block_size)
    )?;
    for (k, v) in &header.meta {
        outln!("  {k} = {v}")?;
    }
    outln!(
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
    )?;
    if let (Some(min), Some(max), Some(mean)) = (
        s.min_object_bytes,
        s.max_object_bytes,
        s.mean_object_bytes(),
    ) {
        outln!(
            "objects    {} to {}, mean {}; {} allocated in all",
            units::bytes(min),
            units::bytes(max),
            units::bytes(mean as u64),
            units::bytes(s.bytes_allocated)
        )?;
    }
    let of_capacity = |blocks: u64| match header.capacity_bytes {
        // In floating point: blocks × block size can pass 2^64.
        Some(c) if c > 0 => format!(
            " = {:.2}% of the capacity",
            blocks as f64 * block_size as f64 * 100.0 / c as f64
        ),
        _ => String::new(),
    };
    outln!(
        "peak live  {} in {} objects; {} blocks of {}{}",
        units::bytes(s.peak_live_bytes),
        s.peak_live_objects,
        s.peak_live_blocks,
        units::bytes(block_size),
        of_capacity(s.peak_live_blocks)
    )?;
    outln!(
        "at the end {} in {} live objects",
        units::bytes(s.live_bytes_at_end),
        s.live_objects_at_end
    )?;
    let most = s.size_histogram.iter().copied().max().unwrap_or(0).max(1);
    if s.allocs > 0 {
        outln!("sizes (objects per power-of-two bucket):")?;
        outln!("  {:>10}    {:>10}  {:>10}", "from", "below", "objects")?;
    }
    for (i, &n) in s.size_histogram.iter().enumerate() {
        if n == 0 {
            continue;
        }
        let (min, max) = size_bucket_bounds(i);
        let bar = "#".repeat(((n as f64 / most as f64) * 40.0).ceil() as usize);
        // Text shows the exclusive upper bound: "4 KiB .. 8 KiB" reads
        // better than "4 KiB .. 8.00 KiB" (8191 bytes).
        let below = if i == 0 {
            "1 B".to_string()
        } else {
            units::bytes_wide(u128::from(max) + 1)
        };
        outln!(
            "  {:>10} .. {:>10}  {n:>10}  {bar}",
            units::bytes(min),
            below
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_bounds_cover_every_size_once() {
        assert_eq!(size_bucket_bounds(0), (0, 0));
        assert_eq!(size_bucket_bounds(1), (1, 1));
        assert_eq!(size_bucket_bounds(13), (4096, 8191));
        assert_eq!(size_bucket_bounds(64), (1 << 63, u64::MAX));
        for i in 1..64 {
            assert_eq!(size_bucket_bounds(i).1 + 1, size_bucket_bounds(i + 1).0);
        }
        // The summary's bucketing agrees: size `b` goes to bucket 64 - lz(b).
        for b in [1u64, 4095, 4096, 8191, u64::MAX] {
            let (min, max) = size_bucket_bounds((64 - b.leading_zeros()) as usize);
            assert!((min..=max).contains(&b), "{b}");
        }
    }
}
