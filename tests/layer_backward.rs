//! The projected layer's gradients on the device (a saved `run` + `Saved::backward`)
//! against the f64 reference backward: every weight and bias, `W_O` and `b_O`, grouped-query
//! K/V, causal with key lengths, on every kernel family and the GPU family's blocked kernel,
//! the parameter-free layer (Q = K = V = X), f16, a `Layer`'s saved forward, and the errors.

mod common;

use ndarray::{Array1, Array2, Array3, ArrayD};
use wgpu_attention::internals::FlashVariant;
use wgpu_attention::{
    reference, Attention, Context, Dtype, Gradients, Inputs, Kernels, Layer, Mask, Options,
    Projections, Saved,
};

fn w(r: usize, c: usize, salt: usize) -> Array2<f32> {
    Array2::from_shape_fn((r, c), |(i, j)| {
        (((i * 7 + j * 3) * (salt + 1)) as f32 * 0.13).sin() * 0.5
    })
}

/// The largest relative error of any gradient against the reference's, by name.
fn worst(got: &Gradients, want: &Gradients<ArrayD<f64>>) -> (f64, String) {
    // A forward on X always gives dX.
    assert!(got.x.is_some() && want.x.is_some(), "no dX");
    let mut worst = (0.0f64, String::new());
    let mut check = |name: &str, g: Option<ArrayD<f32>>, r: Option<ArrayD<f64>>| {
        let rel = match (g, r) {
            // A gradient that is 0 in exact arithmetic (db_K: the softmax ignores a shift
            // shared by every key) is compared absolutely.
            (Some(g), Some(r)) if r.iter().all(|v| v.abs() < 1e-9) => reference::compare(&g, &r).1,
            (Some(g), Some(r)) => reference::compare(&g, &r).0,
            (None, None) => 0.0,
            _ => f64::INFINITY,
        };
        if rel > worst.0 || rel.is_nan() {
            worst = (rel, name.to_string());
        }
    };
    check("x", got.x.clone(), want.x.clone());
    check("w_q", got.w_q.clone(), want.w_q.clone());
    check("w_k", got.w_k.clone(), want.w_k.clone());
    check("w_v", got.w_v.clone(), want.w_v.clone());
    check("w_o", got.w_o.clone(), want.w_o.clone());
    check("b_q", got.b_q.clone(), want.b_q.clone());
    check("b_k", got.b_k.clone(), want.b_k.clone());
    check("b_v", got.b_v.clone(), want.b_v.clone());
    check("b_o", got.b_o.clone(), want.b_o.clone());
    check(
        "relative_bias",
        got.relative_bias.clone(),
        want.relative_bias.clone(),
    );
    worst
}

struct Weights {
    q: Array2<f32>,
    k: Array2<f32>,
    v: Array2<f32>,
    o: Array2<f32>,
    b: [Array1<f32>; 4],
}

impl Weights {
    /// d = 12 in; W_Q 8 wide, W_K 4 and W_V 6 (two K/V heads for four query heads, so the
    /// context is 4 · 3 = 12 wide), W_O 12 → 5.
    fn new() -> Self {
        Weights {
            q: w(12, 8, 1),
            k: w(12, 4, 2),
            v: w(12, 6, 3),
            o: w(12, 5, 4),
            b: [8, 4, 6, 5].map(|n| Array1::from_shape_fn(n, |i| 0.1 * i as f32 - 0.2)),
        }
    }

    fn projections(&self) -> Projections<'_> {
        let mut p = Projections::new(self.q.view(), self.k.view(), self.v.view())
            .with_output(self.o.view(), Some(self.b[3].view()));
        p.b_q = Some(self.b[0].view());
        p.b_k = Some(self.b[1].view());
        p.b_v = Some(self.b[2].view());
        p
    }
}

/// The saved state of a saved forward that must have succeeded.
fn saved_of(out: wgpu_attention::Result<wgpu_attention::Output>) -> Saved {
    out.unwrap()
        .saved
        .expect("a saved forward carries its Saved")
}

fn x(batch: usize, n: usize, d: usize) -> Array3<f32> {
    Array3::from_shape_fn((batch, n, d), |(b, i, j)| {
        ((b * 3 + i * 5 + j) as f32 * 0.07).cos()
    })
}

