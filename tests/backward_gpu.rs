//! The fused GPU backward (`Attention::save_for_backward` + `run` → `Saved::backward`)
//! against the f64 reference (`reference::backward`): every gradient, on odd sizes, L ≠ S, causal,
//! boolean and float masks, key lengths, grouped-query heads, a custom scale, large logits,
//! fully masked rows and f16, each with NaN-prefilled outputs and through each fused forward
//! (flash_tiled, flash_blocked, flash_subgroup) that saves the row statistics; and the
//! errors of a backward without a matching forward.

mod common;

use ndarray::{Array4, ArrayD, IxDyn};
use wgpu_attention::internals::{BlockedOptions, FlashVariant};
use wgpu_attention::{reference, Attention, Context, Dims, Dtype, Error, Inputs, Mask, Options};

/// The fused forwards that can save the statistics, each forced.
fn variants() -> Vec<FlashVariant> {
    let mut v = vec![
        FlashVariant::Tiled { keys: 32 },
        FlashVariant::Blocked { rows: 32, keys: 32 },
    ];
    if common::ctx().subgroup_size().is_some() {
        v.push(FlashVariant::Subgroup { rows_per_lane: 2 });
    }
    v
}

/// A smooth, deterministic dO of the output's shape.
fn grad_output(shape: [usize; 4]) -> Array4<f32> {
    Array4::from_shape_fn(shape, |(a, b, c, d)| {
        (((a * 13 + b * 7 + c * 3 + d) as f32) * 0.37).cos()
    })
}

/// Natural log-sum-exp of every row's scores, in f64, from the definition; -inf when
/// nothing is visible.
fn lse_reference(op: &Attention, q: &Array4<f32>, k: &Array4<f32>, mask: &Mask<'_>) -> ArrayD<f64> {
    let (b, h, l, e) = q.dim();
    let (h_kv, s) = (k.dim().1, k.dim().2);
    let dims = Dims::new(op, &Inputs::qkv(q, k, k)).unwrap();
    let (scale, causal) = (f64::from(dims.scale), dims.causal);
    let bias = mask
        .bias([b, h, l, s])
        .unwrap()
        .map(|m| m.broadcast((b, h, l, s)).unwrap().to_owned());
    ArrayD::from_shape_fn(IxDyn(&[b, h, l]), |ix| {
        let (bi, hi, i) = (ix[0], ix[1], ix[2]);
        let hk = hi / (h / h_kv);
        let scores: Vec<f64> = (0..s)
            .filter(|&j| !(causal && j > i))
            .filter_map(|j| {
                let bias = bias.as_ref().map_or(0.0, |m| m[[bi, hi, i, j]]);
                if bias == f32::MIN {
                    return None;
                }
                let dot: f64 = (0..e)
                    .map(|c| f64::from(q[[bi, hi, i, c]]) * f64::from(k[[bi, hk, j, c]]))
                    .sum();
                Some(scale * dot + f64::from(bias))
            })
            .collect();
        let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if scores.is_empty() {
            return f64::NEG_INFINITY;
        }
        m + scores.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
    })
}

/// Runs the saved forward and the backward of `op` on every variant and checks the
/// output, the saved log-sum-exp and every gradient against the reference to `tol`
/// (relative, ‖got − want‖ / ‖want‖).
fn check(op: Attention, [q, k, v]: &[Array4<f32>; 3], mask: &Mask<'_>, tol: f64, label: &str) {
    check_as(
        common::ctx(),
        op,
        Dtype::F32,
        &[q.clone(), k.clone(), v.clone()],
        mask,
        tol,
        label,
    );
}

