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

/// Opens a device file for the subcommands, naming the path in errors.
pub fn open(
    path: &std::path::Path,
    direct: DirectArg,
) -> anyhow::Result<blockalloc_store::device::FileDevice> {
    blockalloc_store::device::FileDevice::open(path, direct.into()).map_err(|e| {
        anyhow::Error::new(e).context(format!("cannot open the device {}", path.display()))
    })
}
