//! `Dtype::F16`: operands stored as f16 on the device, arithmetic in f32. Its accuracy
//! against the f64 reference (within 1e-2, and visibly f16's, not f32's), on every kernel
//! path, with projections, masks and sdpa; and its clear errors: an adapter without
//! SHADER_F16, inputs past f16's range, and a result that overflowed.

mod common;

use ndarray::{Array2, ArrayD, IxDyn};
use wgpu_attention::wgpu;
use wgpu_attention::{
    reference, verify, Attention, Context, Dtype, Error, Inputs, Mask, Options, Projections,
};

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
fn f16_operands_are_within_1e_2_of_the_reference_on_every_path() {
    let ctx = common::ctx();
    if ctx.require_f16().is_err() {
        // Said, not skipped silently: the error test below covers such adapters.
        panic!("the default adapter lacks SHADER_F16; these tests need it (lavapipe has it)");
    }
    let (batch, n, d) = (2, 70, 24);
    let xs = x(batch, n, d);
    let (wq, wk, wv, wo) = (w(d, 32, 1), w(d, 32, 2), w(d, 16, 3), w(16, 12, 4));
    let bo = ndarray::Array1::from_shape_fn(12, |i| i as f32 * 0.05);
    let proj = Projections::new(wq.view(), wk.view(), wv.view());
    let with_out = proj.with_output(wo.view(), Some(bo.view()));
    let lengths = [70, 33];
    for (label, p, mask) in [
        ("QKV=X", None, Mask::none()),
        ("projections", Some(&proj), Mask::none()),
        (
            "W_O + key lengths",
            Some(&with_out),
            Mask::none().with_kv_lengths(&lengths),
        ),
    ] {
        for causal in [false, true] {
            let base = Attention::new()
                .heads(2)
                .causal(causal)
                .options(Options::default().nan_fill(true));
            let inputs = Inputs::x(&xs).projections(p).mask(&mask);
            let want = reference::run(&base, &inputs).unwrap();
            for (kernels, fused) in verify::paths(ctx) {
                let op = base
                    .options(Options::default().kernels(kernels).nan_fill(true))
                    .return_weights(!fused);
                let what = format!("{label} {kernels} fused={fused} causal={causal}");
                let f32_out = op.run(ctx, inputs.clone()).unwrap();
                let f16_out = op.dtype(Dtype::F16).run(ctx, inputs.clone()).unwrap();
                let (rel32, _) = reference::compare(&f32_out.context, &want.context);
                let (rel16, _) = reference::compare(&f16_out.context, &want.context);
                assert!(rel16 < 1e-2, "{what}: f16 context rel {rel16:e}");
                // The f16 path really ran: its error is f16's, far above f32's.
                assert!(
                    rel16 > 1e-5 && rel16 > 10.0 * rel32,
                    "{what}: {rel16:e} vs {rel32:e}"
                );
                if let Some(wt) = &f16_out.weights {
                    let (wrel, _) = reference::compare(wt, want.weights.as_ref().unwrap());
                    assert!(wrel < 1e-2, "{what}: f16 weights rel {wrel:e}");
                }
            }
        }
    }
}

#[test]
fn f16_sdpa_with_grouped_query_heads_is_within_1e_2() {
    let ctx = common::ctx();
    let [q, _, _] = common::sdpa_arrays(2, 4, 19, 29, 8, 6);
    let [_, k, v] = common::sdpa_arrays(2, 2, 19, 29, 8, 6);
    let keep = ArrayD::from_shape_fn(IxDyn(&[19, 29]), |ix| (ix[0] + ix[1]) % 4 != 0);
    let mask = Mask::boolean(keep.view());
    let base = Attention::new().causal(true);
    let inputs = Inputs::qkv(&q, &k, &v).mask(&mask);
    let want = reference::run(&base, &inputs).unwrap();
    for (kernels, fused) in verify::paths(ctx) {
        let op = base
            .options(Options::default().kernels(kernels))
            .return_weights(!fused)
            .dtype(Dtype::F16);
        let got = op.run(ctx, inputs.clone()).unwrap();
        let (rel, _) = reference::compare(&got.context, &want.context);
        assert!(rel < 1e-2 && rel > 1e-5, "{kernels} fused={fused}: {rel:e}");
    }
}

#[test]
fn f16_errors_are_clear() {
    let ctx = common::ctx();
    let op = Attention::new().dtype(Dtype::F16);
    // An input past f16's range, named with its index.
    let mut big = x(1, 5, 4);
    big[[0, 3, 2]] = 7e4;
    let e = op.run(ctx, Inputs::x(&big)).unwrap_err();
    assert!(
        e.to_string().contains("X[0, 3, 2]") && e.to_string().contains("65504"),
        "{e}"
    );
    // In range, but Q = X·W overflows f16 (|q| ≈ 250·250·8): an error, not inf or NaN.
    let huge = ArrayD::from_elem(IxDyn(&[1, 4, 8]), 250.0f32);
    let wide = Array2::from_elem((8, 8), 250.0f32);
    let proj = Projections::new(wide.view(), wide.view(), wide.view());
    let e = op
        .run(ctx, Inputs::x(&huge).projections(&proj))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Overflow {
                dtype: Dtype::F16,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("overflowed"), "{e}");
    // The same problem in f32 is fine.
    assert!(Attention::new()
        .run(ctx, Inputs::x(&huge).projections(&proj))
        .is_ok());
    assert_eq!("F16".parse::<Dtype>().unwrap(), Dtype::F16);
    assert!("bf16".parse::<Dtype>().is_err());
}

#[test]
fn a_device_without_shader_f16_says_so() {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    let adapter = pollster::block_on(instance.request_adapter(&Default::default()))
        .expect("tests need an adapter");
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        required_limits: adapter.limits(),
        ..Default::default()
    }))
    .expect("a device without optional features");
    let ctx = Context::from_parts(adapter, device, queue).with_tuning(false);
    let x = x(1, 5, 4);
    let e = Attention::new()
        .dtype(Dtype::F16)
        .run(&ctx, Inputs::x(&x))
        .unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    assert!(e.to_string().contains("SHADER_F16"), "{e}");
    assert!(e.to_string().contains("--dtype f32"), "{e}");
    // f32 still runs there.
    assert!(Attention::new().run(&ctx, Inputs::x(&x)).is_ok());
}
