//! The key split of `flash_blocked.wgsl` (flash-decoding's, for prefill on GPUs), forced with
//! `KeySplit::Ranges` on the default adapter (lavapipe in CI, where `Auto` never splits), and
//! checked against the f64 reference: odd sizes, causal, masks, key lengths, grouped-query
//! `sdpa`, f16, the log-sum-exp a saved forward keeps for the backward; and against the
//! unsplit kernel, which it must equal within rounding. Outputs are pre-filled with NaN.

mod common;

use ndarray::Array4;
use wgpu_attention::internals::{FlashVariant, KeySplit};
use wgpu_attention::verify::{self, Case, MaskCase};
use wgpu_attention::{reference, Attention, Dtype, Inputs, Kernels, Mask, Options};

/// 4 × 4 blocks (widths ≤ 16): even 7 keys are two tiles, so every size splits.
const TINY: FlashVariant = FlashVariant::Blocked { rows: 4, keys: 4 };
const GPU: FlashVariant = FlashVariant::Blocked { rows: 64, keys: 32 };

/// Runs each case fused with each of `variants`, split into each of `ranges`, and collects
/// the failures.
fn check(cases: &[Case], variants: &[FlashVariant], ranges: &[u32]) {
    let ctx = common::ctx();
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let case = case.on(Kernels::Storage, true);
        for &v in variants {
            for &n in ranges {
                // What `Case::op` sets (the case's kernels, NaN-filled outputs), and the
                // variant and the split, in one `Options`.
                let op = case.op().options(
                    Options::default()
                        .kernels(case.kernels)
                        .nan_fill(true)
                        .flash_variant(v)
                        .key_split(KeySplit::Ranges(n)),
                );
                match verify::run_case_with(ctx, &case, op, 200 + i as u64) {
                    Ok(r) if r.passed() => {}
                    Ok(r) => failures.push(format!("{v} split {n}: {r}")),
                    Err(e) => failures.push(format!("{v} split {n} {case}: {e}")),
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n{}",
        verify::HEADER,
        failures.join("\n")
    );
}

fn plain(n: usize, d: usize) -> Case {
    Case::new(n, d, d, d).weights(false)
}

#[test]
fn odd_sizes_and_causal_match_the_reference() {
    let mut cases = Vec::new();
    for n in [1, 7, 37, 300] {
        for causal in [false, true] {
            cases.push(plain(n, 16).causal(causal).batch(2));
        }
    }
    check(&cases, &[TINY], &[2, 3, 100]);
    let big: Vec<Case> = [false, true]
        .into_iter()
        .map(|causal| Case::new(300, 32, 128, 128).causal(causal).heads(2))
        .collect();
    check(&big, &[GPU], &[3, 10]);
}

#[test]
fn masks_lengths_gqa_and_f16_match_the_reference() {
    let mut cases = Vec::new();
    for mask in [MaskCase::Bool, MaskCase::Float, MaskCase::Lengths] {
        for (n, causal) in [(37, true), (7, false)] {
            cases.push(
                Case::new(n, 16, 32, 32)
                    .mask(mask)
                    .causal(causal)
                    .heads(2)
                    .batch(2),
            );
        }
    }
    for (n, n_kv, kv_heads, causal) in [(37, 300, 2, false), (7, 130, 4, true), (1, 65, 2, false)] {
        cases.push(
            Case::new(n, 16, 4 * 16, 4 * 12)
                .heads(4)
                .batch(2)
                .causal(causal)
                .mask(MaskCase::Bool)
                .sdpa((n_kv, kv_heads)),
        );
    }
    for (n, causal, mask) in [(37, true, MaskCase::None), (7, false, MaskCase::Lengths)] {
        cases.push(
            Case::new(n, 16, 32, 32)
                .dtype(Dtype::F16)
                .causal(causal)
                .mask(mask)
                .heads(2),
        );
    }
    check(&cases, &[TINY], &[3]);
}

#[test]
fn split_equals_unsplit_within_rounding() {
    let ctx = common::ctx();
    let [q, k, v] = common::sdpa_arrays(2, 4, 37, 300, 32, 24);
    let keep = ndarray::Array2::from_shape_fn((37, 300), |(i, j)| (i + 3 * j) % 5 != 0);
    let mask = Mask::boolean(keep.view().into_dyn()).with_kv_lengths(&[300, 123]);
    for causal in [false, true] {
        let op = Attention::new().causal(causal).return_weights(false);
        let run = |split| {
            op.options(
                Options::default()
                    .nan_fill(true)
                    .kernels(Kernels::Storage)
                    .flash_variant(GPU)
                    .key_split(split),
            )
            .run(ctx, Inputs::qkv(&q, &k, &v).mask(&mask))
            .unwrap()
            .context
        };
        let whole = run(KeySplit::Off);
        for n in [2, 5, 10] {
            let split = run(KeySplit::Ranges(n));
            let worst = whole
                .iter()
                .zip(&split)
                .map(|(a, b)| (a - b).abs() / a.abs().max(1.0))
                .fold(0.0f32, f32::max);
            assert!(worst < 1e-6, "causal={causal} ranges={n}: {worst:e}");
        }
    }
}

#[test]
fn a_split_saved_forward_keeps_the_log_sum_exp_for_the_backward() {
    let ctx = common::ctx();
    let f = |salt: f32| {
        move |(a, b, c, d): (usize, usize, usize, usize)| {
            ((a * 31 + b * 17 + c * 7 + d) as f32 * salt).sin()
        }
    };
    let keep = ndarray::Array2::from_shape_fn((37, 45), |(i, j)| (i + 2 * j) % 7 != 0);
    let mask = Mask::boolean(keep.view().into_dyn()).with_kv_lengths(&[45, 30]);
    let q = Array4::from_shape_fn((2, 4, 37, 20), f(0.13));
    let k = Array4::from_shape_fn((2, 2, 45, 20), f(0.29));
    let v = Array4::from_shape_fn((2, 2, 45, 12), f(0.41));
    let d_o = Array4::from_shape_fn((2, 4, 37, 12), f(0.07));
    for causal in [false, true] {
        let op = Attention::new().causal(causal).options(
            Options::default()
                .nan_fill(true)
                .flash_variant(FlashVariant::Blocked { rows: 8, keys: 8 })
                .key_split(KeySplit::Ranges(4)),
        );
        let inputs = Inputs::qkv(&q, &k, &v).mask(&mask);
        let want = reference::backward(&op, &inputs, d_o.view().into_dyn()).unwrap();
        let out = op.save_for_backward(true).run(ctx, inputs.clone()).unwrap();
        let saved = out.saved.clone().unwrap();
        let forward = reference::run(&op, &inputs).unwrap();
        let (rel, _) = reference::compare(&out.context, &forward.context);
        assert!(rel < 1e-5, "causal={causal} forward: {rel:e}");
        let g = saved.backward(ctx, d_o.view()).unwrap();
        for (got, want) in [(&g.q, &want.q), (&g.k, &want.k), (&g.v, &want.v)] {
            let (rel, _) = reference::compare(got.as_ref().unwrap(), want.as_ref().unwrap());
            assert!(rel < 1e-5, "causal={causal}: {rel:e}");
        }
    }
}
