//! Decoding on the device without the host in between: a KV-cache append and a decode step
//! from tensors (`KvCache::append_record`, `Decoder::step_record`) equal the array ones bit for
//! bit; two layers' decode steps recorded into one submit (`Layer::decode_record`) equal the
//! step-by-step array calls bit for bit, and an f16 layer's steps its causal forward; a cache
//! whose append sits in an unsubmitted recorder refuses other use.

mod common;

use ndarray::{s, Array2, Array3, Array4, Axis};
use wgpu_attention::half::f16;
use wgpu_attention::{
    reference, Attention, Context, Decoder, Dtype, Error, Inputs, KvCache, KvCacheSpec, Layer,
    Projections, Recorder, Tensor,
};

fn wave(shape: (usize, usize, usize, usize), salt: usize, amp: f32) -> Array4<f32> {
    Array4::from_shape_fn(shape, |(i, j, k, m)| {
        (((i * 31 + j * 17 + k * 7 + m * 3) * (salt + 2) + salt) as f32 * 0.0137).sin() * amp
    })
}

/// `(b, heads, m, d)` → a tensor in the rows layout `(b, m, heads, d)`.
fn rows_tensor(ctx: &Context, a: &Array4<f32>, dtype: Dtype) -> Tensor {
    let rows = a.view().permuted_axes([0, 2, 1, 3]);
    Tensor::from_array(ctx, rows.into_dyn(), dtype).unwrap()
}

#[test]
fn tensor_appends_and_steps_equal_the_array_ones() {
    let ctx = common::ctx();
    for dtype in [Dtype::F32, Dtype::F16] {
        if dtype == Dtype::F16 && ctx.require_f16().is_err() {
            eprintln!("skipped f16: the adapter has no SHADER_F16");
            continue;
        }
        // Four query heads on two K/V heads, widths 6 and 5 (rows padded to vec4s).
        let (b, h, kvh, n, dk, dv) = (2, 4, 2, 41, 6, 5);
        let spec = KvCacheSpec::new(n, b, kvh, dk, dv).dtype(dtype);
        let (q, k, v) = (
            wave((b, h, n, dk), 1, 1.5),
            wave((b, kvh, n, dk), 2, 1.5),
            wave((b, kvh, n, dv), 3, 1.0),
        );
        let mut by_array = KvCache::new(ctx, spec).unwrap();
        let mut by_tensor = KvCache::new(ctx, spec).unwrap();
        let dec = Decoder::new().nan_fill(true);
        let mut at = 0;
        for m in [37, 1, 3] {
            let r = s![.., .., at..at + m, ..];
            let (ks, vs) = (k.slice(r).to_owned(), v.slice(r).to_owned());
            match dtype {
                Dtype::F32 => by_array.append(ctx, ks.view(), vs.view()),
                Dtype::F16 => by_array.append(
                    ctx,
                    ks.mapv(f16::from_f32).view(),
                    vs.mapv(f16::from_f32).view(),
                ),
            }
            .unwrap();
            let want = dec.step(ctx, &by_array, q.slice(r)).unwrap();

            let mut rec = Recorder::new(ctx);
            let (kt, vt) = (rows_tensor(ctx, &ks, dtype), rows_tensor(ctx, &vs, dtype));
            by_tensor.append_record(&mut rec, &kt, &vt).unwrap();
            let qt = rows_tensor(ctx, &q.slice(r).to_owned(), Dtype::F32);
            let got = dec.step_record(&mut rec, &by_tensor, &qt).unwrap();
            rec.submit().unwrap();
            assert_eq!(got.shape(), [b, m, h, dv]);
            let got = got.to_array(ctx).unwrap().into_dimensionality().unwrap();
            let got = got.permuted_axes([0, 2, 1, 3]);
            assert_eq!(got, want, "{dtype}, {m} more tokens after {at}");
            at += m;
        }
        assert_eq!(by_tensor.len(), n);
    }
}

