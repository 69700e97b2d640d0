//! Property tests: random operation sequences on every engine, each step
//! checked against the reference model by the `Checked` harness: results
//! (extents free before and used after, the right typed error on refusal),
//! the engine's documented placement policy, an unchanged engine after every
//! error, `verify()`, and `free_extents()` equal to the model's maximal runs.

mod common;

use blockalloc::{EngineKind, GROUP_BLOCKS};
use proptest::prelude::*;

use common::ops::{Driver, Hint, Op};

/// Device sizes: mostly small, plus some around two block groups so that
/// `groups` has several groups (and a short last one) to choose from.
fn capacity(large_weight: u32) -> impl Strategy<Value = u64> {
    prop_oneof![
        8 => 1..=5000u64,
        large_weight => (2 * GROUP_BLOCKS - 1000)..=(2 * GROUP_BLOCKS + 1000),
    ]
}

fn hint() -> impl Strategy<Value = Hint> {
    prop_oneof![
        Just(Hint::None),
        Just(Hint::Stream),
        any::<u64>().prop_map(Hint::At),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        30 => (any::<u64>(), hint()).prop_map(|(len, hint)| Op::Allocate { len, hint }),
        10 => any::<u64>().prop_map(|len| Op::Scattered { len }),
        20 => any::<u64>().prop_map(|pick| Op::FreeLive { pick }),
        10 => any::<(u64, u64, u64)>().prop_map(|(pick, a, b)| Op::FreePart { pick, a, b }),
        7 => any::<u64>().prop_map(|pick| Op::FreeUnion { pick }),
        5 => any::<u64>().prop_map(|pick| Op::DoubleFree { pick }),
        5 => any::<(u64, u64, u64)>()
            .prop_map(|(pick, a, b)| Op::FreeOverlappingFree { pick, a, b }),
        3 => any::<(u64, u64)>().prop_map(|(a, b)| Op::FreeOutOfRange { a, b }),
        5 => any::<(u64, u64)>().prop_map(|(a, b)| Op::FreeRandom { a, b }),
        5 => any::<(u64, u64, u64)>()
            .prop_map(|(pick, stride, count)| Op::Shred { pick, stride, count }),
        3 => any::<(u8, u64)>().prop_map(|(which, a)| Op::BadAllocate { which, a }),
    ]
}

/// Runs `ops` on a fresh `kind` engine of `cap` blocks, then frees what is
/// left and checks that the device is whole again.
fn run(kind: EngineKind, cap: u64, ops: &[Op]) {
    let mut d = Driver::new(kind, cap);
    for &o in ops {
        d.apply(o);
    }
    d.free_all();
}

macro_rules! engine_proptest {
    ($name:ident, $kind:expr, $large_weight:expr) => {
        proptest! {
            #![proptest_config(ProptestConfig {
                cases: 128,
                ..ProptestConfig::default()
            })]
            #[test]
            fn $name(
                cap in capacity($large_weight),
                ops in prop::collection::vec(op(), 1..200),
            ) {
                run($kind, cap, &ops);
            }
        }
    };
}

engine_proptest!(segfit_matches_model, EngineKind::SegFit, 1);
engine_proptest!(bitmap_matches_model, EngineKind::Bitmap, 1);
engine_proptest!(groups_matches_model, EngineKind::Groups, 4);
engine_proptest!(pool_matches_model, EngineKind::Pool, 1);

#[test]
fn every_engine_has_a_property_test() {
    // A new engine must get its own `engine_proptest!` line above.
    assert_eq!(EngineKind::ALL.len(), 4);
}
