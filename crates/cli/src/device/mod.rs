//! The device subcommands: `format`, `inspect`, `check`, `reconcile`, and
//! `bench --device`. Each validates its flags, then calls into
//! `blockalloc-store` / `blockalloc-bench`; none decides anything the
//! libraries do not.

pub mod args;
pub mod bench;
pub mod check;
pub mod format;
pub mod inspect;
pub mod reconcile;

use blockalloc_store::device::DirectIo;

use self::args::DirectArg;

impl From<DirectArg> for DirectIo {
    fn from(d: DirectArg) -> Self {
        match d {
            DirectArg::Auto => DirectIo::Auto,
            DirectArg::On => DirectIo::On,
            DirectArg::Off => DirectIo::Off,
        }
    }
}

/// Opens a device file for reading only (no lock: a writer may run
/// meanwhile; read-only files and file systems work), naming the path in
/// errors.
pub fn open_read_only(
    path: &std::path::Path,
    direct: DirectArg,
) -> anyhow::Result<blockalloc_store::device::FileDevice> {
    blockalloc_store::device::FileDevice::open_read_only(path, direct.into())
        .map_err(|e| open_error(path, e))
}

fn open_error(path: &std::path::Path, e: std::io::Error) -> anyhow::Error {
    if blockalloc_store::device::DeviceBusy::from_io(&e).is_some() {
        anyhow::Error::new(blockalloc_store::StoreError::from_open(path, e))
    } else {
        // The device layer's message already names the path and what failed.
        anyhow::Error::new(e)
    }
}

/// The note a read-only tool prints when `writer` holds the device.
pub fn writer_note(
    path: &std::path::Path,
    writer: Option<blockalloc_store::device::LockHolder>,
) -> Option<String> {
    writer.map(|h| {
        format!(
            "{} is in use by a writer ({h}): this view may be stale",
            path.display()
        )
    })
}

/// The journal entry recovery discarded, for `--json`: `null`, or its
/// sequence number, size, reason, and `torn_write`: true when every sector
/// is intact (the write in flight at a crash, nothing committed lost), false
/// when the entry may have been a commit damaged later (format version 1).
pub fn discarded_entry(end: &blockalloc_store::JournalEnd) -> serde_json::Value {
    use blockalloc_store::JournalEnd;
    match end {
        JournalEnd::TornTail { seq, bytes, reason } => {
            serde_json::json!({"seq": seq, "bytes": bytes, "reason": reason, "torn_write": false})
        }
        JournalEnd::Interrupted { seq, bytes, reason } => {
            serde_json::json!({"seq": seq, "bytes": bytes, "reason": reason, "torn_write": true})
        }
        JournalEnd::Clean => serde_json::Value::Null,
    }
}
