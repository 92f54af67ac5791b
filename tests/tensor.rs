//! Device-resident tensors: operations on them equal the array API bit for bit (on every
//! family, f32 and f16), layers chain on the device in one recorder and one submit, the
//! misuse cases are clear errors, and the buffer pool makes a loop of calls allocate nothing
//! after its first.

mod common;

use ndarray::{Array1, Array2, Array3, Array4, ArrayD, IxDyn};
use wgpu_attention::{
    reference, Attention, Context, Dtype, Inputs, Kernels, Layer, Mask, Options, Output,
    Projections, Recorder, Tensor,
};

/// Outputs pre-filled with NaN, so an element no kernel wrote shows up; on `kernels`.
fn nan_fill(kernels: Kernels) -> Options {
    Options::default().kernels(kernels).nan_fill(true)
}

fn w(r: usize, c: usize, salt: usize) -> Array2<f32> {
    Array2::from_shape_fn((r, c), |(i, j)| {
        (((i * 7 + j * 3) * (salt + 1)) as f32 * 0.13).sin() * 0.5
    })
}

fn x3(b: usize, n: usize, d: usize) -> Array3<f32> {
    Array3::from_shape_fn((b, n, d), |(b, i, j)| {
        ((b * 3 + i * 5 + j) as f32 * 0.07).cos()
    })
}

fn tensor(ctx: &Context, a: &ArrayD<f32>, dtype: Dtype) -> Tensor {
    Tensor::from_array(ctx, a.view(), dtype).unwrap()
}

#[test]
fn a_tensor_reads_back_what_was_uploaded_in_f32_and_f16() {
    let ctx = common::ctx();
    let a = x3(2, 7, 5).into_dyn();
    let t = tensor(ctx, &a, Dtype::F32);
    assert_eq!(t.shape(), &[2, 7, 5]);
    assert_eq!(t.to_array(ctx).unwrap(), a);
    let h = tensor(ctx, &a, Dtype::F16);
    let back = h.to_array(ctx).unwrap();
    let rounded = a.mapv(|v| half::f16::from_f32(v).to_f32());
    assert_eq!(back, rounded, "f16 holds each value rounded once");
}

