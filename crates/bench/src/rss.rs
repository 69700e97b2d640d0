//! Peak resident memory of this process, from the OS (Linux only).
//!
//! Engines run one after another in one process, so before each engine the
//! runner resets the kernel's high-water mark ([`reset_peak`], writing `5` to
//! `/proc/self/clear_refs`), and after the run reads it back
//! ([`peak_rss_bytes`], `VmHWM` in `/proc/self/status`). The peak therefore
//! covers the engine, the harness's own bookkeeping (the object → extents map
//! and round buffers, the same for every engine) and whatever the process
//! held before the reset.

use std::fs;

/// Resets the peak-RSS counter to the current RSS. Returns whether it worked
/// (it needs Linux ≥ 4.0 and a writable `/proc`); failures are harmless: the
/// peak then covers the whole process lifetime.
pub fn reset_peak() -> bool {
    fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The peak resident set size in bytes since start or the last
/// [`reset_peak`], or `None` where the OS does not tell.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_hwm(&status)
}

fn parse_vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let mut words = line["VmHWM:".len()..].split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => n.checked_mul(1024),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status() {
        let s = "Name:\tx\nVmPeak:\t  100 kB\nVmHWM:\t    2048 kB\nVmRSS:\t 1 kB\n";
        assert_eq!(parse_vm_hwm(s), Some(2048 * 1024));
        assert_eq!(parse_vm_hwm("VmHWM: lots\n"), None);
        assert_eq!(parse_vm_hwm(""), None);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn reads_own_peak() {
        let _ = reset_peak();
        assert!(peak_rss_bytes().unwrap() > 0);
    }
}
