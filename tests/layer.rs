//! `Layer`: projection weights uploaded once, kept on the device. Its calls equal the array
//! API's with the same op and projections bit for bit, on every path, with biases, `W_O`,
//! masks, grouped-query K/V and f16; calls past the device's limits still split; and a layer
//! is refused on a context it was not built on.

mod common;

use ndarray::{Array1, Array2, Array3};
use wgpu_attention::{
    reference, Attention, Context, Dtype, Error, Inputs, Kernels, Layer, Mask, Options, Projections,
};

fn w(r: usize, c: usize, salt: usize) -> Array2<f32> {
    Array2::from_shape_fn((r, c), |(i, j)| {
        (((i * 7 + j * 3) * (salt + 1)) as f32 * 0.13).sin() * 0.5
    })
}

#[test]
fn layer_calls_equal_the_array_api_bit_for_bit_on_every_path() {
    let ctx = common::ctx();
    let (d, n) = (12, 37);
    let (wq, wk, wv, wo) = (w(d, 8, 1), w(d, 4, 2), w(d, 6, 3), w(12, 5, 4));
    let (bq, bv, bo) = (
        Array1::from_elem(8, 0.1f32),
        Array1::from_elem(6, -0.2f32),
        Array1::from_elem(5, 0.05f32),
    );
    let mut p =
        Projections::new(wq.view(), wk.view(), wv.view()).with_output(wo.view(), Some(bo.view()));
    p.b_q = Some(bq.view());
    p.b_v = Some(bv.view());
    let x = Array3::from_shape_fn((2, n, d), |(b, i, j)| {
        ((b * 3 + i * 5 + j) as f32 * 0.07).cos()
    });
    let lengths = [30usize, 37];
    let mask = Mask::none().with_kv_lengths(&lengths);
    let mut failures = Vec::new();
    for family in Kernels::available(ctx) {
        for weights in [false, true] {
            for dtype in [Dtype::F32, Dtype::F16] {
                // 4 query heads sharing 2 K/V heads (W_K half W_Q's width).
                let op = Attention::new()
                    .heads(4)
                    .causal(true)
                    .return_weights(weights)
                    .dtype(dtype)
                    .options(Options::default().kernels(family).nan_fill(true));
                let layer = Layer::new(ctx, op, &p).unwrap();
                for _ in 0..2 {
                    let got = layer.run(ctx, Inputs::x(&x).mask(&mask)).unwrap();
                    let want = op
                        .run(ctx, Inputs::x(&x).projections(&p).mask(&mask))
                        .unwrap();
                    if got.context != want.context || got.weights != want.weights {
                        failures.push(format!("{family} weights={weights} {dtype}"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // And the array API itself against the reference, so the equality means something.
    let op = Attention::new().heads(4).causal(true);
    let layer = Layer::new(ctx, op, &p).unwrap();
    let got = layer.run(ctx, Inputs::x(&x).mask(&mask)).unwrap();
    let want = reference::run(&op, &Inputs::x(&x).projections(&p).mask(&mask)).unwrap();
    let (rel, _) = reference::compare(&got.context, &want.context);
    assert!(rel < 1e-5, "rel {rel:e}");
}

#[test]
fn a_layer_checks_its_weights_once_and_its_context_every_call() {
    let ctx = common::ctx();
    let (wq, wk, wv) = (w(6, 4, 1), w(6, 4, 2), w(6, 4, 3));
    let p = Projections::new(wq.view(), wk.view(), wv.view());
    let layer = Layer::new(ctx, Attention::new().heads(2), &p).unwrap();
    assert_eq!(layer.projections().w_q, wq.view());
    // X of the wrong width, and NaN in X, as the array API says.
    let bad = Array2::<f32>::zeros((3, 5));
    assert!(matches!(
        layer.run(ctx, Inputs::x(&bad)),
        Err(Error::ShapeMismatch { .. })
    ));
    let mut nan = Array2::<f32>::zeros((3, 6));
    nan[[1, 2]] = f32::NAN;
    assert!(matches!(
        layer.run(ctx, Inputs::x(&nan)),
        Err(Error::NonFinite { .. })
    ));
    // Bad weights are refused when the layer is built.
    let mut wq_nan = wq.clone();
    wq_nan[[0, 0]] = f32::INFINITY;
    let p_nan = Projections::new(wq_nan.view(), wk.view(), wv.view());
    assert!(matches!(
        Layer::new(ctx, Attention::new(), &p_nan),
        Err(Error::NonFinite { .. })
    ));
    let wk_bad = w(6, 3, 2);
    let p_bad = Projections::new(wq.view(), wk_bad.view(), wv.view());
    assert!(Layer::new(ctx, Attention::new().heads(2), &p_bad).is_err());
    // Another context: an error, not a wgpu validation panic or a wrong answer.
    let other = Context::new().unwrap().with_tuning(false);
    let x = Array2::<f32>::ones((3, 6));
    let err = layer.run(&other, Inputs::x(&x)).unwrap_err();
    assert!(err.to_string().contains("another Context"), "{err}");
}
