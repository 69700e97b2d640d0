//! Help texts built at start-up from the libraries' registries, so that a
//! workload or a JSON field added there shows in `--help` by itself.

use blockalloc_bench::{CONTRACT_FIELDS, LATENCY_FIELDS, ROUND_FIELDS, WORKLOADS};

/// Width of generated help paragraphs, indent included.
const WIDTH: usize = 76;

/// Every workload of the registry with its help text, indented for a
/// WORKLOADS section (`bench --help`, `trace gen --help`).
pub fn workloads() -> String {
    let mut out = String::new();
    for w in WORKLOADS {
        let mut lines = w.help.lines();
        let first = lines.next().unwrap_or_default();
        if w.name.len() <= 6 {
            out.push_str(&format!("  {:<6} {first}\n", w.name));
        } else {
            out.push_str(&format!("  {}\n         {first}\n", w.name));
        }
        for line in lines {
            out.push_str(&format!("         {line}\n"));
        }
    }
    out
}

/// The fields of the JSON contract (`bench --json`, and every `replay
/// --json` line): `engine, workload, …, alloc_ns {mean, p50, …}, …,
/// per_round [{round, secs, utilization}]`.
pub fn contract_fields() -> String {
    let latency = format!("{{{}}}", LATENCY_FIELDS.join(", "));
    let round = format!("[{{{}}}]", ROUND_FIELDS.join(", "));
    CONTRACT_FIELDS
        .iter()
        .map(|&f| match f {
            "alloc_ns" | "free_ns" => format!("{f} {latency}"),
            "per_round" => format!("{f} {round}"),
            f => f.to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `text` as a help paragraph: wrapped, each line indented by two spaces.
pub fn paragraph(text: &str) -> String {
    let options = textwrap::Options::new(WIDTH)
        .initial_indent("  ")
        .subsequent_indent("  ");
    textwrap::fill(text, options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_fields_name_every_field_once() {
        let text = contract_fields();
        for f in CONTRACT_FIELDS
            .iter()
            .chain(&LATENCY_FIELDS)
            .chain(&ROUND_FIELDS)
        {
            assert!(text.contains(f), "{f}");
        }
        assert!(text.contains("per_round [{round, secs, utilization}]"));
        let p = paragraph(&text);
        assert!(p.lines().all(|l| l.len() <= WIDTH && l.starts_with("  ")));
    }
}
