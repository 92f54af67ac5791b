//! Every kernel family beyond the plain forward under the WGSL sanitizer,
//! at 32 and 64 lanes, each call right against the f64 reference and with nothing found
//! (no race, no index out of bounds, no unwritten read, no divergent barrier, no loop past
//! its kernel's stated bound): the backward kernels of the storage and subgroup families
//! (grouped-query heads, causal, presets, T5's bias table's own gradient, f16 operands),
//! decode through the KV cache (f32 and f16 caches, presets), a training step (the MSE
//! loss, the layer's backward through its projections, Adam), the modifiers' presets and a
//! caller's WGSL on the fused and the weights paths (block maps included). Sizes are small
//! and multiples of no tile.

mod common;

use ndarray::{s, Array2, Array3, Array4, ArrayD, Axis};
use wgpu_attention::half::f16;
use wgpu_attention::internals::Sanitize;
use wgpu_attention::modifiers::{Modifiers, Preset};
use wgpu_attention::{
    reference, Adam, Attention, Context, Decoder, Dtype, Inputs, Kernels, KvCache, KvCacheSpec,
    Layer, Mask, MseLoss, Options, Projections, Recorder, Tensor,
};

/// The widths every check runs at: NVIDIA's warps and AMD's wave64.
const LANES: [u32; 2] = [32, 64];

/// The bound of an f32 call (the backward's sums over a few dozen terms stay far below it).
const TOL32: f64 = 1e-4;

/// The bound where f16 arithmetic enters: a GPU multiplies f16 operands in f16 in the fused
/// forward (P rounded to f16, `u = 2⁻¹¹` per term), a few units of f16's roundoff.
const TOL16: f64 = 4e-3;

/// A context under the sanitizer at `lanes`, untuned.
fn sanitized(lanes: u32) -> Context {
    common::isolate();
    let ctx = Context::new().expect("GPU tests need an adapter");
    ctx.with_sanitizer(Sanitize::Lanes(lanes))
        .with_tuning(false)
}

/// Asserts that the sanitizer found nothing on `ctx` and ran each of `kernels` (files).
fn clean(ctx: &Context, kernels: &[&str]) {
    let summary = ctx.sanitizer_summary();
    assert_eq!(summary.total_errors(), 0, "{summary}");
    assert_eq!(summary.failed, 0, "{summary}");
    for k in kernels {
        assert!(
            summary.dispatches.contains_key(k),
            "{k} did not run: {summary}"
        );
    }
    eprintln!("{summary}");
}

/// The options of a call on `kernels` with outputs pre-filled with NaN (an element no
/// kernel writes shows).
fn nan_filled(kernels: Kernels) -> Options {
    Options::default().kernels(kernels).nan_fill(true)
}

/// `‖got − want‖ / ‖want‖`.
fn rel(got: &ArrayD<f32>, want: &ArrayD<f64>) -> f64 {
    assert_eq!(got.shape(), want.shape());
    reference::compare(got, want).0
}

/// Q `(1, 4, 13, 8)`, K and V `(1, 2, 19, 8)` (grouped-query heads), dO of Q's shape.
fn problem(amp: f32) -> [Array4<f32>; 4] {
    let (l, s, e) = (13, 19, 8);
    [
        common::smooth((1, 4, l, e), 1, amp),
        common::smooth((1, 2, s, e), 2, amp),
        common::smooth((1, 2, s, e), 3, amp),
        common::smooth((1, 4, l, e), 4, amp),
    ]
}

/// The output and every gradient of `op` (saving for the backward) on `data` with `mask`,
/// the largest relative error against the reference (the bias table's gradient included).
fn backward_error(ctx: &Context, op: Attention, data: &[Array4<f32>; 4], mask: &Mask<'_>) -> f64 {
    let [q, k, v, d_o] = data;
    let inputs = Inputs::qkv(q, k, v).mask(mask);
    let want = reference::backward(&op, &inputs, d_o.view().into_dyn()).unwrap();
    let want_out = reference::run(&op.return_weights(true), &inputs).unwrap();
    let out = op.run(ctx, inputs).unwrap();
    let g = out.saved.unwrap().backward(ctx, d_o.view()).unwrap();
    let mut worst = rel(&out.context, &want_out.context);
    for (got, want) in [
        (&g.q, &want.q),
        (&g.k, &want.k),
        (&g.v, &want.v),
        (&g.relative_bias, &want.relative_bias),
    ] {
        assert_eq!(got.is_some(), want.is_some());
        if let (Some(got), Some(want)) = (got, want) {
            worst = worst.max(rel(got, want));
        }
    }
    worst
}