/// [`check`] with the operands stored as `dtype` on the device.
fn check_as(
    ctx: &Context,
    op: Attention,
    dtype: Dtype,
    [q, k, v]: &[Array4<f32>; 3],
    mask: &Mask<'_>,
    tol: f64,
    label: &str,
) {
    let op = op.options(Options::default().nan_fill(true)).dtype(dtype);
    // What the device holds under f16: the reference sees the same rounded inputs.
    let round = |a: &Array4<f32>| match dtype {
        Dtype::F16 => a.mapv(|x| half::f16::from_f32(x).to_f32()),
        _ => a.clone(),
    };
    let (qr, kr, vr) = (round(q), round(k), round(v));
    let (b, h, l, _) = q.dim();
    let d_o = grad_output([b, h, l, v.dim().3]);
    let rounded = Inputs::qkv(&qr, &kr, &vr).mask(mask);
    let want = reference::backward(&op, &rounded, d_o.view().into_dyn()).unwrap();
    let want_out = reference::run(&op, &rounded).unwrap();
    let want_lse = lse_reference(&op, &qr, &kr, mask);
    for variant in variants() {
        let op = op.options(Options::default().nan_fill(true).flash_variant(variant));
        let out = op
            .save_for_backward(true)
            .run(ctx, Inputs::qkv(q, k, v).mask(mask))
            .unwrap_or_else(|e| panic!("{label} {variant}: {e}"));
        let saved = out.saved.clone().unwrap();
        assert!(out.weights.is_none());
        let (rel, _) = reference::compare(&out.context, &want_out.context);
        assert!(rel < tol, "{label} {variant}: output {rel:e}");
        let lse = saved.log_sum_exp(ctx).unwrap();
        for (got, want) in lse.iter().zip(want_lse.iter()) {
            let ok = match want.is_finite() {
                true => (f64::from(*got) - want).abs() <= 1e-5 * (1.0 + want.abs()),
                false => *got == f32::NEG_INFINITY,
            };
            assert!(ok, "{label} {variant}: lse {got} vs {want}");
        }
        let g = saved
            .backward(ctx, d_o.view())
            .unwrap_or_else(|e| panic!("{label} {variant}: {e}"));
        for (name, got, want) in [
            ("dQ", &g.q, &want.q),
            ("dK", &g.k, &want.k),
            ("dV", &g.v, &want.v),
        ] {
            let (got, want) = (got.as_ref().unwrap(), want.as_ref().unwrap());
            assert_eq!(got.shape(), want.shape(), "{label} {name}");
            let (rel, max_abs) = reference::compare(got, want);
            assert!(
                rel < tol,
                "{label} {variant}: {name} relative error {rel:e} (max abs {max_abs:e})"
            );
        }
    }
}

#[test]
fn gradients_match_the_reference_on_odd_sizes() {
    for (b, h, l, s, e, ev) in [(1, 1, 1, 1, 1, 1), (2, 2, 7, 37, 5, 3), (1, 1, 37, 7, 8, 8)] {
        let label = format!("b={b} h={h} L={l} S={s} E={e} E_v={ev}");
        check(
            Attention::new(),
            &common::sdpa_arrays(b, h, l, s, e, ev),
            &Mask::none(),
            1e-5,
            &label,
        );
    }
}

#[test]
fn causal_gradients_match_with_l_above_and_below_s() {
    for (l, s) in [(37, 7), (7, 37), (130, 101)] {
        let arrays = common::sdpa_arrays(1, 2, l, s, 16, 12);
        check(
            Attention::new().causal(true),
            &arrays,
            &Mask::none(),
            1e-5,
            &format!("causal L={l} S={s}"),
        );
    }
}

#[test]
fn grouped_query_heads_sum_into_the_shared_head() {
    // 4 query heads on 2 K/V heads, a boolean mask, key lengths, causal, a custom scale.
    let [q, _, _] = common::sdpa_arrays(2, 4, 45, 45, 16, 24);
    let [_, k, v] = common::sdpa_arrays(2, 2, 45, 45, 16, 24);
    let keep = ndarray::Array2::from_shape_fn((45, 45), |(i, j)| (i * 7 + j * 3) % 5 != 0);
    let mask = Mask::boolean(keep.view().into_dyn()).with_kv_lengths(&[40, 17]);
    let op = Attention::new().causal(true).scale(0.3);
    check(op, &[q, k, v], &mask, 1e-5, "gqa");
}