fn matrix(r: usize, c: usize, salt: usize) -> Array2<f32> {
    Array2::from_shape_fn((r, c), |(i, j)| {
        (((i * 7 + j * 3) * (salt + 1)) as f32 * 0.13).sin() * 0.5
    })
}

fn cache_for(ctx: &Context, n: usize, dtype: Dtype) -> KvCache {
    let spec = KvCacheSpec::new(n, 2, 2, 3, 3).dtype(dtype);
    KvCache::new(ctx, spec).unwrap()
}

#[test]
fn two_layers_decoded_in_one_submit_equal_step_by_step_calls() {
    let ctx = common::ctx();
    let (d, n, prompt) = (12, 23, 17);
    // Four query heads of width 3 on two K/V heads; W_O back to d, with a bias.
    let bo = ndarray::Array1::from_elem(d, 0.1f32);
    let layers: Vec<Layer> = (0..2)
        .map(|l| {
            let (wq, wk, wv, wo) = (
                matrix(d, 12, l * 4 + 1),
                matrix(d, 6, l * 4 + 2),
                matrix(d, 6, l * 4 + 3),
                matrix(12, d, l * 4 + 4),
            );
            let p = Projections::new(wq.view(), wk.view(), wv.view())
                .with_output(wo.view(), Some(bo.view()));
            let op = Attention::new().heads(4).causal(true).return_weights(false);
            Layer::new(ctx, op, &p).unwrap()
        })
        .collect();
    let x = Array3::from_shape_fn((2, n, d), |(b, i, j)| {
        ((b * 3 + i * 5 + j) as f32 * 0.07).cos()
    });
    let (mut a1, mut a2) = (cache_for(ctx, n, Dtype::F32), cache_for(ctx, n, Dtype::F32));
    let (mut t1, mut t2) = (cache_for(ctx, n, Dtype::F32), cache_for(ctx, n, Dtype::F32));
    let mut at = 0;
    for m in [prompt, 1, 1, 4] {
        let xs = x.slice(s![.., at..at + m, ..]);
        let h = layers[0].decode(ctx, &mut a1, xs).unwrap();
        let want = layers[1].decode(ctx, &mut a2, h.view()).unwrap();

        let xt = Tensor::from_array(ctx, xs.into_dyn(), Dtype::F32).unwrap();
        let mut rec = Recorder::new(ctx);
        let h = layers[0].decode_record(&mut rec, &mut t1, &xt).unwrap();
        let y = layers[1].decode_record(&mut rec, &mut t2, &h).unwrap();
        rec.submit().unwrap();
        let got: Array3<f32> = y.to_array(ctx).unwrap().into_dimensionality().unwrap();
        assert_eq!(got, want, "{m} tokens after {at}");
        at += m;
    }
    // The whole sequence through the caches is the causal forward of the two layers.
    let h = layers[0].run(ctx, Inputs::x(&x)).unwrap().context;
    let full = layers[1].run(ctx, Inputs::x(&h)).unwrap().context;
    let mut t3 = cache_for(ctx, n, Dtype::F32);
    let mut t4 = cache_for(ctx, n, Dtype::F32);
    let h = layers[0].decode(ctx, &mut t3, x.view()).unwrap();
    let y = layers[1].decode(ctx, &mut t4, h.view()).unwrap();
    let (rel, _) = reference::compare(&y.into_dyn(), &full.mapv(f64::from).into_dyn());
    assert!(rel < 1e-5, "prefill through the caches vs forward: {rel:e}");
    // X without its batch axis is refused, the cache unchanged.
    let flat = Tensor::from_array(ctx, x.slice(s![0, ..1, ..]).into_dyn(), Dtype::F32).unwrap();
    let mut rec = Recorder::new(ctx);
    let e = layers[0]
        .decode_record(&mut rec, &mut t1, &flat)
        .unwrap_err();
    assert!(e.to_string().contains("(batch, m, d)"), "{e}");
    assert_eq!(t1.len(), n);
}