#[test]
fn a_layer_on_tensors_equals_the_array_api_bit_for_bit() {
    let ctx = common::ctx();
    let (d, n) = (12, 37);
    let (wq, wk, wv, wo) = (w(d, 8, 1), w(d, 4, 2), w(d, 6, 3), w(12, 5, 4));
    let bq = Array1::from_elem(8, 0.1f32);
    let mut p = Projections::new(wq.view(), wk.view(), wv.view()).with_output(wo.view(), None);
    p.b_q = Some(bq.view());
    let x = x3(2, n, d).into_dyn();
    let lengths = [30usize, 37];
    let mut failures = Vec::new();
    for family in Kernels::available(ctx) {
        for weights in [false, true] {
            for (op_dtype, x_dtype) in [
                (Dtype::F32, Dtype::F32),
                (Dtype::F16, Dtype::F16),
                (Dtype::F16, Dtype::F32),
            ] {
                // 4 query heads sharing 2 K/V heads (W_K half W_Q's width).
                let op = Attention::new()
                    .heads(4)
                    .causal(true)
                    .return_weights(weights)
                    .dtype(op_dtype)
                    .options(nan_fill(family));
                let layer = Layer::new(ctx, op, &p).unwrap();
                let xt = tensor(ctx, &x, x_dtype);
                // Made here, not before the loops: `Inputs::mask` takes `&'a Mask<'a>`, which
                // ties the mask's lifetime to the borrow of this iteration's tensor.
                let mask = Mask::none().with_kv_lengths(&lengths);
                let mut rec = Recorder::new(ctx);
                let got = layer.record(&mut rec, Inputs::x(&xt).mask(&mask)).unwrap();
                rec.submit().unwrap();
                // The array API sees X as the device holds it.
                let x_dev = xt.to_array(ctx).unwrap();
                let want = layer.run(ctx, Inputs::x(&x_dev).mask(&mask)).unwrap();
                let context = got.context.to_array(ctx).unwrap();
                let w_got = got.weights.map(|t| t.to_array(ctx).unwrap());
                if op_dtype != x_dtype {
                    // An f32 X under an f16 op is read as f32 (the array API rounds it to
                    // f16 first): close to the reference, not equal to the array API.
                    let r =
                        reference::run(&op, &Inputs::x(&x).projections(&p).mask(&mask)).unwrap();
                    let (rel, _) = reference::compare(&context, &r.context);
                    let (rel_a, _) = reference::compare(&want.context, &r.context);
                    if rel > 1e-2 || rel_a > 1e-2 {
                        failures.push(format!("{family} weights={weights} X f32: {rel:e}"));
                    }
                } else if context != want.context || w_got != want.weights {
                    failures.push(format!("{family} weights={weights} {op_dtype} X {x_dtype}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "differ from the array API: {failures:?}"
    );
}

#[test]
fn layers_chain_on_the_device_in_one_submit() {
    let ctx = common::ctx();
    let d = 16;
    let (w1, w2) = (
        (w(d, d, 1), w(d, d, 2), w(d, d, 3)),
        (w(d, d, 4), w(d, d, 5), w(d, d, 6)),
    );
    let p1 = Projections::new(w1.0.view(), w1.1.view(), w1.2.view());
    let p2 = Projections::new(w2.0.view(), w2.1.view(), w2.2.view());
    let op = Attention::new().heads(2).causal(true).return_weights(false);
    let (l1, l2) = (
        Layer::new(ctx, op, &p1).unwrap(),
        Layer::new(ctx, op, &p2).unwrap(),
    );
    let x = x3(3, 7, d).into_dyn();
    let xt = tensor(ctx, &x, Dtype::F32);
    let mut rec = Recorder::new(ctx);
    let h = l1.record(&mut rec, Inputs::x(&xt)).unwrap().context;
    let y = l2.record(&mut rec, Inputs::x(&h)).unwrap().context;
    let err = y.to_array(ctx).unwrap_err().to_string();
    assert!(err.contains("never submitted"), "{err}");
    rec.submit().unwrap();
    let got = y.to_array(ctx).unwrap();
    // The same two layers through the array API, with a readback in between.
    let mid = l1.run(ctx, Inputs::x(&x)).unwrap().context;
    let want = l2.run(ctx, Inputs::x(&mid)).unwrap().context;
    assert_eq!(got, want);
    // And against the f64 reference of the composition.
    let r1 = reference::run(&op, &Inputs::x(&x).projections(&p1))
        .unwrap()
        .context;
    let r1 = r1.mapv(|v| v as f32);
    let r2 = reference::run(&op, &Inputs::x(&r1).projections(&p2))
        .unwrap()
        .context;
    let (rel, abs) = reference::compare(&got, &r2);
    assert!(rel < 1e-5 && abs < 1e-5, "rel {rel:e} abs {abs:e}");
}

#[test]
fn sdpa_on_tensors_takes_the_rows_layout_and_equals_the_array_api() {
    let ctx = common::ctx();
    let (b, h, h_kv, l, s, e, e_v) = (2, 4, 2, 7, 37, 8, 12);
    let q = Array4::from_shape_fn((b, h, l, e), |(a, i, j, k)| {
        ((a + i * 3 + j * 5 + k) as f32 * 0.11).sin()
    });
    let k = Array4::from_shape_fn((b, h_kv, s, e), |(a, i, j, c)| {
        ((a * 2 + i + j * 7 + c) as f32 * 0.05).cos()
    });
    let v = Array4::from_shape_fn((b, h_kv, s, e_v), |(a, i, j, c)| {
        ((a + i + j + c * 3) as f32 * 0.3).sin()
    });
    let rows = |a: &Array4<f32>| {
        a.view()
            .permuted_axes([0, 2, 1, 3])
            .as_standard_layout()
            .into_owned()
            .into_dyn()
    };
    let mask = Array4::from_shape_fn((1, 1, l, s), |(_, _, i, j)| (i + j) % 5 != 0);
    for family in Kernels::available(ctx) {
        let op = Attention::new().causal(true).options(nan_fill(family));
        // Made here, not before the loop: `Inputs::mask` takes `&'a Mask<'a>`, which ties the
        // mask's lifetime to the borrow of this iteration's tensors.
        let m = Mask::boolean(mask.view().into_dyn());
        let mut rec = Recorder::new(ctx);
        let (qt, kt, vt) = (
            tensor(ctx, &rows(&q), Dtype::F32),
            tensor(ctx, &rows(&k), Dtype::F32),
            tensor(ctx, &rows(&v), Dtype::F32),
        );
        let got = op
            .record(&mut rec, Inputs::qkv(&qt, &kt, &vt).mask(&m))
            .unwrap();
        rec.submit().unwrap();
        let want = op.run(ctx, Inputs::qkv(&q, &k, &v).mask(&m)).unwrap();
        let context = got.context.to_array(ctx).unwrap();
        assert_eq!(context.shape(), &[b, l, h, e_v]);
        let context = context.permuted_axes(IxDyn(&[0, 2, 1, 3]));
        assert_eq!(context, want.context, "{family}");
        assert_eq!(
            got.weights.unwrap().to_array(ctx).unwrap(),
            want.weights.unwrap(),
            "{family}"
        );
    }
}

#[test]
fn forward_on_a_tensor_without_projections_equals_forward() {
    let ctx = common::ctx();
    let x = x3(1, 37, 8).into_dyn();
    let op = Attention::new().heads(2).options(nan_fill(Kernels::Auto));
    let got = op
        .run(ctx, Inputs::x(&tensor(ctx, &x, Dtype::F32)))
        .unwrap();
    let want = op.run(ctx, Inputs::x(&x)).unwrap();
    assert_eq!(got.context.to_array(ctx).unwrap(), want.context);
    assert_eq!(
        got.weights.unwrap().to_array(ctx).unwrap(),
        want.weights.unwrap()
    );
}

#[test]
fn misuse_is_a_clear_error() {
    let ctx = common::ctx();
    let x = x3(1, 5, 8).into_dyn();
    let says = |r: wgpu_attention::Result<_>, what: &str| {
        let e = r.map(|_: Output<Tensor>| ()).unwrap_err().to_string();
        assert!(e.contains(what), "{e:?} should say {what:?}");
    };
    let xt = tensor(ctx, &x, Dtype::F32);
    // dtype other than the op's
    says(
        Attention::new().dtype(Dtype::F16).run(ctx, Inputs::x(&xt)),
        "the op's dtype is f16",
    );
    // wrong rank for sdpa's rows layout
    says(
        Attention::new().run(ctx, Inputs::qkv(&xt, &xt, &xt)),
        "(batch, rows, heads, width)",
    );
    // an input from a recorder not yet submitted
    let op = Attention::new();
    let mut first = Recorder::new(ctx);
    let pending = op.run(ctx, Inputs::x(&xt)).unwrap().context;
    let unsubmitted = op.record(&mut first, Inputs::x(&pending)).unwrap().context;
    says(op.run(ctx, Inputs::x(&unsubmitted)), "not submitted yet");
    drop(first);
    // a tensor of another context
    let other = Context::new().unwrap().with_tuning(false);
    says(op.run(&other, Inputs::x(&xt)), "another Context");
    // bad uploads
    let empty = ArrayD::<f32>::zeros(IxDyn(&[0, 4]));
    assert!(Tensor::from_array(ctx, empty.view(), Dtype::F32).is_err());
    let mut nan = x.clone();
    nan[[0, 1, 2]] = f32::NAN;
    let e = Tensor::from_array(ctx, nan.view(), Dtype::F32).unwrap_err();
    assert!(e.to_string().contains("NaN"), "{e}");
}

#[test]
fn a_loop_of_calls_allocates_nothing_after_the_first_and_memory_can_be_released() {
    let ctx = Context::new().unwrap().with_tuning(false);
    let d = 16;
    let (wq, wk, wv) = (w(d, d, 1), w(d, d, 2), w(d, d, 3));
    let p = Projections::new(wq.view(), wk.view(), wv.view());
    let layer = Layer::new(&ctx, Attention::new().heads(2), &p).unwrap();
    let x = x3(2, 37, d);
    let xt = tensor(&ctx, &x.clone().into_dyn(), Dtype::F32);
    // The loop's first round, as the loop runs it.
    layer.run(&ctx, Inputs::x(&x)).unwrap();
    let out = layer.run(&ctx, Inputs::x(&xt)).unwrap();
    out.context.to_array(&ctx).unwrap();
    drop(out);
    let after_first = ctx.memory();
    assert!(after_first.allocations > 0 && after_first.free_bytes > 0);
    assert_eq!(after_first.in_use_bytes, 0, "{after_first:?}");
    for _ in 0..3 {
        layer.run(&ctx, Inputs::x(&x)).unwrap();
        let out = layer.run(&ctx, Inputs::x(&xt)).unwrap();
        out.context.to_array(&ctx).unwrap();
    }
    let after = ctx.memory();
    assert_eq!(after.allocations, after_first.allocations, "{after:?}");
    // A tensor held keeps its buffer; the rest can be released.
    let held = layer.run(&ctx, Inputs::x(&xt)).unwrap();
    assert!(ctx.memory().in_use_bytes > 0);
    ctx.release_memory();
    assert_eq!(ctx.memory().free_bytes, 0);
    drop(held);
    assert!(ctx.memory().free_bytes > 0);
    assert_eq!(ctx.memory().in_use_bytes, 0);
}

#[test]
fn arrays_go_in_as_users_hold_them_and_come_back_the_same_dimension() {
    let ctx = common::ctx();
    let d = 8;
    let (wq, wk, wv) = (w(d, d, 1), w(d, d, 2), w(d, d, 3));
    let p = Projections::new(wq.view(), wk.view(), wv.view());
    let op = Attention::new().heads(2);
    let x3 = x3(2, 7, d);
    let x2 = x3.index_axis(ndarray::Axis(0), 1).to_owned();
    // &Array2, ArrayView3 and ArrayD in; the context comes back as an ArrayD of X's
    // dimension (2, 3, 3: `into_dimensionality` checks it).
    let c2: Array2<f32> = op
        .run(ctx, Inputs::x(&x2).projections(&p))
        .unwrap()
        .context
        .into_dimensionality()
        .unwrap();
    let c3: Array3<f32> = op
        .run(ctx, Inputs::x(x3.view()).projections(&p))
        .unwrap()
        .context
        .into_dimensionality()
        .unwrap();
    let cd: ArrayD<f32> = op
        .run(ctx, Inputs::x(x3.view().into_dyn()).projections(&p))
        .unwrap()
        .context;
    assert_eq!(c3.clone().into_dyn(), cd);
    let layer = Layer::new(ctx, op, &p).unwrap();
    let l3: Array3<f32> = layer
        .run(ctx, Inputs::x(&x3))
        .unwrap()
        .context
        .into_dimensionality()
        .unwrap();
    assert_eq!(l3, c3);
    let (rel, _) = reference::compare(
        &c2.into_dyn(),
        &c3.index_axis(ndarray::Axis(0), 1)
            .mapv(f64::from)
            .into_dyn(),
    );
    assert!(rel < 1e-6, "{rel:e}");
}