#[test]
fn float_masks_and_fully_masked_rows_give_exact_zeros() {
    let [q, k, v] = common::sdpa_arrays(2, 1, 9, 11, 6, 5);
    // -inf on a stripe, finite biases elsewhere; row 4 of every batch index sees nothing.
    let bias = ndarray::Array2::from_shape_fn((9, 11), |(i, j)| match (i, j) {
        (4, _) => f32::NEG_INFINITY,
        (_, j) if j % 4 == 1 => f32::NEG_INFINITY,
        _ => ((i + 2 * j) as f32 * 0.3).sin(),
    });
    let mask = Mask::additive(bias.view().into_dyn());
    check(
        Attention::new(),
        &[q.clone(), k.clone(), v.clone()],
        &mask,
        1e-5,
        "float mask",
    );
    let ctx = common::ctx();
    let saved = Attention::new()
        .options(Options::default().nan_fill(true))
        .save_for_backward(true)
        .run(ctx, Inputs::qkv(&q, &k, &v).mask(&mask))
        .unwrap()
        .saved
        .unwrap();
    let g = saved
        .backward(ctx, grad_output([2, 1, 9, 5]).view())
        .unwrap();
    assert!(g
        .q
        .as_ref()
        .unwrap()
        .slice(ndarray::s![.., .., 4, ..])
        .iter()
        .all(|&x| x == 0.0));
    // Keys no row sees get exactly nothing.
    assert!(g
        .k
        .as_ref()
        .unwrap()
        .slice(ndarray::s![.., .., 1, ..])
        .iter()
        .all(|&x| x == 0.0));
    assert!(g
        .v
        .as_ref()
        .unwrap()
        .slice(ndarray::s![.., .., 5, ..])
        .iter()
        .all(|&x| x == 0.0));
    // Key length 0: every row of batch index 1 sees nothing.
    let mask = Mask::none().with_kv_lengths(&[11, 0]);
    check(
        Attention::new().causal(true),
        &[q.clone(), k.clone(), v.clone()],
        &mask,
        1e-5,
        "lengths",
    );
    let saved = Attention::new()
        .options(Options::default().nan_fill(true))
        .save_for_backward(true)
        .run(ctx, Inputs::qkv(&q, &k, &v).mask(&mask))
        .unwrap()
        .saved
        .unwrap();
    let g = saved
        .backward(ctx, grad_output([2, 1, 9, 5]).view())
        .unwrap();
    for a in [&g.q, &g.k, &g.v] {
        assert!(a
            .as_ref()
            .unwrap()
            .slice(ndarray::s![1, .., .., ..])
            .iter()
            .all(|&x| x == 0.0));
    }
}

#[test]
fn large_logits_stay_finite_and_accurate() {
    let [q, k, v] = common::sdpa_arrays(1, 2, 33, 29, 8, 8);
    let q = q.mapv(|x| x * 40.0);
    // Scores of ~250: f32 rounds each to ~1.5e-5, and the forward's log-sum-exp and the
    // backward's recomputed scores round apart (measured up to ~4e-4 relative on dQ).
    check(
        Attention::new(),
        &[q, k, v],
        &Mask::none(),
        1e-3,
        "large logits",
    );
}

#[test]
fn f16_storage_matches_the_reference_of_the_rounded_inputs() {
    if common::ctx().require_f16().is_err() {
        return;
    }
    let arrays = common::sdpa_arrays(1, 2, 37, 41, 12, 20);
    let op = Attention::new().causal(true);
    // f16 storage, f32 arithmetic: a GPU's default multiplies f16 operands in f16 in
    // flash-blocked (the WGSL sanitizer plans as one), whose rounding is not this bound's.
    let ctx = Context::new()
        .unwrap()
        .with_tuning(false)
        .with_blocked_options(BlockedOptions::default().f16_arithmetic(false));
    check_as(&ctx, op, Dtype::F16, &arrays, &Mask::none(), 1e-4, "f16");
}

#[test]
fn the_saved_forward_returns_what_the_plain_one_does() {
    let ctx = common::ctx();
    let [q, k, v] = common::sdpa_arrays(1, 2, 37, 23, 8, 8);
    for variant in variants() {
        let op = Attention::new()
            .causal(true)
            .return_weights(false)
            .options(Options::default().flash_variant(variant));
        let plain = op.run(ctx, Inputs::qkv(&q, &k, &v)).unwrap();
        let saved = op
            .save_for_backward(true)
            .run(ctx, Inputs::qkv(&q, &k, &v).mask(&Mask::none()))
            .unwrap();
        assert_eq!(plain.context, saved.context, "{variant}");
    }
}

