//! The lists of cases `verify` runs: the fixed sweep, the quick cases that reach every path,
//! and random cases from a seed.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::cases::{Case, MaskCase, ModsCase};
use crate::attention::Dtype;
use crate::variant::Kernels;

/// A few cases that between them take every path of a call (projections with biases at odd
/// widths, Q = K = V = X with causal, grouped-query `sdpa` with L ≠ S and key lengths, a left
/// window with causal), small enough to run with every variant forced in turn under the GPU
/// stand-in (`verify --quick --variants`, CI's).
pub fn quick_cases() -> Vec<Case> {
    vec![
        Case {
            bias: true,
            ..Case::new(37, 13, 12, 8)
        },
        Case {
            weights: false,
            causal: true,
            ..Case::new(65, 16, 16, 16)
        },
        Case {
            sdpa: Some((53, 2)),
            heads: 4,
            batch: Some(2),
            mask: MaskCase::Lengths,
            causal: true,
            ..Case::new(37, 16, 64, 32)
        },
        Case {
            sdpa: Some((23, 4)),
            heads: 4,
            batch: Some(2),
            causal: true,
            mods: ModsCase::WindowLeft,
            ..Case::new(23, 16, 64, 64)
        },
    ]
}

/// The fixed sweep `verify` runs: sizes from 1 to 1000 rows, odd widths, d_k ≠ d_v, batch,
/// heads, causal, bias, custom scale and large logits, masks, `sdpa` and the modifiers.
pub fn standard_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for &n in &[1usize, 2, 7, 37, 64, 129, 1000] {
        cases.push(Case::new(n, 16, 24, 28));
    }
    let base = Case::new(37, 13, 10, 6);
    cases.extend([
        Case {
            weights: false,
            ..Case::new(7, 5, 5, 5)
        },
        Case {
            weights: false,
            causal: true,
            ..Case::new(65, 9, 9, 9)
        },
        Case { bias: true, ..base },
        // One-column projections with biases (a 4-byte bias): the subgroup matmul once bound
        // it where an `array<vec2<f32>>` needs 8 bytes (found by random_cases(2, 1)).
        Case {
            bias: true,
            scale: Some(1.377),
            ..Case::new(59, 25, 3, 1)
        },
        Case {
            causal: true,
            ..base
        },
        Case {
            causal: true,
            bias: true,
            batch: Some(3),
            ..Case::new(129, 17, 12, 20)
        },
        Case { heads: 2, ..base },
        Case {
            heads: 4,
            batch: Some(2),
            causal: true,
            bias: true,
            ..Case::new(70, 31, 32, 16)
        },
        Case {
            heads: 8,
            ..Case::new(33, 64, 64, 64)
        },
        Case {
            scale: Some(0.05),
            ..base
        },
        Case {
            scale: Some(-0.7),
            causal: true,
            ..base
        },
        Case {
            batch: Some(1),
            ..Case::new(1, 3, 2, 1)
        },
        Case {
            batch: Some(5),
            ..Case::new(2, 1, 1, 1)
        },
        Case {
            magnitude: 30.0,
            ..Case::new(50, 16, 16, 16)
        },
        Case {
            magnitude: 12.0,
            weights: false,
            causal: true,
            ..Case::new(40, 24, 24, 24)
        },
        Case {
            causal: true,
            heads: 2,
            ..Case::new(1000, 16, 16, 32)
        },
        // nn.MultiheadAttention's shape: projections, heads, output projection with bias.
        Case {
            heads: 4,
            bias: true,
            batch: Some(2),
            out_proj: Some(32),
            ..Case::new(45, 32, 32, 32)
        },
        Case {
            causal: true,
            out_proj: Some(7),
            ..Case::new(37, 13, 10, 6)
        },
        // Masks: key lengths, boolean per (batch, head), float with -inf; with causal too.
        Case {
            mask: MaskCase::Lengths,
            batch: Some(4),
            heads: 2,
            ..Case::new(37, 16, 16, 8)
        },
        Case {
            mask: MaskCase::Bool,
            batch: Some(2),
            heads: 2,
            causal: true,
            ..Case::new(53, 16, 16, 8)
        },
        Case {
            mask: MaskCase::Float,
            bias: true,
            ..Case::new(129, 16, 24, 28)
        },
        Case {
            mask: MaskCase::Float,
            weights: false,
            causal: true,
            ..Case::new(40, 8, 8, 8)
        },
        // sdpa: L ≠ S both ways, grouped-query heads, with causal and masks.
        Case {
            sdpa: Some((53, 2)),
            heads: 4,
            batch: Some(2),
            causal: true,
            ..Case::new(37, 16, 32, 16)
        },
        Case {
            sdpa: Some((20, 1)),
            heads: 2,
            mask: MaskCase::Bool,
            causal: true,
            ..Case::new(70, 16, 16, 24)
        },
        Case {
            sdpa: Some((9, 4)),
            heads: 4,
            mask: MaskCase::Lengths,
            batch: Some(3),
            ..Case::new(1, 8, 8, 8)
        },
    ]);
    // Score and mask modifiers: each preset and all at once, on Q, K, V with L ≠ S and
    // grouped-query heads, causal and not, and on X with projections.
    let gqa = Case {
        sdpa: Some((53, 2)),
        heads: 4,
        batch: Some(2),
        ..Case::new(37, 16, 32, 16)
    };
    for (mods, causal) in [
        (ModsCase::Window, true),
        (ModsCase::WindowLeft, true),
        (ModsCase::Softcap, false),
        (ModsCase::Alibi, true),
        (ModsCase::Documents, false),
        (ModsCase::PrefixLm, true),
        (ModsCase::All, true),
        (ModsCase::All, false),
    ] {
        cases.push(Case {
            mods,
            causal,
            ..gqa
        });
    }
    cases.push(Case {
        mods: ModsCase::All,
        mask: MaskCase::Bool,
        causal: true,
        heads: 2,
        batch: Some(2),
        bias: true,
        ..Case::new(45, 16, 16, 8)
    });
    cases
}