#[test]
fn gradients_of_both_families_under_the_sanitizer() {
    let presets = common::every_preset(1, 4, 19);
    let mods = Modifiers::new()
        .preset(presets[5].clone())
        .preset(Preset::Softcap(2.0))
        .preset(Preset::Window { left: 6, right: 2 });
    let with_mods = Mask::none().with_modifiers(&mods);
    let data = problem(2.0);
    // f16 operands: the reference sees the values the device holds.
    let rounded = data.clone().map(|a| a.mapv(|x| f16::from_f32(x).to_f32()));
    for lanes in LANES {
        let ctx = sanitized(lanes);
        for kernels in [Kernels::Storage, Kernels::Subgroup] {
            let op = Attention::new().options(nan_filled(kernels));
            let op = op.return_weights(false).save_for_backward(true);
            for (what, op, data, mask, tol) in [
                ("causal", op.causal(true), &data, &Mask::none(), TOL32),
                ("T5 bias, soft-cap, window", op, &data, &with_mods, TOL32),
                ("f16", op.dtype(Dtype::F16), &rounded, &Mask::none(), TOL16),
            ] {
                let err = backward_error(&ctx, op, data, mask);
                assert!(err < tol, "{lanes} lanes, {kernels:?} {what}: {err:.2e}");
            }
        }
        clean(
            &ctx,
            &[
                "flash_backward_dot.wgsl",
                "flash_backward_kv.wgsl",
                "flash_backward_q.wgsl",
                "flash_backward_kv_subgroup.wgsl",
                "flash_backward_q_subgroup.wgsl",
                "bias_grad.wgsl",
            ],
        );
    }
}

/// Prefill of 9 tokens, then steps of 1, 1 and 4, through a cache of `dtype` (K and V as
/// the f16 values themselves for an f16 one), decoded by `dec`; every row's output.
fn decode(ctx: &Context, dec: &Decoder, [q, k, v]: &[Array4<f32>; 3], dtype: Dtype) -> ArrayD<f32> {
    let (b, kv_heads, n, d_k) = k.dim();
    let spec = KvCacheSpec::new(n, b, kv_heads, d_k, v.dim().3).dtype(dtype);
    let mut cache = KvCache::new(ctx, spec).unwrap();
    let mut outs = Vec::new();
    for (from, to) in [(0, 9), (9, 10), (10, 11), (11, n)] {
        let r = s![.., .., from..to, ..];
        match dtype {
            Dtype::F16 => cache.append(
                ctx,
                k.slice(r).mapv(f16::from_f32).view(),
                v.slice(r).mapv(f16::from_f32).view(),
            ),
            _ => cache.append(ctx, k.slice(r), v.slice(r)),
        }
        .unwrap();
        outs.push(dec.step(ctx, &cache, q.slice(r)).unwrap());
    }
    let views: Vec<_> = outs.iter().map(|o| o.view()).collect();
    ndarray::concatenate(Axis(2), &views).unwrap().into_dyn()
}