#[test]
fn the_layer_backward_through_modifiers_matches_the_reference() {
    // The projected layer (grouped-query K/V, W_O, biases) with score and mask modifiers:
    // ALiBi, T5's bias (its table's gradient too) before a soft-cap, a window and documents,
    // causal and not, on both families.
    use wgpu_attention::modifiers::{Modifiers, Preset};
    let ctx = common::ctx();
    let ws = Weights::new();
    let p = ws.projections();
    let (b, n) = (2, 37);
    let x = x(b, n, 12);
    let d_out = Array3::from_shape_fn((b, n, 5), |(b, i, j)| ((b + i * 3 + j) as f32 * 0.2).sin());
    let every = common::every_preset(b, 4, n);
    let mods = Modifiers::new()
        .preset(Preset::Alibi(Preset::alibi_slopes(4)))
        .preset(every[5].clone())
        .preset(Preset::Softcap(1.2))
        .preset(Preset::Window { left: 9, right: 4 })
        .preset(every[3].clone());
    let mask = Mask::none().with_modifiers(&mods);
    let inputs = Inputs::x(&x).projections(&p).mask(&mask);
    let mut failures = Vec::new();
    for causal in [false, true] {
        let base = Attention::new().heads(4).causal(causal);
        let want = reference::backward(&base, &inputs, d_out.view().into_dyn()).unwrap();
        assert!(want.relative_bias.is_some());
        for kernels in [Kernels::Storage, Kernels::Subgroup] {
            let op = base.options(Options::default().kernels(kernels).nan_fill(true));
            let saved = saved_of(op.save_for_backward(true).run(ctx, inputs.clone()));
            let (rel, which) = worst(&saved.backward(ctx, &d_out).unwrap(), &want);
            if rel > 1e-4 {
                failures.push(format!("{kernels:?} causal={causal}: {which} rel {rel:e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
fn every_gradient_of_the_projected_layer_matches_the_reference_on_every_family() {
    let ctx = common::ctx();
    let ws = Weights::new();
    let p = ws.projections();
    let x = x(2, 37, 12);
    let d_out = Array3::from_shape_fn((2, 37, 5), |(b, i, j)| ((b + i * 3 + j) as f32 * 0.2).sin());
    let lengths = [30usize, 37];
    let mask = Mask::none().with_kv_lengths(&lengths);
    let base = Attention::new().heads(4).causal(true);
    let inputs = Inputs::x(&x).projections(&p).mask(&mask);
    let want = reference::backward(&base, &inputs, d_out.view().into_dyn()).unwrap();
    let mut ops: Vec<(String, Attention)> = Kernels::available(ctx)
        .into_iter()
        .map(|k| {
            let options = Options::default().kernels(k).nan_fill(true);
            (k.to_string(), base.options(options))
        })
        .collect();
    let blocked = FlashVariant::Blocked { rows: 32, keys: 64 };
    let options = Options::default().flash_variant(blocked).nan_fill(true);
    ops.push((blocked.to_string(), base.options(options)));
    let mut failures = Vec::new();
    for (name, op) in ops {
        let out = op.save_for_backward(true).run(ctx, inputs.clone()).unwrap();
        let saved = out.saved.clone().unwrap();
        // The saved forward's output is the plain forward's.
        let plain = op.return_weights(false).run(ctx, inputs.clone()).unwrap();
        assert_eq!(out.context, plain.context, "{name}");
        let got = saved.backward(ctx, &d_out).unwrap();
        let (rel, which) = worst(&got, &want);
        if rel > 1e-4 {
            failures.push(format!("{name}: {which} rel {rel:e}"));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
fn the_parameter_free_layer_sums_the_three_uses_of_x() {
    let ctx = common::ctx();
    let x = x(1, 7, 8);
    let d_out = Array3::from_shape_fn((1, 7, 8), |(_, i, j)| ((i * 8 + j) as f32 * 0.3).cos());
    let op = Attention::new()
        .heads(2)
        .options(Options::default().nan_fill(true));
    let want = reference::backward(&op, &Inputs::x(&x), d_out.view().into_dyn()).unwrap();
    let saved = saved_of(op.save_for_backward(true).run(ctx, Inputs::x(&x)));
    let got = saved.backward(ctx, &d_out).unwrap();
    let (rel, which) = worst(&got, &want);
    assert!(rel < 1e-4, "{which}: {rel:e}");
    assert!(got.w_q.is_none());
}

#[test]
fn f16_and_a_layers_saved_forward_match_within_their_bounds() {
    let ctx = common::ctx();
    let ws = Weights::new();
    let p = ws.projections();
    let x = x(1, 19, 12);
    let d_out = Array3::from_shape_fn((1, 19, 5), |(_, i, j)| ((i + j * 7) as f32 * 0.1).sin());
    let op = Attention::new().heads(4).causal(true);
    let want =
        reference::backward(&op, &Inputs::x(&x).projections(&p), d_out.view().into_dyn()).unwrap();
    let layer = Layer::new(ctx, op.save_for_backward(true), &p).unwrap();
    let saved = saved_of(layer.run(ctx, Inputs::x(&x)));
    let (rel, which) = worst(&saved.backward(ctx, &d_out).unwrap(), &want);
    assert!(rel < 1e-4, "layer: {which} {rel:e}");
    if ctx
        .device()
        .features()
        .contains(wgpu_attention::wgpu::Features::SHADER_F16)
    {
        let op = op.dtype(Dtype::F16).save_for_backward(true);
        let saved = saved_of(op.run(ctx, Inputs::x(&x).projections(&p)));
        let (rel, which) = worst(&saved.backward(ctx, &d_out).unwrap(), &want);
        assert!(rel < 2e-2, "f16: {which} {rel:e}");
        assert!(rel > 1e-5, "f16 should show f16's error, got {rel:e}");
    }
}

#[test]
fn backward_without_a_matching_forward_is_an_error() {
    let ctx = common::ctx();
    let ws = Weights::new();
    let p = ws.projections();
    let x = x(1, 5, 12);
    let op = Attention::new().heads(4);
    let saved = saved_of(
        op.save_for_backward(true)
            .run(ctx, Inputs::x(&x).projections(&p)),
    );
    let says = |r: wgpu_attention::Result<Gradients>, what: &str| {
        let e = r.unwrap_err().to_string();
        assert!(e.contains(what), "{e:?} should say {what:?}");
    };
    says(
        saved.backward(ctx, &Array3::<f32>::zeros((1, 5, 4))),
        "without a matching forward",
    );
    let mut nan = Array3::<f32>::zeros((1, 5, 5));
    nan[[0, 2, 1]] = f32::NAN;
    says(saved.backward(ctx, &nan), "NaN");
    let other = Context::new().unwrap().with_tuning(false);
    says(
        saved.backward(&other, &Array3::<f32>::zeros((1, 5, 5))),
        "another Context",
    );
}