#[test]
fn an_f16_layer_decodes_as_its_causal_forward() {
    let ctx = common::ctx();
    if ctx.require_f16().is_err() {
        eprintln!("skipped: the adapter has no SHADER_F16");
        return;
    }
    let (d, n, prompt) = (12, 19, 11);
    let (wq, wk, wv) = (matrix(d, 12, 1), matrix(d, 6, 2), matrix(d, 6, 3));
    let p = Projections::new(wq.view(), wk.view(), wv.view());
    let op = Attention::new()
        .heads(4)
        .causal(true)
        .return_weights(false)
        .dtype(Dtype::F16);
    let layer = Layer::new(ctx, op, &p).unwrap();
    let x = Array3::from_shape_fn((2, n, d), |(b, i, j)| {
        ((b * 3 + i * 5 + j) as f32 * 0.07).cos()
    });
    let want = layer.run(ctx, Inputs::x(&x)).unwrap().context;
    let mut cache = cache_for(ctx, n, Dtype::F16);
    let mut parts = vec![layer
        .decode(ctx, &mut cache, x.slice(s![.., ..prompt, ..]))
        .unwrap()];
    for t in prompt..n {
        let step = layer.decode(ctx, &mut cache, x.slice(s![.., t..t + 1, ..]));
        parts.push(step.unwrap());
    }
    let views: Vec<_> = parts.iter().map(|a| a.view()).collect();
    let got = ndarray::concatenate(Axis(1), &views).unwrap();
    let (rel, _) = reference::compare(&got.into_dyn(), &want.mapv(f64::from).into_dyn());
    assert!(rel < 2e-3, "f16 decode vs f16 forward: {rel:e}");
    // X past f16's range is refused before anything is appended.
    let big = Array3::from_elem((2, 1, d), 1e6f32);
    let e = layer.decode(ctx, &mut cache, big.view()).unwrap_err();
    assert!(e.to_string().contains("f16"), "{e}");
    assert_eq!(cache.len(), n);
}

#[test]
fn a_cache_with_an_unsubmitted_append_refuses_other_use() {
    let ctx = common::ctx();
    let mut cache = cache_for(ctx, 8, Dtype::F32);
    let tensor = |a: Array4<f32>| Tensor::from_array(ctx, a.view().into_dyn(), Dtype::F32);
    let k = tensor(wave((2, 2, 2, 3), 1, 1.0)).unwrap();
    let q = tensor(wave((2, 2, 4, 3), 2, 1.0)).unwrap();
    // A wrong shape is refused and changes nothing.
    let mut rec = Recorder::new(ctx);
    let e = cache.append_record(&mut rec, &q, &k).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    assert_eq!(cache.len(), 0);
    cache.append_record(&mut rec, &k, &k).unwrap();
    assert_eq!(cache.len(), 2);
    // The same recorder may step on it; anything else must wait for the submit.
    Decoder::new().step_record(&mut rec, &cache, &q).unwrap();
    let q4 = wave((2, 4, 1, 3), 3, 1.0);
    let e = Decoder::new().step(ctx, &cache, q4.view()).unwrap_err();
    assert!(e.to_string().contains("not submitted"), "{e}");
    let kv = wave((2, 2, 1, 3), 4, 1.0);
    let e = cache.append(ctx, kv.view(), kv.view()).unwrap_err();
    assert!(e.to_string().contains("not submitted"), "{e}");
    rec.submit().unwrap();
    Decoder::new().step(ctx, &cache, q4.view()).unwrap();
    // A recorder dropped unsubmitted leaves the cache refusing until it is cleared.
    let mut rec = Recorder::new(ctx);
    cache.append_record(&mut rec, &k, &k).unwrap();
    drop(rec);
    assert!(cache.append(ctx, kv.view(), kv.view()).is_err());
    cache.clear();
    cache.append(ctx, kv.view(), kv.view()).unwrap();
    assert_eq!(cache.len(), 1);
}
