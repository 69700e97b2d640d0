//! Growing an array into fresh memory a stretch at a time.
//!
//! The first write to a page of fresh memory is a page fault: about 3 µs on
//! the 2-core VM these engines are measured on, several times the cost of a
//! whole operation. An array that grows one element at a time takes that
//! fault inside whichever operation first reaches the page — for the B+tree's
//! leaves (1.5 KiB each) one leaf split in three while the tree grows, which
//! put segfit's p99.9 above 2 µs in the fill levels where it grows fastest.
//! [`push`] instead writes [`AHEAD_BYTES`] of spare capacity
//! in one go when a push reaches memory not yet written: one longer stall
//! (16 pages) in place of sixteen slow operations. Memory use is unchanged
//! but for at most `AHEAD_BYTES` of capacity reserved early. The class
//! stacks, too many and mostly too small to each write 64 KiB ahead, use
//! [`push_doubling`]: they write all their new capacity when they double.

/// How much spare capacity is written at a time: 16 pages of 4 KiB.
pub(crate) const AHEAD_BYTES: usize = 64 << 10;

/// Pushes `item` onto `v`. `written` is how many slots of `v`'s buffer hold
/// data written by an earlier push (the array's own bookkeeping; it starts
/// at 0). When the push would use a slot beyond it, the next `AHEAD_BYTES`
/// worth of slots are written with `blank` first.
pub(crate) fn push<T: Copy>(v: &mut Vec<T>, written: &mut usize, item: T, blank: T) {
    let len = v.len();
    // A clone has a buffer of its own (capacity close to its length), so
    // `written` only counts up to the current capacity.
    if len >= (*written).min(v.capacity()) {
        let ahead = (AHEAD_BYTES / std::mem::size_of::<T>().max(1)).max(1);
        v.reserve(ahead);
        for slot in v.spare_capacity_mut().iter_mut().take(ahead) {
            slot.write(blank);
        }
        *written = len + ahead;
    }
    v.push(item);
}

/// Pushes `item` onto `v`, which is one of many small arrays (a class
/// stack) that cannot each write [`AHEAD_BYTES`] ahead. When `v` is full its
/// capacity doubles and all the new capacity is written at once, with
/// `item` as the blank: the page faults of growing into fresh memory land
/// in this one push instead of one in every page's worth of pushes. Memory
/// is what `Vec` doubling reserves anyway.
#[inline]
pub(crate) fn push_doubling<T: Copy>(v: &mut Vec<T>, item: T) {
    if v.len() == v.capacity() {
        write_doubled(v, item);
    }
    v.push(item);
}

#[cold]
fn write_doubled<T: Copy>(v: &mut Vec<T>, blank: T) {
    v.reserve(v.capacity().max(16));
    for slot in v.spare_capacity_mut() {
        slot.write(blank);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pushes_in_order_and_writes_ahead() {
        let mut v: Vec<u64> = Vec::new();
        let mut written = 0;
        let ahead = AHEAD_BYTES / 8;
        for i in 0..3 * ahead as u64 + 5 {
            push(&mut v, &mut written, i, u64::MAX);
            assert!(written >= v.len(), "every pushed slot was written ahead");
            assert!(
                v.capacity() >= written,
                "the written stretch lies in the buffer"
            );
        }
        assert_eq!(v, (0..3 * ahead as u64 + 5).collect::<Vec<_>>());
        // Written ahead in whole stretches: the last one started at 3 * ahead.
        assert_eq!(written, 4 * ahead);
        // A clone writes again from its own length.
        let mut c = v.clone();
        let mut cw = written;
        push(&mut c, &mut cw, 7, 0);
        assert_eq!(c.last(), Some(&7));
        assert_eq!(c.len(), v.len() + 1);
        assert!(c.capacity() >= cw && cw >= c.len());
    }

    #[test]
    fn push_doubling_keeps_order_and_doubles() {
        let mut v: Vec<u32> = Vec::new();
        let mut caps = Vec::new();
        for i in 0..1000u32 {
            push_doubling(&mut v, i);
            if caps.last() != Some(&v.capacity()) {
                caps.push(v.capacity());
            }
        }
        assert_eq!(v, (0..1000).collect::<Vec<_>>());
        // 16 first, then at least doubling: few growths, little slack.
        assert_eq!(caps[0], 16);
        assert!(caps.windows(2).all(|w| w[1] >= 2 * w[0]));
        assert!(v.capacity() < 2 * 1000 + 16);
    }
}