#[test]
fn decode_through_the_kv_cache_under_the_sanitizer() {
    // 2 sequences, 4 query heads on 2 K/V heads, 15 tokens, d_k 12, d_v 8.
    let arrays = [
        common::smooth((2, 4, 15, 12), 1, 1.5),
        common::smooth((2, 2, 15, 12), 2, 1.5),
        common::smooth((2, 2, 15, 8), 3, 1.5),
    ];
    let rounded = {
        let [q, k, v] = &arrays;
        let round = |a: &Array4<f32>| a.mapv(|x| f16::from_f32(x).to_f32());
        [q.clone(), round(k), round(v)]
    };
    let mods = Modifiers::new()
        .preset(Preset::Alibi(Preset::alibi_slopes(4)))
        .preset(Preset::Window { left: 5, right: 0 });
    let causal = Attention::new().causal(true);
    let want = |[q, k, v]: &[Array4<f32>; 3], mask: &Mask<'_>| {
        reference::run(&causal, &Inputs::qkv(q, k, v).mask(mask))
            .unwrap()
            .context
    };
    let plain = Decoder::new().nan_fill(true);
    let modified = Decoder::new().nan_fill(true).modifiers(&mods);
    // Blocks of 4 keys: several partials per row, combined.
    let blocked = Decoder::new().nan_fill(true).block(4);
    let with_mods = Mask::none().with_modifiers(&mods);
    for lanes in LANES {
        let ctx = sanitized(lanes);
        for (what, dec, dtype, data, mask) in [
            ("f32", &plain, Dtype::F32, &arrays, &Mask::none()),
            (
                "f32, blocks of 4",
                &blocked,
                Dtype::F32,
                &arrays,
                &Mask::none(),
            ),
            ("f16 cache", &plain, Dtype::F16, &rounded, &Mask::none()),
            (
                "ALiBi and a window",
                &modified,
                Dtype::F32,
                &arrays,
                &with_mods,
            ),
        ] {
            let err = rel(&decode(&ctx, dec, data, dtype), &want(data, mask));
            assert!(err < TOL32, "{lanes} lanes, {what}: {err:.2e}");
        }
        let summary = ctx.sanitizer_summary();
        assert!(
            summary
                .dispatches
                .keys()
                .any(|k| k.starts_with("decode_partial")),
            "{summary}"
        );
        clean(&ctx, &["decode_combine.wgsl"]);
    }
}

/// Adam in f64 from `w` with gradients `gs`, one per step (no decay of the weights).
fn adam_f64(w: &[f32], gs: &[Vec<f32>], (lr, b1, b2, eps): (f64, f64, f64, f64)) -> Vec<f64> {
    let mut w: Vec<f64> = w.iter().map(|&x| f64::from(x)).collect();
    let (mut m, mut v) = (vec![0.0; w.len()], vec![0.0; w.len()]);
    for (t, g) in gs.iter().enumerate() {
        let t = t as i32 + 1;
        for i in 0..w.len() {
            let g = f64::from(g[i]);
            m[i] = b1 * m[i] + (1.0 - b1) * g;
            v[i] = b2 * v[i] + (1.0 - b2) * g * g;
            let (mh, vh) = (m[i] / (1.0 - b1.powi(t)), v[i] / (1.0 - b2.powi(t)));
            w[i] -= lr * mh / (vh.sqrt() + eps);
        }
    }
    w
}

#[test]
fn a_training_step_under_the_sanitizer() {
    // d = 12 in; W_Q 8 wide on 4 heads, W_K 4 and W_V 8 on 2 K/V heads (the output 4 heads
    // of 4); 2 sequences of 7.
    let w = |c: usize, salt: usize| {
        Array2::from_shape_fn((12, c), |(i, j)| {
            (((i * 7 + j * 3) * (salt + 1)) as f32 * 0.13).sin() * 0.5
        })
    };
    let (wq, wk, wv) = (w(8, 1), w(4, 2), w(8, 3));
    let x = Array3::from_shape_fn((2, 7, 12), |(b, i, j)| {
        ((b * 3 + i * 5 + j) as f32 * 0.07).cos()
    });
    let target =
        Array3::from_shape_fn((2, 7, 16), |(b, i, j)| ((b + i + 2 * j) as f32 * 0.2).sin());
    let op = Attention::new()
        .heads(4)
        .causal(true)
        .save_for_backward(true);
    let hyper = (3e-2, 0.9, 0.99, 1e-3);
    for lanes in LANES {
        let ctx = sanitized(lanes);
        let p = Projections::new(wq.view(), wk.view(), wv.view());
        let mut layer = Layer::new(&ctx, op, &p).unwrap();
        let mut adam = Adam::new(hyper.0 as f32)
            .betas(hyper.1 as f32, hyper.2 as f32)
            .eps(hyper.3 as f32);
        let tensor = |a: &Array3<f32>| Tensor::from_array(&ctx, a.view().into_dyn(), Dtype::F32);
        let (x_t, target_t) = (tensor(&x).unwrap(), tensor(&target).unwrap());
        let mut grads_w_q = Vec::new();
        for step in 0..2 {
            let out = layer.run(&ctx, Inputs::x(&x_t)).unwrap();
            let mut rec = Recorder::new(&ctx);
            let loss = MseLoss::record(&mut rec, &out.context, &target_t).unwrap();
            rec.submit().unwrap();
            let d_o = loss.grad.to_array(&ctx).unwrap();
            let grads = out.saved.unwrap().backward(&ctx, &loss.grad).unwrap();
            let g = grads.to_arrays(&ctx).unwrap();
            if step == 0 {
                // The MSE gradient, and the layer's gradients through its projections.
                let o = out.context.to_array(&ctx).unwrap();
                let want = (&o - &target.view().into_dyn()).mapv(|v| 2.0 * v / o.len() as f32);
                assert!(d_o.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-7));
                let inputs = Inputs::x(&x).projections(&p);
                let want = reference::backward(&op, &inputs, d_o.view()).unwrap();
                for (name, got, want) in [
                    ("x", &g.x, &want.x),
                    ("W_Q", &g.w_q, &want.w_q),
                    ("W_K", &g.w_k, &want.w_k),
                    ("W_V", &g.w_v, &want.w_v),
                ] {
                    let err = rel(got.as_ref().unwrap(), want.as_ref().unwrap());
                    assert!(err < TOL32, "{lanes} lanes, d{name}: {err:.2e}");
                }
            }
            grads_w_q.push(g.w_q.unwrap().iter().copied().collect::<Vec<_>>());
            layer.update(&ctx, &mut adam, &grads).unwrap();
        }
        layer.sync_host(&ctx).unwrap();
        let want = adam_f64(wq.as_slice().unwrap(), &grads_w_q, hyper);
        let got = layer.projections().w_q.to_owned();
        for (a, b) in got.iter().zip(&want) {
            assert!(
                (f64::from(*a) - b).abs() <= 1e-6,
                "{lanes} lanes: {a} vs {b}"
            );
        }
        clean(&ctx, &["mse.wgsl", "adam.wgsl", "flash_backward_kv.wgsl"]);
    }
}

