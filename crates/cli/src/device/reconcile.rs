//! `blockalloc reconcile`: frees the space that no live object owns, given
//! the embedder's list of live extents (see `Store::reconcile` for the
//! protocol). The list is read twice (checking, then freeing), so standard
//! input is first copied to an unnamed temporary file; it is never held in
//! memory whole.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Seek, SeekFrom};
use std::path::Path;
use std::rc::Rc;

use blockalloc::Extent;
use blockalloc_bench::human_bytes;
use blockalloc_store::device::FileDevice;
use blockalloc_store::{ReconcileError, ReconcileOptions, ReconcileReport, Store, StoreError};

use super::args::ReconcileArgs;
use crate::error::UsageError;

/// The long help's tail: the protocol, the list format, exit codes.
pub const AFTER_HELP: &str = "\
PROTOCOL
  Create an object: allocate and commit its space, then record it in the
  index. Delete one: remove it from the index, then free and commit. A crash
  between the two steps leaves space allocated that no object owns, never an
  object whose space is free; reconcile frees that space. Keep the index
  still while it runs; it refuses to run while the store is in use.

LIVE-EXTENT LIST
  Text, one extent per line: `start,len` in blocks (decimal), sorted by start,
  disjoint, outside the metadata area. Blank lines and lines starting with #
  are skipped. `--live -` reads standard input.

  # objects of the index
  1040,16
  1056,256

EXIT STATUS
  0 done (or, with --dry-run, checked); 1 I/O error, or a transaction of
  this process is open; 2 bad flags, a malformed list, or a device that is
  not a store; 4 the list names free space (the index and the store
  disagree: nothing was freed) or the device is corrupt; 5 another writer
  holds the device.";

/// A line of the live-extent list that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct LineError {
    /// Line number, from 1.
    pub line: u64,
    /// What is wrong with it.
    pub reason: String,
}

/// Parses one line: `start,len` in blocks, or nothing for a blank line or
/// a `#` comment.
pub fn parse_line(text: &str) -> Result<Option<Extent>, String> {
    let t = text.trim();
    if t.is_empty() || t.starts_with('#') {
        return Ok(None);
    }
    let (a, b) = t
        .split_once(',')
        .ok_or_else(|| format!("expected `start,len` in blocks, found {t:?}"))?;
    let number = |what: &str, s: &str| {
        s.trim()
            .parse::<u64>()
            .map_err(|e| format!("{what} {:?} is not a block count: {e}", s.trim()))
    };
    let (start, len) = (number("start", a)?, number("length", b)?);
    Extent::new(start, len)
        .map(Some)
        .map_err(|e| format!("{t:?} is not an extent: {e}"))
}

/// The extents of `file` from its beginning; `line` follows the line of the
/// extent yielded last.
fn extents(
    file: &File,
    line: Rc<Cell<u64>>,
) -> Box<dyn Iterator<Item = Result<Extent, LineError>>> {
    let rewound = file.try_clone().and_then(|mut f| {
        f.seek(SeekFrom::Start(0))?;
        Ok(f)
    });
    let f = match rewound {
        Ok(f) => f,
        Err(e) => {
            return Box::new(std::iter::once(Err(LineError {
                line: 0,
                reason: format!("cannot read the list again: {e}"),
            })))
        }
    };
    Box::new(
        BufReader::new(f)
            .lines()
            .zip(1u64..)
            .filter_map(move |(text, n)| {
                line.set(n);
                let parsed = text.map_err(|e| e.to_string()).and_then(|t| parse_line(&t));
                match parsed {
                    Ok(Some(e)) => Some(Ok(e)),
                    Ok(None) => None,
                    Err(reason) => Some(Err(LineError { line: n, reason })),
                }
            }),
    )
}

/// Opens the list, copying standard input (`-`) to a temporary file.
fn open_list(path: &Path) -> anyhow::Result<File> {
    if path == Path::new("-") {
        let mut spool = tempfile::tempfile()
            .map_err(|e| anyhow::Error::new(e).context("cannot create a temporary file"))?;
        io::copy(&mut io::stdin().lock(), &mut spool).map_err(|e| {
            anyhow::Error::new(e).context("cannot copy the live extents from standard input")
        })?;
        return Ok(spool);
    }
    File::open(path).map_err(|e| {
        anyhow::Error::new(UsageError::new(format!(
            "cannot open the live-extent list {}: {e}",
            path.display()
        )))
    })
}

