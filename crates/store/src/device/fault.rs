//! [`FaultDevice`]: a device for crash tests.
//!
//! It keeps two images: the **durable** one (what survives a power cut) and
//! the **current** one (what reads see), plus the list of writes made since
//! the last successful sync. A simulated crash ([`FaultDevice::crash_image`])
//! builds the image a reboot would find: the durable bytes with the unsynced
//! writes dropped, kept, torn, or kept sector by sector at random
//! ([`CrashMode`]). [`FaultDevice::fail_after`] makes every I/O call fail
//! once a countdown runs out, as a dying disk or a full thin volume would.

use std::io;
use std::sync::Mutex;

use rand::{Rng, SeedableRng};

use crate::sync::lock;

use super::{check_aligned, check_bounds, Device, SECTOR};

/// What becomes of the writes not yet synced when the power goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashMode {
    /// None of them reached the media.
    DropUnsynced,
    /// All of them did.
    KeepUnsynced,
    /// Only the last did: the device wrote its cache out of order.
    KeepLast,
    /// All but the last did; of the last, only its first `keep_sectors`
    /// 512-byte sectors did.
    TearLast {
        /// Sectors of the last write that landed.
        keep_sectors: usize,
    },
    /// Each 512-byte sector of each unsynced write landed or not, at random
    /// (in write order, so a later write to a sector wins when both land).
    RandomSectors {
        /// Seed of the coin flips.
        seed: u64,
    },
}

/// Counters of the calls a [`FaultDevice`] served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Successful reads.
    pub reads: u64,
    /// Successful writes.
    pub writes: u64,
    /// Successful syncs.
    pub syncs: u64,
    /// Calls refused by the injected fault.
    pub failed: u64,
}

#[derive(Debug)]
struct State {
    durable: Vec<u8>,
    current: Vec<u8>,
    unsynced: Vec<(u64, Vec<u8>)>,
    /// I/O calls left before every call fails; `None`: never.
    countdown: Option<u64>,
    stats: FaultStats,
}

/// A memory device that injects faults and simulates crashes. See the
/// [module documentation](crate::device).
///
/// ```
/// use blockalloc_store::device::{CrashMode, Device, FaultDevice};
/// let d = FaultDevice::new(vec![0; 8192]);
/// d.write_at(0, &[1; 4096])?;
/// d.sync()?;
/// d.write_at(4096, &[2; 4096])?;
/// let after = d.crash_image(CrashMode::DropUnsynced);
/// assert_eq!((after[0], after[4096]), (1, 0));
/// d.fail_after(0);
/// assert!(d.sync().is_err());
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct FaultDevice {
    state: Mutex<State>,
}

impl FaultDevice {
    /// A device whose durable and current contents are `image`.
    pub fn new(image: Vec<u8>) -> Self {
        FaultDevice {
            state: Mutex::new(State {
                durable: image.clone(),
                current: image,
                unsynced: Vec::new(),
                countdown: None,
                stats: FaultStats::default(),
            }),
        }
    }

    /// After `n` more successful I/O calls (reads, writes and syncs), every
    /// call fails with an error of kind `Other`.
    pub fn fail_after(&self, n: u64) {
        lock(&self.state).countdown = Some(n);
    }

    /// Stops failing.
    pub fn heal(&self) {
        lock(&self.state).countdown = None;
    }

    /// Counters so far.
    pub fn stats(&self) -> FaultStats {
        lock(&self.state).stats
    }

    /// Writes not yet synced.
    pub fn unsynced_writes(&self) -> usize {
        lock(&self.state).unsynced.len()
    }

    /// The image a reboot would find if the power went now. The device itself
    /// is unchanged.
    pub fn crash_image(&self, mode: CrashMode) -> Vec<u8> {
        let s = lock(&self.state);
        let mut img = s.durable.clone();
        let n = s.unsynced.len();
        let mut rng = match mode {
            CrashMode::RandomSectors { seed } => Some(rand::rngs::StdRng::seed_from_u64(seed)),
            _ => None,
        };
        for (i, (off, data)) in s.unsynced.iter().enumerate() {
            let off = *off as usize;
            match mode {
                CrashMode::DropUnsynced => {}
                CrashMode::KeepUnsynced => img[off..off + data.len()].copy_from_slice(data),
                CrashMode::KeepLast => {
                    if i + 1 == n {
                        img[off..off + data.len()].copy_from_slice(data);
                    }
                }
                CrashMode::TearLast { keep_sectors } => {
                    let keep = if i + 1 == n {
                        (keep_sectors * SECTOR).min(data.len())
                    } else {
                        data.len()
                    };
                    img[off..off + keep].copy_from_slice(&data[..keep]);
                }
                CrashMode::RandomSectors { .. } => {
                    let rng = rng.as_mut().expect("seeded above");
                    for (k, sector) in data.chunks(SECTOR).enumerate() {
                        if rng.random_bool(0.5) {
                            let o = off + k * SECTOR;
                            img[o..o + sector.len()].copy_from_slice(sector);
                        }
                    }
                }
            }
        }
        img
    }