/// `count` random cases from `seed`: sizes up to a few hundred, every option at random.
pub fn random_cases(count: usize, seed: u64) -> Vec<Case> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    (0..count)
        .map(|_| {
            let heads = [1, 1, 2, 3, 4][rng.random_range(0..5)];
            let weights = rng.random_bool(0.8);
            let d: usize = rng.random_range(1..=48);
            let (d_k, d_v) = if weights {
                (
                    heads * rng.random_range(1..=16),
                    heads * rng.random_range(1..=16),
                )
            } else {
                let d = d.div_ceil(heads) * heads;
                (d, d)
            };
            let d = if weights { d } else { d_k };
            Case {
                batch: rng.random_bool(0.4).then(|| rng.random_range(1..=4)),
                n: rng.random_range(1..=300),
                d,
                d_k,
                d_v,
                heads,
                causal: rng.random_bool(0.5),
                weights,
                bias: weights && rng.random_bool(0.5),
                scale: rng.random_bool(0.2).then(|| rng.random_range(-1.0..2.0)),
                magnitude: if rng.random_bool(0.15) { 10.0 } else { 1.0 },
                out_proj: (weights && rng.random_bool(0.25)).then(|| rng.random_range(1..=20)),
                kernels: Kernels::Auto,
                fused: false,
                mask: [
                    MaskCase::None,
                    MaskCase::None,
                    MaskCase::Lengths,
                    MaskCase::Bool,
                    MaskCase::Float,
                ][rng.random_range(0..5)],
                dtype: Dtype::F32,
                sdpa: rng.random_bool(0.2).then(|| {
                    (
                        rng.random_range(1..=300),
                        [1, heads][rng.random_range(0..2)],
                    )
                }),
                mods: ModsCase::None,
                flash: None,
                matmul: None,
            }
        })
        .collect()
}
