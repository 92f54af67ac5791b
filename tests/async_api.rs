//! The async core (what the browser build calls) against the blocking API that wraps it and
//! against the f64 reference: same numbers, same errors.

mod common;

use ndarray::{Array2, Array4};
use wgpu_attention::{
    reference, verify, Attention, Context, Error, Inputs, Kernels, Mask, Options, Projections,
};

fn filled(rows: usize, cols: usize, salt: usize) -> Array2<f32> {
    Array2::from_shape_fn((rows, cols), |(i, j)| {
        (((i * 31 + j * 7 + salt * 13) % 23) as f32 / 23.0 - 0.5) * 2.0
    })
}

#[test]
fn context_new_async_opens_the_same_adapter() {
    common::isolate();
    let ctx = pollster::block_on(Context::new_async()).unwrap();
    assert_eq!(ctx.adapter_info().name, common::ctx().adapter_info().name);
}

#[test]
fn forward_async_equals_forward_and_the_reference() {
    let ctx = common::ctx();
    // Sizes that are no tile's multiple, heads, causal, NaN-prefilled outputs, both families.
    let x = filled(37, 13, 0);
    let (wq, wk, wv) = (filled(13, 10, 1), filled(13, 10, 2), filled(13, 6, 3));
    let proj = Projections::new(wq.view(), wk.view(), wv.view());
    for kernels in Kernels::available(ctx) {
        let op = Attention::new()
            .heads(2)
            .causal(true)
            .options(Options::default().kernels(kernels).nan_fill(true));
        let xd = x.view().into_dyn();
        let inputs = Inputs::x(xd.view()).projections(&proj);
        let a = pollster::block_on(op.run_async(ctx, inputs.clone())).unwrap();
        let s = op.run(ctx, inputs.clone()).unwrap();
        assert_eq!(a.context, s.context, "{kernels:?}");
        assert_eq!(a.weights, s.weights, "{kernels:?}");
        let r = reference::run(&op, &inputs).unwrap();
        let (rel, max) = reference::compare(&a.context, &r.context);
        assert!(
            rel < 1e-5 && max < 1e-4,
            "{kernels:?}: rel {rel}, max {max}"
        );
    }
}

#[test]
fn sdpa_masked_async_equals_sdpa_masked_with_gqa_and_large_logits() {
    let ctx = common::ctx();
    let q = Array4::from_shape_fn((1, 4, 7, 8), |(_, h, i, j)| {
        ((h + i * 3 + j) as f32 * 0.7).sin() * 30.0
    });
    let k = Array4::from_shape_fn((1, 2, 9, 8), |(_, h, i, j)| {
        ((h * 5 + i + j * 2) as f32 * 0.3).cos()
    });
    let v = Array4::from_shape_fn((1, 2, 9, 5), |(_, h, i, j)| (h + i + j) as f32 * 0.1);
    let mask = Mask::none().with_kv_lengths(&[6]);
    let op = Attention::new().options(Options::default().nan_fill(true));
    let inputs = Inputs::qkv(&q, &k, &v).mask(&mask);
    let a = pollster::block_on(op.run_async(ctx, inputs.clone())).unwrap();
    let s = op.run(ctx, inputs.clone()).unwrap();
    assert_eq!(a.context, s.context);
    let r = reference::run(&op, &inputs).unwrap();
    let (rel, _) = reference::compare(&a.context, &r.context);
    assert!(rel < 1e-5, "rel {rel}");
}

#[test]
fn async_calls_return_the_same_errors() {
    let ctx = common::ctx();
    let x = Array2::from_elem((5, 4), f32::NAN);
    let err = pollster::block_on(Attention::new().run_async(ctx, Inputs::x(&x))).unwrap_err();
    assert!(matches!(err, Error::NonFinite { .. }), "{err}");
    let q = Array4::<f32>::zeros((1, 3, 4, 8));
    let k = Array4::<f32>::zeros((1, 2, 4, 8));
    let err =
        pollster::block_on(Attention::new().run_async(ctx, Inputs::qkv(&q, &k, &k))).unwrap_err();
    assert!(err.to_string().contains("head"), "{err}");
}

#[test]
fn verify_run_case_async_passes_the_standard_cases_on_every_path() {
    let ctx = common::ctx();
    let cases = verify::on_every_path(ctx, &verify::standard_cases()[..6]);
    for (i, case) in cases.iter().enumerate() {
        let r = pollster::block_on(verify::run_case_async(ctx, case, i as u64)).unwrap();
        assert!(r.passed(), "{r}");
    }
}