    /// The current contents (what reads see), synced or not.
    pub fn current_image(&self) -> Vec<u8> {
        lock(&self.state).current.clone()
    }

    /// Counts one call against the countdown; `Err` when it has run out.
    fn tick(s: &mut State, what: &str) -> io::Result<()> {
        match s.countdown {
            Some(0) => {
                s.stats.failed += 1;
                Err(io::Error::other(format!("injected fault: {what} failed")))
            }
            Some(ref mut n) => {
                *n -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }
}

impl Device for FaultDevice {
    fn len(&self) -> u64 {
        lock(&self.state).current.len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_aligned(offset, buf.len())?;
        let mut s = lock(&self.state);
        check_bounds(s.current.len() as u64, offset, buf.len(), false)?;
        Self::tick(&mut s, "read")?;
        let o = offset as usize;
        buf.copy_from_slice(&s.current[o..o + buf.len()]);
        s.stats.reads += 1;
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        check_aligned(offset, data.len())?;
        let mut s = lock(&self.state);
        check_bounds(s.current.len() as u64, offset, data.len(), true)?;
        Self::tick(&mut s, "write")?;
        let o = offset as usize;
        s.current[o..o + data.len()].copy_from_slice(data);
        s.unsynced.push((offset, data.to_vec()));
        s.stats.writes += 1;
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut s = lock(&self.state);
        Self::tick(&mut s, "sync")?;
        let State {
            durable, unsynced, ..
        } = &mut *s;
        for (off, data) in unsynced.drain(..) {
            let o = off as usize;
            durable[o..o + data.len()].copy_from_slice(&data);
        }
        s.stats.syncs += 1;
        Ok(())
    }

    fn describe(&self) -> String {
        format!("fault-injecting memory device of {} bytes", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> FaultDevice {
        FaultDevice::new(vec![0; 4 * 4096])
    }

    #[test]
    fn unsynced_writes_are_visible_but_not_durable() {
        let d = dev();
        d.write_at(0, &[1; 4096]).unwrap();
        let mut buf = [0u8; 4096];
        d.read_at(0, &mut buf).unwrap();
        assert_eq!(buf[0], 1);
        assert_eq!(d.unsynced_writes(), 1);
        assert_eq!(d.crash_image(CrashMode::DropUnsynced)[0], 0);
        assert_eq!(d.crash_image(CrashMode::KeepUnsynced)[0], 1);
        d.sync().unwrap();
        assert_eq!(d.unsynced_writes(), 0);
        assert_eq!(d.crash_image(CrashMode::DropUnsynced)[0], 1);
        assert_eq!(d.current_image()[0], 1);
    }

    #[test]
    fn tear_last_keeps_a_prefix_of_the_last_write_only() {
        let d = dev();
        d.write_at(0, &[1; 4096]).unwrap();
        d.write_at(4096, &[2; 8192]).unwrap();
        let img = d.crash_image(CrashMode::TearLast { keep_sectors: 3 });
        assert!(img[..4096].iter().all(|&b| b == 1));
        assert!(img[4096..4096 + 3 * 512].iter().all(|&b| b == 2));
        assert!(img[4096 + 3 * 512..].iter().all(|&b| b == 0));
    }

    #[test]
    fn random_sectors_lands_some_sectors_whole() {
        let d = dev();
        d.write_at(0, &[7; 16384]).unwrap();
        let img = d.crash_image(CrashMode::RandomSectors { seed: 3 });
        let landed = img.chunks(SECTOR).filter(|s| s[0] == 7).count();
        assert!(landed > 0 && landed < 32, "{landed}");
        for s in img.chunks(SECTOR) {
            assert!(s.iter().all(|&b| b == s[0]), "a sector is all or nothing");
        }
        assert_eq!(img, d.crash_image(CrashMode::RandomSectors { seed: 3 }));
    }

    #[test]
    fn countdown_fails_every_call_after_it_runs_out() {
        let d = dev();
        d.fail_after(2);
        d.write_at(0, &[1; 4096]).unwrap();
        d.sync().unwrap();
        assert!(d.write_at(0, &[2; 4096]).is_err());
        assert!(d.sync().is_err());
        assert!(d.read_at(0, &mut [0; 4096]).is_err());
        assert_eq!(d.stats().failed, 3);
        assert_eq!(d.crash_image(CrashMode::KeepUnsynced)[0], 1);
        d.heal();
        assert!(d.sync().is_ok());
        assert_eq!(
            d.stats(),
            FaultStats {
                reads: 0,
                writes: 1,
                syncs: 2,
                failed: 3
            }
        );
    }

    #[test]
    fn refuses_unaligned_and_out_of_range() {
        let d = dev();
        assert!(d.write_at(100, &[0; 4096]).is_err());
        assert!(d.write_at(4 * 4096, &[0; 4096]).is_err());
        assert!(d.read_at(0, &mut [0; 100]).is_err());
    }
}
