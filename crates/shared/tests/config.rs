//! Configurations and device sizes the shared handle must refuse with a
//! typed error, or serve without memory proportional to the device.

use std::thread;

use blockalloc::{BuildError, Extent};
use blockalloc_shared::{ConfigError, SharedAllocator, SharedConfig, MAX_ARENAS, MAX_REGIONS};

fn config(region_blocks: u64) -> SharedConfig {
    SharedConfig {
        region_blocks,
        max_arenas: 4,
        keep_empty_regions: 1,
    }
}

#[test]
fn an_empty_device_is_zero_capacity_not_a_panic() {
    let cfg = SharedConfig::for_capacity(0);
    assert_eq!(
        SharedAllocator::from_free_extents(0, &[], cfg).unwrap_err(),
        ConfigError::Build(BuildError::ZeroCapacity)
    );
    assert_eq!(
        SharedAllocator::new(0).unwrap_err(),
        ConfigError::Build(BuildError::ZeroCapacity)
    );
    // A full device (nothing free) is fine.
    let a = SharedAllocator::from_free_extents(100, &[], config(16)).unwrap();
    assert_eq!(a.used(), 100);
    a.verify().unwrap();
}

#[test]
fn region_sizes_that_are_not_powers_of_two_are_refused() {
    for region_blocks in [0, 3, 1000, (1 << 63) + 1, u64::MAX] {
        let e = SharedAllocator::with_config(1 << 20, config(region_blocks)).unwrap_err();
        assert_eq!(e, ConfigError::RegionNotPowerOfTwo { region_blocks });
        assert!(e.to_string().contains("power of two"), "{e}");
    }
}

/// A device where only its last 100 blocks are free: every allocation
/// lands in the last region, whose end is the device's end.
fn serve_the_last_blocks(capacity: u64, cfg: SharedConfig) {
    let tail = Extent::from_range(capacity - 100, capacity).unwrap();
    let a = SharedAllocator::from_free_extents(capacity, &[tail], cfg).unwrap();
    let b = a.clone();
    let (x, y) =
        thread::spawn(move || (b.allocate(10, None).unwrap(), b.allocate(90, None).unwrap()))
            .join()
            .unwrap();
    assert!(tail.contains(&x) && tail.contains(&y), "{x} {y}");
    assert_eq!(a.used(), capacity);
    a.verify().unwrap();
    a.free(x).unwrap();
    a.free(y).unwrap();
    assert_eq!(a.free_extents(), vec![tail]);
    assert!(a.free(tail).is_err(), "a double free at the end is caught");
    a.verify().unwrap();
}

#[test]
fn a_region_of_2_pow_63_blocks_works_at_the_end_of_a_u64_max_device() {
    serve_the_last_blocks(u64::MAX, config(1 << 63));
}

#[test]
fn a_capacity_within_one_region_of_u64_max_works() {
    for capacity in [u64::MAX, u64::MAX - 1, u64::MAX - (1 << 40)] {
        let cfg = SharedConfig::for_capacity(capacity);
        assert!(capacity.div_ceil(cfg.region_blocks) <= MAX_REGIONS);
        serve_the_last_blocks(capacity, cfg);
        // And all free, from several threads.
        let a = SharedAllocator::new(capacity).unwrap();
        let hs: Vec<_> = (0..3)
            .map(|_| {
                let a = a.clone();
                thread::spawn(move || a.allocate(1 << 30, None).unwrap())
            })
            .collect();
        let v: Vec<Extent> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        a.verify().unwrap();
        for e in v {
            a.free(e).unwrap();
        }
        assert_eq!(a.used(), 0);
    }
}

#[test]
fn too_many_regions_is_a_typed_error_before_any_allocation() {
    // 2^64 - 1 blocks in 4096-block regions would be 2^52 regions.
    let e = SharedAllocator::with_config(u64::MAX, config(1 << 12)).unwrap_err();
    assert!(
        matches!(e, ConfigError::TooManyRegions { regions, max, .. }
            if regions == 1 << 52 && max == MAX_REGIONS),
        "{e}"
    );
    assert!(e.to_string().contains("use larger regions"), "{e}");
    let e = SharedAllocator::with_config(MAX_REGIONS * 16 + 1, config(16)).unwrap_err();
    assert!(matches!(e, ConfigError::TooManyRegions { .. }), "{e}");
    SharedAllocator::with_config(MAX_REGIONS * 16, config(16)).unwrap();
}

#[test]
fn arena_counts_out_of_range_are_refused() {
    for max_arenas in [0, MAX_ARENAS + 1, usize::MAX] {
        let cfg = SharedConfig {
            max_arenas,
            ..config(1 << 12)
        };
        assert_eq!(
            SharedAllocator::with_config(1 << 20, cfg).unwrap_err(),
            ConfigError::Arenas {
                max_arenas,
                max: MAX_ARENAS
            }
        );
    }
}

#[test]
fn a_2_pow_44_block_device_needs_megabytes_not_gigabytes() {
    // 64 PiB of 4 KiB blocks: each of the 65 arenas used to size tables by
    // the device.
    let cap = 1u64 << 44;
    let a = SharedAllocator::new(cap).unwrap();
    let fresh = a.memory_bytes();
    assert!(
        fresh < 48 << 20,
        "{fresh} bytes for a fresh 2^44-block device"
    );
    let hs: Vec<_> = (0..4)
        .map(|_| {
            let a = a.clone();
            thread::spawn(move || {
                let v: Vec<_> = (0..100)
                    .map(|_| a.allocate(1 << 10, None).unwrap())
                    .collect();
                // This thread's arena holds a region or two, and says so.
                assert!(a.cached_blocks() > 0);
                v
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in hs {
        all.extend(h.join().unwrap());
    }
    a.verify().unwrap();
    assert!(a.memory_bytes() < 48 << 20, "{}", a.memory_bytes());
    for e in all {
        a.free(e).unwrap();
    }
    assert_eq!(a.used(), 0);
    a.verify().unwrap();
}

#[test]
fn thread_arena_tables_grow_with_the_regions_they_hold() {
    // Many small regions: a thread arena that holds a few of them must not
    // pay for all of them.
    let cap = MAX_REGIONS * 64;
    let a = SharedAllocator::with_config(cap, config(64)).unwrap();
    let before = a.memory_bytes();
    let b = a.clone();
    let (e, during) = thread::spawn(move || {
        let e = b.allocate(200, None).unwrap();
        (e, b.memory_bytes())
    })
    .join()
    .unwrap();
    // A few leased regions: a page or two more, not a device-sized table.
    assert!(
        during < before + (64 << 10),
        "{before} bytes before, {during} with one thread holding a few regions"
    );
    a.free(e).unwrap();
    a.verify().unwrap();
}
