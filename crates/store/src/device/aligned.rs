//! [`AlignedBuf`]: a byte buffer whose start is aligned to [`IO_ALIGN`], as
//! `O_DIRECT` requires, without `unsafe`.
//!
//! The buffer over-allocates a `Vec<u8>` by `IO_ALIGN` bytes and exposes the
//! sub-slice that starts at the first aligned address. Reading a pointer's
//! address is safe; the `Vec` is never grown, so the address never moves.

use super::IO_ALIGN;

/// A zero-initialised byte buffer whose first byte sits at an address that is
/// a multiple of [`IO_ALIGN`].
///
/// ```
/// use blockalloc_store::device::{AlignedBuf, IO_ALIGN};
/// let mut b = AlignedBuf::zeroed(8192);
/// assert_eq!(b.as_slice().as_ptr() as usize % IO_ALIGN, 0);
/// b.as_mut_slice()[0] = 1;
/// assert_eq!(b.len(), 8192);
/// ```
pub struct AlignedBuf {
    raw: Vec<u8>,
    offset: usize,
    len: usize,
}

impl AlignedBuf {
    /// A buffer of `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        let raw = vec![0u8; len + IO_ALIGN];
        let addr = raw.as_ptr() as usize;
        let offset = (IO_ALIGN - addr % IO_ALIGN) % IO_ALIGN;
        AlignedBuf { raw, offset, len }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The aligned bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.raw[self.offset..self.offset + self.len]
    }

    /// The aligned bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.offset..self.offset + self.len]
    }

    /// Sets every byte to zero.
    pub fn clear(&mut self) {
        self.as_mut_slice().fill(0);
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// True when `buf` starts at an [`IO_ALIGN`]-aligned address.
pub(crate) fn is_aligned(buf: &[u8]) -> bool {
    (buf.as_ptr() as usize).is_multiple_of(IO_ALIGN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_for_many_sizes() {
        for len in [0, 1, 511, 4096, 4097, 1 << 20] {
            let mut b = AlignedBuf::zeroed(len);
            assert_eq!(b.len(), len);
            assert_eq!(b.is_empty(), len == 0);
            assert!(is_aligned(b.as_slice()));
            assert!(b.as_slice().iter().all(|&x| x == 0));
            if len > 0 {
                b.as_mut_slice()[len - 1] = 9;
                assert_eq!(b.as_slice()[len - 1], 9);
                b.clear();
                assert_eq!(b.as_slice()[len - 1], 0);
            }
        }
    }
}