fn saved_forward(ctx: &Context) -> (Array4<f32>, wgpu_attention::Saved) {
    let [q, k, v] = common::sdpa_arrays(1, 2, 5, 6, 4, 3);
    let out = Attention::new()
        .save_for_backward(true)
        .run(ctx, Inputs::qkv(&q, &k, &v).mask(&Mask::none()))
        .unwrap();
    let saved = out.saved.unwrap();
    (out.context.into_dimensionality().unwrap(), saved)
}

#[test]
fn a_backward_without_a_matching_forward_is_an_error() {
    let ctx = common::ctx();
    let (out, saved) = saved_forward(ctx);
    // dO of another shape.
    let wrong = Array4::<f32>::zeros((1, 2, 5, 4));
    let err = saved.backward(ctx, wrong.view()).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("backward without a matching forward"),
        "{err}"
    );
    assert!(
        err.to_string().contains("[1, 2, 5, 4]") && err.to_string().contains("[1, 2, 5, 3]"),
        "{err}"
    );
    // NaN and Inf in dO.
    for bad in [f32::NAN, f32::INFINITY] {
        let mut d_o = out.clone();
        d_o[[0, 1, 2, 0]] = bad;
        let err = saved.backward(ctx, d_o.view()).unwrap_err();
        // Named at the caller's index (the upload checks it in the caller's layout).
        assert!(
            matches!(err, Error::NonFinite { ref array, ref index, .. }
                if array == "dO" && index == &[0, 1, 2, 0]),
            "{err}"
        );
    }
    // A Saved from another context.
    let other = Context::new().unwrap().with_tuning(false);
    let err = saved.backward(&other, out.view()).unwrap_err();
    assert!(
        err.to_string()
            .contains("backward without a matching forward"),
        "{err}"
    );
    assert!(err.to_string().contains("another Context"), "{err}");
    // The right dO still works after the errors.
    let g = saved.backward(ctx, out.view()).unwrap();
    assert_eq!(g.v.unwrap().shape(), &[1, 2, 6, 3]);
}

#[test]
fn the_saved_forward_rejects_non_finite_inputs_even_when_propagating() {
    let ctx = common::ctx();
    let [mut q, k, v] = common::sdpa_arrays(1, 1, 3, 3, 4, 4);
    q[[0, 0, 1, 1]] = f32::NAN;
    let err = Attention::new()
        .options(Options::default().propagate_non_finite(true))
        .save_for_backward(true)
        .run(ctx, Inputs::qkv(&q, &k, &v).mask(&Mask::none()))
        .unwrap_err();
    assert!(matches!(err, Error::NonFinite { .. }), "{err}");
}

#[test]
fn each_family_runs_its_own_backward_kernels() {
    common::isolate();
    let ctx = Context::new().unwrap().with_tuning(false);
    ctx.set_profiling(true);
    let [q, k, v] = common::sdpa_arrays(1, 1, 20, 20, 8, 8);
    let d_o = grad_output([1, 1, 20, 8]);
    for variant in variants() {
        let kernel = match variant {
            FlashVariant::Subgroup { .. } => "flash_backward_kv_subgroup.wgsl",
            _ => "flash_backward_kv.wgsl",
        };
        let saved = Attention::new()
            .options(Options::default().flash_variant(variant))
            .save_for_backward(true)
            .run(&ctx, Inputs::qkv(&q, &k, &v).mask(&Mask::none()))
            .unwrap()
            .saved
            .unwrap();
        saved.backward(&ctx, d_o.view()).unwrap();
        // Under the WGSL sanitizer no pass reaches the adapter (nothing is timed): what ran
        // is the sanitizer's tally.
        let names: Vec<&str> = match ctx.sanitizing() {
            wgpu_attention::internals::Sanitize::Off => {
                ctx.kernel_times().iter().map(|t| t.kernel).collect()
            }
            _ => ctx.sanitizer_summary().dispatches.into_keys().collect(),
        };
        assert!(names.contains(&kernel), "{variant}: {names:?}");
    }
}
