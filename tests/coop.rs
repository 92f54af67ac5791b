//! The cooperative-matrix (tensor-core) kernels: against the f64 reference wherever the
//! adapter has `Features::EXPERIMENTAL_COOPERATIVE_MATRIX` (odd sizes, causal, f16, with and
//! without the weights), and elsewhere (lavapipe) a clear `Unsupported` error when they are
//! forced, never a panic. That their WGSL validates is a unit test (`cargo test --lib coop`),
//! which runs without the feature.

mod common;

use ndarray::{Array2, ArrayD, IxDyn};
use wgpu_attention::internals::{FlashVariant, MatmulVariant};
use wgpu_attention::{reference, Attention, Dtype, Error, Inputs, Kernels, Options, Projections};

fn x(batch: usize, n: usize, d: usize) -> ArrayD<f32> {
    ArrayD::from_shape_fn(IxDyn(&[batch, n, d]), |ix| {
        ((ix[0] * 131 + ix[1] * 17 + ix[2] * 7) as f32 * 0.173).sin() * 1.3
    })
}

fn w(d: usize, cols: usize, salt: usize) -> Array2<f32> {
    Array2::from_shape_fn((d, cols), |(i, j)| {
        (((i * 5 + j * 11) * salt) as f32 * 0.031).cos() / (d as f32).sqrt()
    })
}

#[test]
fn coop_kernels_match_the_reference_where_the_adapter_has_cooperative_matrices() {
    let ctx = common::ctx();
    let Some(shape) = ctx.coop_shape() else {
        eprintln!(
            "skipped: adapter {:?} has no cooperative-matrix shape the coop kernels use \
             (wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX with 16x16 or 8x8 products \
             accumulated in f32, and subgroups); reported: {:?}",
            ctx.adapter_info().name,
            ctx.coop_properties()
        );
        return;
    };
    // f16 inputs round to 11 bits; f32 ones are exact up to accumulation order.
    let bound = if shape.f16_inputs { 1e-2 } else { 1e-5 };
    for (batch, n, d) in [(1, 1, 8), (2, 7, 24), (1, 37, 40), (2, 130, 72)] {
        let xs = x(batch, n, d);
        let ws = [w(d, d, 1), w(d, d, 2), w(d, d, 3), w(d, d, 4)];
        let proj = Projections::new(ws[0].view(), ws[1].view(), ws[2].view())
            .with_output(ws[3].view(), None);
        for causal in [false, true] {
            for weights in [false, true] {
                for dtype in [Dtype::F32, Dtype::F16] {
                    let base = Attention::new()
                        .heads(2)
                        .causal(causal)
                        .options(Options::default().nan_fill(true))
                        .return_weights(weights);
                    let inputs = Inputs::x(&xs).projections(&proj);
                    let want = reference::run(&base, &inputs).unwrap();
                    let got = base
                        .options(Options::default().kernels(Kernels::Coop).nan_fill(true))
                        .dtype(dtype)
                        .run(ctx, inputs.clone())
                        .unwrap();
                    let (rel, max) = reference::compare(&got.context, &want.context);
                    let what = format!("{shape} b={batch} n={n} d={d} causal={causal} {dtype:?}");
                    assert!(rel < bound, "{what}: rel {rel:e}, max abs {max:e}");
                    if let Some(wt) = &got.weights {
                        let (wrel, _) = reference::compare(wt, want.weights.as_ref().unwrap());
                        assert!(wrel < bound, "{what}: weights rel {wrel:e}");
                    }
                }
            }
        }
    }
}

#[test]
fn forcing_coop_without_cooperative_matrices_is_a_clear_error() {
    let ctx = common::ctx();
    if ctx.coop_shape().is_some() {
        eprintln!("skipped: this adapter has cooperative matrices (the test above runs them)");
        return;
    }
    let xs = x(1, 9, 8);
    let eye = Array2::<f32>::eye(8);
    let proj = Projections::new(eye.view(), eye.view(), eye.view());
    for options in [
        Options::default().kernels(Kernels::Coop),
        Options::default().matmul_variant(MatmulVariant::Coop),
        Options::default().flash_variant(FlashVariant::Coop),
    ] {
        let op = Attention::new().options(options);
        let e = op.run(ctx, Inputs::x(&xs).projections(&proj)).unwrap_err();
        assert!(
            matches!(&e, Error::Unsupported { feature, .. }
                if feature.contains("EXPERIMENTAL_COOPERATIVE_MATRIX")),
            "{e}"
        );
        assert!(e.to_string().contains("--kernels auto"), "{e}");
    }
    assert_eq!("coop".parse::<Kernels>().unwrap(), Kernels::Coop);
}