/// A caller's ALiBi-like score modifier and a window mask modifier, with their CPU forms.
fn callers_wgsl() -> Modifiers {
    Modifiers::new()
        .score_mod(
            "tilt.wgsl",
            "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    \
             return score + 0.25 * f32(h + 1u) * (f32(kv) - f32(q)) / 8.0;\n}\n",
        )
        .score_mod_cpu(|s, _b, h, q, kv| s + 0.25 * (h + 1) as f64 * (kv as f64 - q as f64) / 8.0)
        .mask_mod(
            "window.wgsl",
            "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {\n    \
             return kv + 6u >= q && kv <= q + 2u;\n}\n",
        )
        .mask_mod_cpu(|_b, _h, q, kv| kv + 6 >= q && kv <= q + 2)
}

#[test]
fn modifiers_and_block_maps_under_the_sanitizer() {
    // 2 sequences, 4 query heads on 2 K/V heads, 21 queries against 27 keys, d 12.
    let (q, k, v) = (
        common::smooth((2, 4, 21, 12), 1, 2.0),
        common::smooth((2, 2, 27, 12), 2, 2.0),
        common::smooth((2, 2, 27, 12), 3, 2.0),
    );
    let mut all = vec![callers_wgsl()];
    all.extend(
        common::every_preset(2, 4, 27)
            .into_iter()
            .map(|p| Modifiers::new().preset(p)),
    );
    for lanes in LANES {
        let ctx = sanitized(lanes);
        for (i, mods) in all.iter().enumerate() {
            let mask = Mask::none().with_modifiers(mods);
            for (kernels, fused) in [
                (Kernels::Storage, true),
                (Kernels::Subgroup, true),
                (Kernels::Storage, false),
            ] {
                let op = Attention::new().options(nan_filled(kernels));
                let op = op.causal(i % 2 == 0).return_weights(!fused);
                let inputs = Inputs::qkv(&q, &k, &v).mask(&mask);
                let want = reference::run(&op.return_weights(true), &inputs).unwrap();
                let got = op.run(&ctx, inputs).unwrap();
                let mut err = rel(&got.context, &want.context);
                if let Some(w) = &got.weights {
                    err = err.max(rel(w, want.weights.as_ref().unwrap()));
                }
                let what = if i == 0 {
                    "a caller's WGSL"
                } else {
                    "a preset"
                };
                assert!(
                    err < TOL32,
                    "{lanes} lanes, {what} {i}, {kernels:?} fused={fused}: {err:.2e}"
                );
            }
        }
        clean(
            &ctx,
            &[
                "block_map.wgsl",
                "flash_blocked.wgsl",
                "flash_subgroup.wgsl",
                "softmax.wgsl",
            ],
        );
    }
}
