//! [`MemDevice`]: a device in memory, for tests and examples.

use std::io;
use std::sync::Mutex;

use crate::sync::lock;

use super::{check_aligned, check_bounds, Device};

/// A device whose bytes live in memory. Writes are durable at once, so
/// `sync` does nothing; [`super::FaultDevice`] adds crash behaviour on top.
///
/// It enforces the alignment rule of the [`Device`] contract so that tests
/// catch a store that would break `O_DIRECT`.
#[derive(Debug)]
pub struct MemDevice {
    bytes: Mutex<Vec<u8>>,
}

impl MemDevice {
    /// A zero-filled device of `len` bytes.
    pub fn new(len: u64) -> Self {
        let len = usize::try_from(len).expect("a memory device fits in the address space");
        MemDevice {
            bytes: Mutex::new(vec![0; len]),
        }
    }

    /// A device holding `image`.
    pub fn from_image(image: Vec<u8>) -> Self {
        MemDevice {
            bytes: Mutex::new(image),
        }
    }

    /// A copy of every byte.
    pub fn image(&self) -> Vec<u8> {
        lock(&self.bytes).clone()
    }

    /// Overwrites bytes directly, bypassing the alignment rule: tests use it
    /// to corrupt metadata.
    pub fn poke(&self, offset: u64, data: &[u8]) {
        let mut b = lock(&self.bytes);
        let o = offset as usize;
        b[o..o + data.len()].copy_from_slice(data);
    }

    /// Reads bytes directly, bypassing the alignment rule.
    pub fn peek(&self, offset: u64, len: usize) -> Vec<u8> {
        let b = lock(&self.bytes);
        let o = offset as usize;
        b[o..o + len].to_vec()
    }
}

impl Device for MemDevice {
    fn len(&self) -> u64 {
        lock(&self.bytes).len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_aligned(offset, buf.len())?;
        let b = lock(&self.bytes);
        check_bounds(b.len() as u64, offset, buf.len(), false)?;
        let o = offset as usize;
        buf.copy_from_slice(&b[o..o + buf.len()]);
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        check_aligned(offset, data.len())?;
        let mut b = lock(&self.bytes);
        check_bounds(b.len() as u64, offset, data.len(), true)?;
        let o = offset as usize;
        b[o..o + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        Ok(())
    }

    fn describe(&self) -> String {
        format!("memory device of {} bytes", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_back_and_refuse_bad_requests() {
        let d = MemDevice::new(16384);
        d.write_at(4096, &[5u8; 4096]).unwrap();
        let mut buf = vec![0u8; 8192];
        d.read_at(0, &mut buf).unwrap();
        assert!(buf[..4096].iter().all(|&b| b == 0));
        assert!(buf[4096..].iter().all(|&b| b == 5));
        assert_eq!(
            d.write_at(16384, &[0u8; 4096]).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            d.read_at(12288, &mut [0u8; 8192]).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        assert!(d.write_at(1, &[0u8; 4096]).is_err());
        d.poke(3, &[1, 2]);
        assert_eq!(d.peek(2, 4), vec![0, 1, 2, 0]);
        assert_eq!(MemDevice::from_image(d.image()).peek(3, 2), vec![1, 2]);
    }
}