/// Runs `reconcile`.
///
/// # Errors
/// Store errors: a malformed list (exit 2), a list naming free space
/// (exit 4), a store in use, I/O errors (exit 1).
pub fn run(a: &ReconcileArgs) -> anyhow::Result<()> {
    let list = open_list(&a.live)?;
    // A writer's open: it takes the device's lock, so no other writer runs
    // meanwhile (busy otherwise, exit code 5).
    let dev = FileDevice::open(&a.device, a.direct.into())
        .map_err(|e| super::open_error(&a.device, e))?;
    let (store, _) = Store::open(dev)?;
    let line = Rc::new(Cell::new(0));
    let opts = ReconcileOptions {
        dry_run: a.dry_run,
        ..ReconcileOptions::default()
    };
    let name = if a.live == Path::new("-") {
        "standard input".to_string()
    } else {
        a.live.display().to_string()
    };
    let r = store.reconcile(|| extents(&list, line.clone()), opts);
    // Closed on every orderly end, so that the next open finds the close
    // record and replays nothing; a dry run writes nothing, not even that.
    // After a failure the close is tried too (its commits so far are
    // durable); its own error would only hide the first one.
    let closed = if a.dry_run {
        Ok(())
    } else {
        store.close_shared()
    };
    let r = r.map_err(|e| {
        let at = match &e {
            StoreError::Reconcile(
                ReconcileError::NotAllocated { .. }
                | ReconcileError::Overlap { .. }
                | ReconcileError::OutOfOrder { .. }
                | ReconcileError::Metadata { .. }
                | ReconcileError::OutOfRange { .. },
            ) => format!("in {name} at line {}", line.get()),
            _ => format!("in {name}"),
        };
        anyhow::Error::new(e).context(at)
    })?;
    closed?;
    let bs = store.layout().block_size;
    if a.json {
        println!("{}", report_json(&a.device, &r, bs));
    } else {
        print!("{}", report_text(&a.device, &r, bs));
    }
    Ok(())
}

fn report_json(device: &Path, r: &ReconcileReport, block_size: u64) -> serde_json::Value {
    serde_json::json!({
        "device": device.display().to_string(),
        "dry_run": r.dry_run,
        "block_size": block_size,
        "live_extents": r.live_extents,
        "live_blocks": r.live_blocks,
        "freed_extents": r.freed_extents,
        "freed_blocks": r.freed_blocks,
        "freed_bytes": r.freed_blocks.saturating_mul(block_size),
        "commits": r.commits,
    })
}

fn report_text(device: &Path, r: &ReconcileReport, block_size: u64) -> String {
    let bytes = |blocks: u64| human_bytes(blocks.saturating_mul(block_size));
    let mut out = format!(
        "reconciled {}{}\n  {} live extents checked ({} blocks, {})\n",
        device.display(),
        if r.dry_run {
            " (dry run: nothing changed)"
        } else {
            ""
        },
        r.live_extents,
        r.live_blocks,
        bytes(r.live_blocks)
    );
    let verb = if r.dry_run { "would free" } else { "freed" };
    out += &format!(
        "  {verb} {} extents: {} blocks ({})",
        r.freed_extents,
        r.freed_blocks,
        bytes(r.freed_blocks)
    );
    if !r.dry_run {
        out += &format!(" in {} commits", r.commits);
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_or_say_why_not() {
        assert_eq!(parse_line(" 10, 4 "), Ok(Some(Extent::new(10, 4).unwrap())));
        assert_eq!(parse_line(""), Ok(None));
        assert_eq!(parse_line("# objects of bucket 7"), Ok(None));
        assert!(parse_line("10").unwrap_err().contains("start,len"));
        assert!(parse_line("x,4").unwrap_err().contains("start"));
        assert!(parse_line("10,-4").unwrap_err().contains("length"));
        assert!(parse_line("10,0").unwrap_err().contains("not an extent"));
        assert!(parse_line(&format!("{},2", u64::MAX))
            .unwrap_err()
            .contains("not an extent"));
    }

    #[test]
    fn the_list_is_read_from_the_start_each_pass() {
        let mut f = tempfile::tempfile().unwrap();
        io::Write::write_all(&mut f, b"# live\n5,2\n\n9,1\nbad\n").unwrap();
        let line = Rc::new(Cell::new(0));
        for _ in 0..2 {
            let v: Vec<_> = extents(&f, line.clone()).collect();
            assert_eq!(v.len(), 3);
            assert_eq!(*v[0].as_ref().unwrap(), Extent::new(5, 2).unwrap());
            assert_eq!(*v[1].as_ref().unwrap(), Extent::new(9, 1).unwrap());
            assert_eq!(v[2].as_ref().unwrap_err().line, 5);
            assert_eq!(line.get(), 5);
        }
    }

    #[test]
    fn reports_speak_in_human_units() {
        let r = ReconcileReport {
            dry_run: true,
            live_extents: 2,
            live_blocks: 3,
            freed_extents: 1,
            freed_blocks: 256,
            commits: 0,
        };
        let t = report_text(Path::new("dev"), &r, 4096);
        assert!(
            t.contains("would free 1 extents: 256 blocks (1.0 MiB)"),
            "{t}"
        );
        assert!(t.contains("nothing changed"), "{t}");
        let j = report_json(Path::new("dev"), &r, 4096);
        assert_eq!(j["freed_bytes"], 1 << 20);
        assert_eq!(j["dry_run"], true);
    }
}
