//! The fused backward through score and mask modifiers: a forward saved
//! for the backward with modifiers, then `Saved::backward`, on the storage and subgroup
//! families, NaN-prefilled, against the f64 reference backward: every preset (soft-capping
//! and ALiBi through their derivatives, the mask presets through P), causal and not, with
//! grouped-query heads and L ≠ S, all of them combined with a boolean mask and a scale; a
//! caller's `score_mod` with its `score_mod_grad` and `mask_mod`, reading buffers, against
//! their CPU forms (closures) in the reference; and a caller's `score_mod` without its
//! derivative refused before any work; the tensor forms equal to the
//! array forms; f16 operands; the dQ kernels' block sparsity (empty tiles skipped, full ones
//! without the mask modifier) leaving the gradients as they are; T5's relative bias table's
//! own gradient (`Gradients::relative_bias`), alone and before a soft-cap.

mod common;

use ndarray::{Array2, Array4};
use wgpu_attention::modifiers::{BufferData, Modifiers, Preset};
use wgpu_attention::{reference, Attention, Dtype, Error, Inputs, Kernels, Mask, Options, Tensor};

/// The families whose backward applies modifiers, forced, NaN-prefilled, saving for the
/// backward.
fn saved_on(kernels: Kernels) -> Attention {
    Attention::new()
        .return_weights(false)
        .save_for_backward(true)
        .options(Options::default().kernels(kernels).nan_fill(true))
}

const FAMILIES: [Kernels; 2] = [Kernels::Storage, Kernels::Subgroup];

/// Q `(b, h, L, e)`, K and V `(b, h_kv, S, e)`, and dO `(b, h, L, e)`; values up to 3 so
/// soft-capping at 1.5 bends the scores well away from linear.
fn problem(b: usize, h: usize, h_kv: usize, l: usize, s: usize, e: usize) -> [Array4<f32>; 4] {
    [
        common::smooth((b, h, l, e), 1, 3.0),
        common::smooth((b, h_kv, s, e), 2, 3.0),
        common::smooth((b, h_kv, s, e), 3, 3.0),
        common::smooth((b, h, l, e), 4, 3.0),
    ]
}

/// The largest relative error of the output and the three gradients of `op` with `mask`
/// against the reference's (a caller's modifiers there in their CPU form).
fn worst(op: Attention, [q, k, v, d_o]: &[Array4<f32>; 4], mask: &Mask<'_>) -> f64 {
    let ctx = common::ctx();
    let inputs = Inputs::qkv(q, k, v).mask(mask);
    let want = reference::backward(&op, &inputs, d_o.view().into_dyn()).unwrap();
    let want_out = reference::run(&op.return_weights(true), &inputs).unwrap();
    let out = op.run(ctx, inputs).unwrap();
    let g = out.saved.unwrap().backward(ctx, d_o.view()).unwrap();
    let mut rel = reference::compare(&out.context, &want_out.context).0;
    for (got, want) in [(&g.q, &want.q), (&g.k, &want.k), (&g.v, &want.v)] {
        let (got, want) = (got.as_ref().unwrap(), want.as_ref().unwrap());
        assert!(got.iter().all(|x| x.is_finite()));
        rel = rel.max(reference::compare(got, want).0);
    }
    // A relative bias's table gets its gradient exactly when the reference has one.
    assert_eq!(g.relative_bias.is_some(), want.relative_bias.is_some());
    if let (Some(got), Some(want)) = (&g.relative_bias, &want.relative_bias) {
        assert_eq!(got.shape(), want.shape());
        rel = rel.max(reference::compare(got, want).0);
    }
    rel
}

