#!/usr/bin/env python3
"""Turns `blockalloc bench --json` output (JSON Lines) into Markdown tables.

usage: scripts/bench_table.py FILE.jsonl [FILE.jsonl ...]
"""
import json
import sys


def fmt(v, spec="{}"):
    return "-" if v is None else spec.format(v)


def main(paths):
    print("| engine | stopped | util@fail | rounds | allocs | alloc p50/p99/p99.9 ns | free p50/p99/p99.9 ns | Mops/s | ext/obj | engine mem | peak RSS | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in paths:
        for line in open(p):
            line = line.strip()
            if not line.startswith("{"):
                continue
            d = json.loads(line)
            a, f = d["alloc_ns"], d["free_ns"]
            eng = d["engine"] + (f" x{d['threads']}" if d.get("per_thread") else "")
            u = d["utilization_at_first_failure"]
            print("| {} | {} | {} | {} | {} | {}/{}/{} | {}/{}/{} | {:.2f} | {} | {:.1f} MiB | {} | {:.1f} |".format(
                eng, d["stopped"], fmt(u and u * 100, "{:.4f}%"), d["rounds"], d["allocations"],
                fmt(a["p50"]), fmt(a["p99"]), fmt(a["p999"]),
                fmt(f["p50"]), fmt(f["p99"]), fmt(f["p999"]),
                d["ops_per_sec"] / 1e6, fmt(d["extents_per_object"], "{:.3f}"),
                d["allocator_memory_bytes"] / 2**20,
                fmt(d["peak_rss_bytes"] and d["peak_rss_bytes"] / 2**20, "{:.0f} MiB"), d["wall_secs"]))


if __name__ == "__main__":
    main(sys.argv[1:])
