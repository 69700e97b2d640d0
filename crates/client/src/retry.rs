//! What a client keeps to survive cuts and restarts: the backoff between
//! resends, the request ids that make a resent `Allocate` or `Free` safe,
//! and the newest epoch seen per device (see "Retries" and "Fencing" in the
//! schema).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::calls::lock;
use crate::error::{ClientError, Result};

/// The first pause before a resend.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// The longest pause between resends.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Pauses between resends: [`FIRST_BACKOFF`], doubling up to
/// [`MAX_BACKOFF`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Backoff(FIRST_BACKOFF)
    }
}

impl Backoff {
    /// The next pause; the one after is twice as long (at most
    /// [`MAX_BACKOFF`]).
    pub(crate) fn next_pause(&mut self) -> Duration {
        let d = self.0;
        self.0 = (d * 2).min(MAX_BACKOFF);
        d
    }
}

/// State that every clone of a [`Client`](crate::Client) shares; `D`
/// names a device (as the caller names it).
#[derive(Debug)]
pub(crate) struct Session<D> {
    /// The next request id: a random start, then counting up.
    next_id: AtomicU64,
    /// The newest epoch seen per device.
    epochs: Mutex<HashMap<D, u64>>,
}

impl<D> Default for Session<D> {
    fn default() -> Self {
        Session {
            next_id: AtomicU64::new(random_u64()),
            epochs: Mutex::new(HashMap::new()),
        }
    }
}

/// 64 random bits: std's hasher keys come from the OS's random source.
pub(crate) fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id().into());
    h.finish()
}

impl<D: std::hash::Hash + Eq + Clone> Session<D> {
    /// A fresh request id: never 0 (0 asks for no retry protection).
    pub(crate) fn request_id(&self) -> u64 {
        loop {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            if id != 0 {
                return id;
            }
        }
    }

    /// The newest epoch seen for `device`; 0 for none.
    pub(crate) fn epoch(&self, device: &D) -> u64 {
        lock(&self.epochs).get(device).copied().unwrap_or(0)
    }

    /// Takes in the epoch of a reply about `device`: a newer one is
    /// remembered; an older one than already seen is a reply from a stale
    /// owner ([`ClientError::Fenced`]). 0 (a server that sends none) is
    /// taken as none.
    pub(crate) fn observe(&self, device: &D, got: u64) -> Result<()> {
        if got == 0 {
            return Ok(());
        }
        let mut m = lock(&self.epochs);
        let seen = m.entry(device.clone()).or_insert(0);
        if got < *seen {
            return Err(ClientError::Fenced { seen: *seen, got });
        }
        *seen = got;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_ten_milliseconds_to_a_second() {
        let mut b = Backoff::default();
        let pauses: Vec<u64> = (0..10).map(|_| b.next_pause().as_millis() as u64).collect();
        assert_eq!(pauses, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
    }

    #[test]
    fn request_ids_count_up_from_a_random_start_and_skip_zero() {
        let a = Session::<u32>::default();
        let b = Session::<u32>::default();
        let (x, y) = (a.request_id(), a.request_id());
        assert_eq!(y, x.wrapping_add(1).max(1));
        assert_ne!(x, b.request_id(), "two clients start apart");
        let s = Session::<u32>::default();
        s.next_id.store(u64::MAX, Ordering::Relaxed);
        assert_eq!(s.request_id(), u64::MAX);
        assert_eq!(s.request_id(), 1, "0 is skipped");
    }

    #[test]
    fn an_older_epoch_than_one_seen_is_fenced_and_zero_is_none() {
        let s = Session::<u32>::default();
        let d = 0u32;
        assert_eq!(s.epoch(&d), 0);
        s.observe(&d, 0).unwrap();
        s.observe(&d, 5).unwrap();
        s.observe(&d, 5).unwrap();
        assert_eq!(s.epoch(&d), 5);
        assert!(matches!(
            s.observe(&d, 4),
            Err(ClientError::Fenced { seen: 5, got: 4 })
        ));
        assert_eq!(s.epoch(&d), 5, "a stale reply changes nothing");
        s.observe(&d, 0).unwrap();
        s.observe(&d, 9).unwrap();
        assert_eq!(s.epoch(&d), 9);
        // Devices are apart.
        assert_eq!(s.epoch(&1u32), 0);
        s.observe(&1u32, 1).unwrap();
    }
}