/// [`worst`] under 1e-4 on both families, causal and not, at `scale` (else the default).
fn assert_within_on_both_families(scale: Option<f32>, data: &[Array4<f32>; 4], mask: &Mask<'_>) {
    let mut failures = Vec::new();
    for kernels in FAMILIES {
        for causal in [false, true] {
            let op = saved_on(kernels).causal(causal);
            let op = scale.map_or(op, |s| op.scale(s));
            let rel = worst(op, data, mask);
            if rel > 1e-4 {
                failures.push(format!("{kernels:?} causal={causal}: {rel:.2e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_preset_backward_matches_the_reference_on_both_families() {
    let (b, h, h_kv, l, s, e) = (2, 4, 2, 37, 45, 12);
    let data = problem(b, h, h_kv, l, s, e);
    let presets = common::every_preset(b, h, s);
    let mut failures = Vec::new();
    let mut largest = 0f64;
    for kernels in FAMILIES {
        for (i, p) in presets.iter().enumerate() {
            for causal in [false, true] {
                let mods = Modifiers::new().preset(p.clone());
                let mask = Mask::none().with_modifiers(&mods);
                let rel = worst(saved_on(kernels).causal(causal), &data, &mask);
                largest = largest.max(rel);
                if rel > 1e-4 {
                    failures.push(format!("{kernels:?} preset {i} causal={causal}: {rel:.2e}"));
                }
            }
        }
        // Everything at once (the score presets chained), with a boolean mask, L ≠ S the
        // other way round and a scale.
        let data = problem(b, h, h_kv, 29, 13, 8);
        let keep = Array2::from_shape_fn((29, 13), |(i, j)| (i * 7 + j) % 5 != 0);
        // T5's bias before the soft-cap: its table's gradient goes back through the cap.
        let mods = Modifiers::new()
            .preset(Preset::Alibi(Preset::alibi_slopes(h)))
            .preset(presets[5].clone())
            .preset(Preset::Softcap(2.0))
            .preset(Preset::Window { left: 8, right: 3 })
            .preset(Preset::PrefixLm(4));
        let mask = Mask::boolean(keep.view().into_dyn()).with_modifiers(&mods);
        for causal in [false, true] {
            let op = saved_on(kernels).causal(causal).scale(0.7);
            let rel = worst(op, &data, &mask);
            largest = largest.max(rel);
            if rel > 1e-4 {
                failures.push(format!("{kernels:?} combined causal={causal}: {rel:.2e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    eprintln!("largest relative error: {largest:.2e}");
}

#[test]
fn a_callers_score_mod_with_its_grad_matches_its_cpu_form() {
    // A soft-cap reading its cap from a buffer, and ALiBi from a slope buffer, in one
    // score_mod (soft-cap of the ALiBi-biased score), with their derivative; and a window as
    // a caller's mask_mod; each with its CPU form, which the reference applies.
    let (b, h, h_kv) = (1, 4, 2);
    let data = problem(b, h, h_kv, 30, 41, 8);
    let slopes = Preset::alibi_slopes(h);
    let biased = {
        let slopes = slopes.clone();
        move |s: f64, h: usize, q: usize, kv: usize| {
            s + f64::from(slopes[h]) * (kv as f64 - q as f64)
        }
    };
    let grad_biased = biased.clone();
    let mods = Modifiers::new()
        .score_mod(
            "softcap_alibi.wgsl",
            "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    \
             let s = score + slope[h] * (f32(kv) - f32(q));\n    \
             return cap[0] * tanh(s / cap[0]);\n}\n",
        )
        .score_mod_cpu(move |s, _b, h, q, kv| 1.5 * (biased(s, h, q, kv) / 1.5).tanh())
        .score_mod_grad(
            "softcap_alibi_grad.wgsl",
            "fn score_mod_grad(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    \
             let t = tanh((score + slope[h] * (f32(kv) - f32(q))) / cap[0]);\n    \
             return 1.0 - t * t;\n}\n",
        )
        .score_mod_grad_cpu(move |s, _b, h, q, kv| {
            let t = (grad_biased(s, h, q, kv) / 1.5).tanh();
            1.0 - t * t
        })
        .mask_mod(
            "window.wgsl",
            "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {\n    \
             return i32(kv) - i32(q) >= -6 && i32(kv) - i32(q) <= 9;\n}\n",
        )
        .mask_mod_cpu(|_b, _h, q, kv| (-6..=9).contains(&(kv as i64 - q as i64)))
        .buffer("slope", BufferData::F32(slopes))
        .buffer("cap", BufferData::F32(vec![1.5]));
    assert_within_on_both_families(None, &data, &Mask::none().with_modifiers(&mods));
}

#[test]
fn a_callers_modifiers_reading_buffers_give_their_cpu_forms_gradients() {
    // A score_mod reading a per-head temperature and slope from an f32 buffer (derivative:
    // the temperature), chained with a soft-cap preset after it, and a mask_mod reading a
    // per-batch window from an i32 buffer beside 4 attention sinks (StreamingLLM); two batch
    // indices, grouped-query heads, L = 37 and S = 53.
    let (b, h, h_kv, l, s) = (2, 4, 2, 37, 53);
    let data = problem(b, h, h_kv, l, s, 12);
    // (temperature, slope) of each head: [t0, .., t3, s0, .., s3].
    let per_head: Vec<f32> = (0..h)
        .map(|i| 0.6 + 0.3 * i as f32)
        .chain((0..h).map(|i| 0.02 + 0.05 * i as f32))
        .collect();
    let window = vec![9i32, 20];
    let (heads, grad_heads, windows) = (per_head.clone(), per_head.clone(), window.clone());
    let mods = Modifiers::new()
        .score_mod(
            "tempered.wgsl",
            "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    \
             return head[h] * score - head[4u + h] * abs(f32(kv) - f32(q));\n}\n",
        )
        .score_mod_cpu(move |t, _b, h, q, kv| {
            f64::from(heads[h]) * t - f64::from(heads[4 + h]) * (kv as f64 - q as f64).abs()
        })
        .score_mod_grad(
            "tempered_grad.wgsl",
            "fn score_mod_grad(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    \
             return head[h];\n}\n",
        )
        .score_mod_grad_cpu(move |_t, _b, h, _q, _kv| f64::from(grad_heads[h]))
        .buffer("head", BufferData::F32(per_head))
        .mask_mod(
            "sinks.wgsl",
            "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {\n    \
             return kv < 4u || kv + u32(window[b]) >= q;\n}\n",
        )
        .mask_mod_cpu(move |b, _h, q, kv| kv < 4 || kv + windows[b] as usize >= q)
        .buffer("window", BufferData::I32(window))
        .preset(Preset::Softcap(5.0));
    assert_within_on_both_families(Some(0.3), &data, &Mask::none().with_modifiers(&mods));
}

#[test]
fn a_callers_score_mod_without_its_grad_is_refused_before_the_forward() {
    let [q, k, v, _] = problem(1, 2, 2, 9, 9, 8);
    let mods = Modifiers::new().score_mod(
        "double.wgsl",
        "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    \
         return 2.0 * score;\n}\n",
    );
    let mask = Mask::none().with_modifiers(&mods);
    let ctx = common::ctx();
    let saved = saved_on(Kernels::Storage).run(ctx, Inputs::qkv(&q, &k, &v).mask(&mask));
    match saved {
        Err(Error::Unsupported { feature, hint, .. }) => {
            assert!(feature.contains("score_mod_grad"), "{feature}");
            assert!(hint.contains("fn score_mod_grad("), "{hint}");
        }
        other => panic!("expected Unsupported, got {:?}", other.map(drop)),
    }
    // The plain forward needs no derivative.
    saved_on(Kernels::Storage)
        .save_for_backward(false)
        .run(ctx, Inputs::qkv(&q, &k, &v).mask(&mask))
        .unwrap();
}

#[test]
fn the_tensor_forms_give_the_array_forms_gradients_bit_for_bit() {
    // A saved forward on tensors keeps the modifiers as the array form does.
    let ctx = common::ctx();
    let (b, h, h_kv) = (2, 4, 2);
    let [q, k, v, d_o] = problem(b, h, h_kv, 21, 33, 8);
    let mods = Modifiers::new()
        .preset(common::every_preset(b, h, 33)[5].clone())
        .preset(Preset::Softcap(1.5))
        .preset(Preset::Window { left: 4, right: 4 });
    // (batch, heads, rows, width) into the tensors' (batch, rows, heads, width).
    let rows = |a: ndarray::ArrayViewD<'_, f32>| {
        a.permuted_axes(vec![0, 2, 1, 3])
            .as_standard_layout()
            .into_owned()
    };
    let bits = |a: &ndarray::ArrayD<f32>| a.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for kernels in FAMILIES {
        let mask = Mask::none().with_modifiers(&mods);
        let op = saved_on(kernels).causal(true);
        let out = op.run(ctx, Inputs::qkv(&q, &k, &v).mask(&mask)).unwrap();
        let want = out.saved.unwrap().backward(ctx, d_o.view()).unwrap();
        let t = |a: &Array4<f32>| {
            Tensor::from_array(ctx, rows(a.view().into_dyn()).view(), Dtype::F32).unwrap()
        };
        let (q_t, k_t, v_t, d_t) = (t(&q), t(&k), t(&v), t(&d_o));
        let out_t = op
            .run(ctx, Inputs::qkv(&q_t, &k_t, &v_t).mask(&mask))
            .unwrap();
        let g = out_t.saved.unwrap().backward(ctx, &d_t).unwrap();
        for (got, want) in [(&g.q, &want.q), (&g.k, &want.k), (&g.v, &want.v)] {
            let got = got.as_ref().unwrap().to_array(ctx).unwrap();
            assert_eq!(
                bits(&got),
                bits(&rows(want.as_ref().unwrap().view())),
                "{kernels:?}"
            );
        }
        // The table's gradient, (buckets, heads) in both forms.
        let table = g.relative_bias.as_ref().unwrap().to_array(ctx).unwrap();
        assert_eq!(bits(&table), bits(want.relative_bias.as_ref().unwrap()));
    }
}

#[test]
fn f16_operands_through_the_modifiers() {
    // Q, K, V stored as f16 on the device (all arithmetic f32): the reference sees the same
    // rounded inputs, which f16 holds exactly.
    let ctx = common::ctx();
    ctx.require_f16()
        .expect("the test adapter (lavapipe) has shader-f16");
    let h = 4;
    let data = problem(1, h, 2, 29, 35, 12).map(|a| a.mapv(|x| half::f16::from_f32(x).to_f32()));
    let mods = Modifiers::new()
        .preset(Preset::Alibi(Preset::alibi_slopes(h)))
        .preset(Preset::Softcap(1.5))
        .preset(Preset::Window { left: 9, right: 4 });
    let mask = Mask::none().with_modifiers(&mods);
    for kernels in FAMILIES {
        for causal in [false, true] {
            let op = saved_on(kernels).causal(causal).dtype(Dtype::F16);
            let rel = worst(op, &data, &mask);
            assert!(rel < 1e-4, "{kernels:?} causal={causal}: {rel:.2e}");
        }
    }
}

#[test]
fn the_dq_kernels_skip_empty_tiles_without_changing_the_gradients() {
    // Long enough that most key tiles of a query block are empty or full (the dQ kernels
    // read the block map; the dK/dV kernels visit every tile), no multiple of any tile,
    // L ≠ S, per-batch documents (a map per batch).
    let (b, h, h_kv, e) = (2, 2, 1, 8);
    let cases: Vec<(&str, usize, usize, Modifiers, bool)> = vec![
        (
            "causal window 40",
            300,
            300,
            Modifiers::new().preset(Preset::Window { left: 40, right: 0 }),
            true,
        ),
        (
            "window 10,70 and a soft-cap",
            200,
            300,
            Modifiers::new()
                .preset(Preset::Softcap(1.5))
                .preset(Preset::Window {
                    left: 10,
                    right: 70,
                }),
            false,
        ),
        (
            "documents",
            300,
            300,
            Modifiers::new().preset(common::uneven_documents(b, 300)),
            true,
        ),
    ];
    let mut failures = Vec::new();
    for (name, l, s, mods, causal) in &cases {
        let data = problem(b, h, h_kv, *l, *s, e);
        let mask = Mask::none().with_modifiers(mods);
        for kernels in FAMILIES {
            let rel = worst(saved_on(kernels).causal(*causal), &data, &mask);
            if rel > 1e-4 {
                failures.push(format!("{name} {kernels:?}: {rel:.2e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
