//! A `Layer` projects Q, K and V in one matmul (its `W_Q | W_K | W_V` packed when built) on
//! both families and with each matmul variant, and the results still equal the array API's
//! three projections bit for bit: grouped-query widths (d_q ≠ d_v, narrow K/V), some biases
//! absent, f16, widths that are and are not multiples of 4, rows past one tile.

mod common;

use ndarray::{Array1, Array2, Array3};
use wgpu_attention::internals::MatmulVariant;
use wgpu_attention::{
    reference, Attention, Context, Dtype, Inputs, Kernels, Layer, Options, Projections,
};

fn w(r: usize, c: usize, salt: usize) -> Array2<f32> {
    Array2::from_shape_fn((r, c), |(i, j)| {
        (((i * 5 + j * 11) * (salt + 2)) as f32 * 0.071).sin() * 0.4
    })
}

#[test]
fn one_qkv_matmul_equals_three_projections_bit_for_bit() {
    let ctx = common::ctx();
    let mut failures = Vec::new();
    // (d, d_q, d_k, d_v, heads): GQA with narrow K/V and d_q ≠ d_v; odd widths everywhere.
    for (d, dq, dk, dv, heads) in [(16, 16, 8, 12, 4), (13, 9, 3, 6, 3)] {
        let (wq, wk, wv, wo) = (w(d, dq, 1), w(d, dk, 2), w(d, dv, 3), w(dv * dq / dk, 7, 4));
        let (bq, bk) = (
            Array1::from_elem(dq, 0.1f32),
            Array1::from_elem(dk, -0.3f32),
        );
        let mut p = Projections::new(wq.view(), wk.view(), wv.view()).with_output(wo.view(), None);
        p.b_q = Some(bq.view());
        p.b_k = Some(bk.view());
        let x = Array3::from_shape_fn((2, 70, d), |(b, i, j)| {
            ((b * 7 + i * 3 + j) as f32 * 0.05).cos()
        });
        let mut ops = Vec::new();
        for family in Kernels::available(ctx) {
            ops.push(Attention::new().options(Options::default().kernels(family)));
        }
        for per_thread in [4, 8] {
            let v = MatmulVariant::Blocked { per_thread };
            ops.push(
                Attention::new().options(
                    Options::default()
                        .kernels(Kernels::Storage)
                        .matmul_variant(v),
                ),
            );
        }
        for base in ops {
            for dtype in [Dtype::F32, Dtype::F16] {
                let op = base
                    .heads(heads)
                    .causal(true)
                    .dtype(dtype)
                    .return_weights(true);
                let layer = Layer::new(ctx, op, &p).unwrap();
                let got = layer.run(ctx, Inputs::x(&x)).unwrap();
                let want = op.run(ctx, Inputs::x(&x).projections(&p)).unwrap();
                if got.context != want.context {
                    failures.push(format!("d={d} {op:?}"));
                }
            }
        }
        // And against the f64 reference, so the equality means something.
        let op = Attention::new().heads(heads).causal(true);
        let layer = Layer::new(ctx, op, &p).unwrap();
        let got = layer.run(ctx, Inputs::x(&x)).unwrap();
        let want = reference::run(&op, &Inputs::x(&x).projections(&p)).unwrap();
        let (rel, max) = reference::compare(&got.context, &want.context);
        assert!(rel < 1e-5, "d={d}: rel {rel:e} max {max:e}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_layer_call_runs_one_projection_matmul_and_packs_only_x() {
    // Its own context: profiling records the passes of whichever call ran last on it.
    let ctx = &Context::new().unwrap().with_tuning(false);
    let d = 16;
    let (wq, wk, wv, wo) = (w(d, d, 1), w(d, d, 2), w(d, d, 3), w(d, d, 4));
    let p = Projections::new(wq.view(), wk.view(), wv.view()).with_output(wo.view(), None);
    let x = Array3::from_shape_fn((1, 40, d), |(_, i, j)| ((i + 2 * j) as f32 * 0.1).sin());
    for family in Kernels::available(ctx) {
        let op = Attention::new()
            .heads(2)
            .options(Options::default().kernels(family));
        let layer = Layer::new(ctx, op, &p).unwrap();
        let layer_passes = common::passes(ctx, || drop(layer.run(ctx, Inputs::x(&x)).unwrap()));
        let array_passes = common::passes(ctx, || {
            drop(op.run(ctx, Inputs::x(&x).projections(&p)).unwrap())
        });
        // The array API: Q, K, V and W_O, four matmuls (the subgroup family packing both
        // operands of each); the layer: Q, K, V in one, then W_O, packing only X and the
        // context (its weights were packed when it was built).
        let matmuls = (
            common::count(&array_passes, "matmul"),
            common::count(&layer_passes, "matmul"),
        );
        let packs = (
            common::count(&array_passes, "pack"),
            common::count(&layer_passes, "pack"),
        );
        let both = format!("{family}: array {array_passes:?}, layer {layer_passes:?}");
        assert_eq!(matmuls.0 - matmuls.1, 2, "{both}");
        if family == Kernels::Subgroup {
            assert_eq!(packs.0 - packs.1, 6, "{both}");
        }
    }
}
