//! The saved forward on Q, K, V and its backward on tensors (`Attention::record` with
//! `save_for_backward`, `Saved::backward` and `Saved::record_backward` on a tensor dO): bit for
//! bit the array forms on every kernel family and f16, grouped-query heads, L ≠ S, causal, a
//! mask and key lengths; one recorder for both; errors.

mod common;

use ndarray::{Array, Array2, Array4, ArrayD, Dimension, Ix4};
use wgpu_attention::internals::FlashVariant;
use wgpu_attention::{Attention, Dtype, Inputs, Kernels, Mask, Options, Recorder, Saved, Tensor};

fn arr(shape: (usize, usize, usize, usize), salt: f32) -> Array4<f32> {
    Array4::from_shape_fn(shape, |(a, b, c, d)| {
        ((a * 31 + b * 17 + c * 7 + d) as f32 * salt).sin()
    })
}

/// `(batch, heads, rows, width)` into the rows layout `(batch, rows, heads, width)`.
fn rows<D: Dimension>(a: &Array<f32, D>) -> ArrayD<f32> {
    a.view()
        .into_dimensionality::<Ix4>()
        .unwrap()
        .permuted_axes([0, 2, 1, 3])
        .as_standard_layout()
        .into_owned()
        .into_dyn()
}

/// The saved state of a saved forward that must have succeeded.
fn saved_of<T>(out: wgpu_attention::Result<wgpu_attention::Output<T>>) -> Saved {
    out.unwrap()
        .saved
        .expect("a saved forward carries its Saved")
}

fn bits<'a>(a: impl IntoIterator<Item = &'a f32>) -> Vec<u32> {
    a.into_iter().map(|v| v.to_bits()).collect()
}

#[test]
fn the_tensor_sdpa_backward_is_the_array_backward_bit_for_bit() {
    let ctx = common::ctx();
    // 4 query heads on 2 K/V heads, L = 37 queries, S = 45 keys, E = 20, E_v = 12.
    let (q, k, v) = (
        arr((2, 4, 37, 20), 0.13),
        arr((2, 2, 45, 20), 0.29),
        arr((2, 2, 45, 12), 0.41),
    );
    let d_o = arr((2, 4, 37, 12), 0.07);
    let keep = Array2::from_shape_fn((37, 45), |(i, j)| (i + 2 * j) % 7 != 0);
    let nan_fill = Options::default().nan_fill(true);
    let base = Attention::new()
        .causal(true)
        .options(nan_fill)
        .save_for_backward(true);
    let mut ops: Vec<(String, Attention, Dtype)> = Kernels::available(ctx)
        .into_iter()
        .map(|kernels| {
            let op = base.options(nan_fill.kernels(kernels));
            (kernels.to_string(), op, Dtype::F32)
        })
        .collect();
    let blocked = FlashVariant::Blocked { rows: 32, keys: 32 };
    let options = nan_fill.flash_variant(blocked);
    ops.push((blocked.to_string(), base.options(options), Dtype::F32));
    if ctx
        .device()
        .features()
        .contains(wgpu_attention::wgpu::Features::SHADER_F16)
    {
        ops.push(("f16".into(), base.dtype(Dtype::F16), Dtype::F16));
    }
    for (name, op, dtype) in ops {
        // Made here, not before the loop: `Inputs::mask` takes `&'a Mask<'a>`, which ties the
        // mask's lifetime to the borrow of this iteration's tensors.
        let mask = Mask::boolean(keep.view().into_dyn()).with_kv_lengths(&[45, 30]);
        let out = op.run(ctx, Inputs::qkv(&q, &k, &v).mask(&mask)).unwrap();
        let saved = out.saved.clone().unwrap();
        let want = saved.backward(ctx, d_o.view()).unwrap();
        let t = |a: &Array4<f32>, dt| Tensor::from_array(ctx, rows(a).view(), dt).unwrap();
        let (q_t, k_t, v_t) = (t(&q, dtype), t(&k, dtype), t(&v, dtype));
        let d_t = t(&d_o, Dtype::F32);
        // Forward and backward in one recorder, one submit.
        let mut rec = Recorder::new(ctx);
        let out_t = op
            .record(&mut rec, Inputs::qkv(&q_t, &k_t, &v_t).mask(&mask))
            .unwrap();
        let saved_t = out_t.saved.clone().unwrap();
        let g = saved_t.record_backward(&mut rec, &d_t).unwrap();
        rec.submit().unwrap();
        assert_eq!(
            bits(&out_t.context.to_array(ctx).unwrap()),
            bits(&rows(&out.context)),
            "{name}: output"
        );
        for (got, want, what) in [
            (&g.q, &want.q, "dQ"),
            (&g.k, &want.k, "dK"),
            (&g.v, &want.v, "dV"),
        ] {
            assert_eq!(
                bits(&got.as_ref().unwrap().to_array(ctx).unwrap()),
                bits(&rows(want.as_ref().unwrap())),
                "{name}: {what}"
            );
        }
        // The separate-submit forms give the same.
        let s2 = saved_of(op.run(ctx, Inputs::qkv(&q_t, &k_t, &v_t).mask(&mask)));
        let g2 = s2.backward(ctx, &d_t).unwrap();
        assert_eq!(
            bits(&g2.k.as_ref().unwrap().to_array(ctx).unwrap()),
            bits(&rows(want.k.as_ref().unwrap())),
            "{name}: dK, two submits"
        );
    }
}

#[test]
fn tensor_sdpa_backward_errors_name_what_was_wrong() {
    let ctx = common::ctx();
    let t = |shape, dt| Tensor::from_array(ctx, arr(shape, 0.3).into_dyn().view(), dt).unwrap();
    let q = t((1, 5, 2, 8), Dtype::F32);
    let op = Attention::new().save_for_backward(true);
    let saved = saved_of(op.run(ctx, Inputs::qkv(&q, &q, &q)));
    let says = |e: wgpu_attention::Error, what: &str| {
        let e = e.to_string();
        assert!(e.contains(what), "{e:?} should say {what:?}");
    };
    // dO in the heads-first layout, not the rows layout.
    let wrong = t((1, 2, 5, 8), Dtype::F32);
    says(
        saved.backward(ctx, &wrong).unwrap_err(),
        "without a matching forward",
    );
    let other = wgpu_attention::Context::new().unwrap().with_tuning(false);
    says(saved.backward(&other, &q).unwrap_err(), "another Context");
    // A K of 3 dimensions; a K of another dtype than the op's.
    let flat = Tensor::from_array(
        ctx,
        ndarray::Array3::<f32>::zeros((1, 5, 8)).view().into_dyn(),
        Dtype::F32,
    )
    .unwrap();
    assert!(op.run(ctx, Inputs::qkv(&q, &flat, &q)).is_err());
    if ctx
        .device()
        .features()
        .contains(wgpu_attention::wgpu::Features::SHADER_F16)
    {
        let half = t((1, 5, 2, 8), Dtype::F16);
        says(
            op.run(ctx, Inputs::qkv(&q, &half, &q)).unwrap_err(),
            "dtype",
        );
        says(saved.backward(ctx, &half).unwrap_err(), "f32");
    }
}
