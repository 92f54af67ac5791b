//! `sdpa`'s saved forward and backward on tensors (`Attention::sdpa_record_saved`,
//! `Saved::backward_tensor`): bit for bit the array forms on every kernel family and f16,
//! grouped-query heads, L ≠ S, causal, a mask and key lengths; one recorder for both; errors.

mod common;

use ndarray::{Array2, Array4, ArrayD};
use wgpu_attention::{Attention, Dtype, FlashVariant, Kernels, Mask, Recorder, Tensor};

fn arr(shape: (usize, usize, usize, usize), salt: f32) -> Array4<f32> {
    Array4::from_shape_fn(shape, |(a, b, c, d)| {
        ((a * 31 + b * 17 + c * 7 + d) as f32 * salt).sin()
    })
}

/// `(batch, heads, rows, width)` into the rows layout `(batch, rows, heads, width)`.
fn rows(a: &Array4<f32>) -> ArrayD<f32> {
    a.view()
        .permuted_axes([0, 2, 1, 3])
        .as_standard_layout()
        .into_owned()
        .into_dyn()
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
    let mask = Mask::boolean(keep.view().into_dyn()).with_kv_lengths(&[45, 30]);
    let base = Attention::new().causal(true).nan_fill(true);
    let mut ops: Vec<(String, Attention, Dtype)> = Kernels::available(ctx)
        .into_iter()
        .map(|k| (k.to_string(), base.kernels(k), Dtype::F32))
        .collect();
    let blocked = FlashVariant::Blocked { rows: 32, keys: 32 };
    ops.push((blocked.to_string(), base.flash_variant(blocked), Dtype::F32));
    if ctx
        .device()
        .features()
        .contains(wgpu_attention::wgpu::Features::SHADER_F16)
    {
        ops.push(("f16".into(), base.dtype(Dtype::F16), Dtype::F16));
    }
    for (name, op, dtype) in ops {
        let (out, saved) = op
            .sdpa_saved(ctx, q.view(), k.view(), v.view(), &mask)
            .unwrap();
        let want = saved.backward(ctx, d_o.view()).unwrap();
        let t = |a: &Array4<f32>, dt| Tensor::from_array(ctx, rows(a).view(), dt).unwrap();
        let (q_t, k_t, v_t) = (t(&q, dtype), t(&k, dtype), t(&v, dtype));
        let d_t = t(&d_o, Dtype::F32);
        // Forward and backward in one recorder, one submit.
        let mut rec = Recorder::new(ctx);
        let (out_t, saved_t) = op
            .sdpa_record_saved(&mut rec, &q_t, &k_t, &v_t, &mask)
            .unwrap();
        let g = saved_t.record_backward(&mut rec, &d_t).unwrap();
        rec.submit().unwrap();
        let out4 = out.context.into_dimensionality::<ndarray::Ix4>().unwrap();
        assert_eq!(
            bits(&out_t.context.to_array(ctx).unwrap()),
            bits(&rows(&out4)),
            "{name}: output"
        );
        for (got, want, what) in [
            (&g.q, &want.q, "dQ"),
            (&g.k, &want.k, "dK"),
            (&g.v, &want.v, "dV"),
        ] {
            assert_eq!(
                bits(&got.to_array(ctx).unwrap()),
                bits(&rows(want)),
                "{name}: {what}"
            );
        }
        // The separate-submit forms give the same.
        let (_, s2) = op.sdpa_saved_tensor(ctx, &q_t, &k_t, &v_t, &mask).unwrap();
        let g2 = s2.backward_tensor(ctx, &d_t).unwrap();
        assert_eq!(
            bits(&g2.k.to_array(ctx).unwrap()),
            bits(&rows(&want.k)),
            "{name}: dK, two submits"
        );
    }
}

#[test]
fn tensor_sdpa_backward_errors_name_what_was_wrong() {
    let ctx = common::ctx();
    let t = |shape, dt| Tensor::from_array(ctx, arr(shape, 0.3).into_dyn().view(), dt).unwrap();
    let q = t((1, 5, 2, 8), Dtype::F32);
    let op = Attention::new();
    let (_, saved) = op
        .sdpa_saved_tensor(ctx, &q, &q, &q, &Mask::none())
        .unwrap();
    let says = |e: wgpu_attention::Error, what: &str| {
        let e = e.to_string();
        assert!(e.contains(what), "{e:?} should say {what:?}");
    };
    // dO in the heads-first layout, not the rows layout.
    let wrong = t((1, 2, 5, 8), Dtype::F32);
    says(
        saved.backward_tensor(ctx, &wrong).unwrap_err(),
        "without a matching forward",
    );
    let other = wgpu_attention::Context::new().unwrap().with_tuning(false);
    says(
        saved.backward_tensor(&other, &q).unwrap_err(),
        "another Context",
    );
    // A K of 3 dimensions; a K of another dtype than the op's.
    let flat = Tensor::from_array(
        ctx,
        ndarray::Array3::<f32>::zeros((1, 5, 8)).view().into_dyn(),
        Dtype::F32,
    )
    .unwrap();
    assert!(op
        .sdpa_saved_tensor(ctx, &q, &flat, &q, &Mask::none())
        .is_err());
    if ctx
        .device()
        .features()
        .contains(wgpu_attention::wgpu::Features::SHADER_F16)
    {
        let half = t((1, 5, 2, 8), Dtype::F16);
        says(
            op.sdpa_saved_tensor(ctx, &q, &half, &q, &Mask::none())
                .unwrap_err(),
            "dtype",
        );
        says(saved.backward_tensor(ctx, &half).unwrap_err(), "f32");
    }
}
