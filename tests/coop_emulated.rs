//! The coop kernels' own logic on lavapipe, which has no cooperative matrices: with the test
//! hook `WGPU_ATTENTION_COOP_EMULATE=8` every cooperative load, store and multiply-add of
//! `coop_matmul` and `flash_coop` becomes a loop in each invocation (src/context/coop/
//! emulate.rs), and everything else (staging, zero padding, the subgroups' rounds and spare
//! slots with lavapipe's 8-wide subgroups, the f32 softmax, causal skipping, masks, the
//! epilogues) runs as written. Checked against the f64 reference on odd sizes.

mod common;

use ndarray::{Array2, ArrayD, IxDyn};
use wgpu_attention::{
    reference, Attention, Context, Dims, Inputs, Kernels, Mask, Options, Projections,
};

fn x(batch: usize, n: usize, d: usize) -> ArrayD<f32> {
    ArrayD::from_shape_fn(IxDyn(&[batch, n, d]), |ix| {
        ((ix[0] * 37 + ix[1] * 13 + ix[2] * 5) as f32 * 0.21).cos() * 1.7
    })
}

fn w(d: usize, cols: usize, salt: usize) -> Array2<f32> {
    Array2::from_shape_fn((d, cols), |(i, j)| {
        (((i * 3 + j * 7) * salt) as f32 * 0.043).sin() / (d as f32).sqrt()
    })
}

#[test]
fn emulated_coop_kernels_match_the_reference() {
    common::isolate();
    // Before the context: it reads the hook when asked for its shape.
    std::env::set_var("WGPU_ATTENTION_COOP_EMULATE", "8");
    let ctx = Context::new().unwrap().with_tuning(false);
    let shape = ctx
        .coop_shape()
        .expect("the hook reports a shape where subgroups exist");
    assert_eq!(shape.size, 8);
    // Each combination compiles its own pipelines with LLVM: a few, chosen to cover every
    // branch (fused and not, causal, key lengths), on sizes no tile divides.
    // The last: rows growing with their index, so each key tile raises the running max
    // (large logits; the output must be rescaled at every tile).
    for (batch, n, d, heads, ramp) in [(2, 7, 24, 2, 0.0), (1, 70, 16, 1, 0.08)] {
        let mut xs = x(batch, n, d);
        for ((_, i, _), v) in xs
            .view_mut()
            .into_dimensionality::<ndarray::Ix3>()
            .unwrap()
            .indexed_iter_mut()
        {
            *v *= 1.0 + ramp * i as f32;
        }
        let ws = [w(d, d, 1), w(d, d, 2), w(d, d, 3)];
        let proj = Projections::new(ws[0].view(), ws[1].view(), ws[2].view());
        let lengths: Vec<usize> = (0..batch).map(|b| n - b * n / 3 - 1).collect();
        for (causal, weights, masked) in [
            (false, false, false),
            (true, false, true),
            (true, true, false),
            (false, true, true),
        ] {
            {
                {
                    let mask = match masked {
                        true => Mask::none().with_kv_lengths(&lengths),
                        false => Mask::none(),
                    };
                    let base = Attention::new()
                        .heads(heads)
                        .causal(causal)
                        .options(Options::default().nan_fill(true))
                        .return_weights(weights);
                    let inputs = Inputs::x(&xs).projections(&proj).mask(&mask);
                    let want = reference::run(&base, &inputs).unwrap();
                    let op = base.options(Options::default().kernels(Kernels::Coop).nan_fill(true));
                    let plan = op.plan(&ctx, &Dims::new(&op, &inputs).unwrap()).unwrap();
                    let got = op.run(&ctx, inputs.clone()).unwrap();
                    let (rel, max) = reference::compare(&got.context, &want.context);
                    let what = format!(
                        "{plan} b={batch} n={n} d={d} h={heads} causal={causal} mask={masked}"
                    );
                    // f16 inputs (lavapipe has SHADER_F16), f32 accumulation: f16's error, as
                    // the storage kernels make it at --dtype f16 on the same inputs (1-9e-3;
                    // 0.36 without flash_coop's per-tile rescale).
                    assert!(rel < 1e-2, "{what}: rel {rel:e}, max abs {max:e}");
                    if let Some(wt) = &got.weights {
                        let (wrel, _) = reference::compare(wt, want.weights.as_ref().unwrap());
                        assert!(wrel < 1e-2, "{what}: weights rel {wrel:e}");
                    }
                }
            }
        }
    }
}
