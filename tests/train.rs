//! Training on the device: the tensor forms of the layer's saved forward and backward
//! (bit for bit the array forms, on every kernel family and f16, and their errors), the Adam
//! kernel against a CPU Adam, a layer whose weights change on the device and whose next
//! forward uses them, the MSE loss kernel, and memory held flat over steps.

mod common;

use ndarray::{Array1, Array2, Array3, ArrayD};
use wgpu_attention::internals::FlashVariant;
use wgpu_attention::{
    Adam, Attention, Context, Dtype, Gradients, Inputs, Kernels, Layer, Mask, MseLoss, Options,
    Output, Projections, Recorder, Saved, Tensor,
};

fn w(r: usize, c: usize, salt: usize) -> Array2<f32> {
    Array2::from_shape_fn((r, c), |(i, j)| {
        (((i * 7 + j * 3) * (salt + 1)) as f32 * 0.13).sin() * 0.5
    })
}

fn x(batch: usize, n: usize, d: usize) -> Array3<f32> {
    Array3::from_shape_fn((batch, n, d), |(b, i, j)| {
        ((b * 3 + i * 5 + j) as f32 * 0.07).cos()
    })
}

/// d = 12 in, W_Q 8 wide, W_K 4, W_V 6 (GQA: two K/V heads for four query heads), W_O 12 → 5,
/// every bias.
struct Weights {
    w: [Array2<f32>; 4],
    b: [Array1<f32>; 4],
}

impl Weights {
    fn new() -> Self {
        Weights {
            w: [w(12, 8, 1), w(12, 4, 2), w(12, 6, 3), w(12, 5, 4)],
            b: [8, 4, 6, 5].map(|n| Array1::from_shape_fn(n, |i| 0.1 * i as f32 - 0.2)),
        }
    }

    fn projections(&self) -> Projections<'_> {
        let [q, k, v, o] = &self.w;
        let mut p = Projections::new(q.view(), k.view(), v.view())
            .with_output(o.view(), Some(self.b[3].view()));
        p.b_q = Some(self.b[0].view());
        p.b_k = Some(self.b[1].view());
        p.b_v = Some(self.b[2].view());
        p
    }
}

fn tensor(ctx: &Context, a: &Array3<f32>, dtype: Dtype) -> Tensor {
    Tensor::from_array(ctx, a.view().into_dyn(), dtype).unwrap()
}

fn has_f16(ctx: &Context) -> bool {
    ctx.device()
        .features()
        .contains(wgpu_attention::wgpu::Features::SHADER_F16)
}

fn bits(a: &ArrayD<f32>) -> Vec<u32> {
    a.iter().map(|v| v.to_bits()).collect()
}

/// Every field of two `Gradients` equal bit for bit (dX always given: a forward on X).
fn same(got: &Gradients, want: &Gradients, what: &str) {
    assert!(got.x.is_some(), "{what}: no dX");
    let b = |a: &Option<ArrayD<f32>>| a.as_ref().map(bits);
    assert_eq!(b(&got.x), b(&want.x), "{what}: dX");
    assert_eq!(b(&got.w_q), b(&want.w_q), "{what}: dW_Q");
    assert_eq!(b(&got.w_k), b(&want.w_k), "{what}: dW_K");
    assert_eq!(b(&got.w_v), b(&want.w_v), "{what}: dW_V");
    assert_eq!(b(&got.w_o), b(&want.w_o), "{what}: dW_O");
    assert_eq!(b(&got.b_q), b(&want.b_q), "{what}: db_Q");
    assert_eq!(b(&got.b_k), b(&want.b_k), "{what}: db_K");
    assert_eq!(b(&got.b_v), b(&want.b_v), "{what}: db_V");
    assert_eq!(b(&got.b_o), b(&want.b_o), "{what}: db_O");
}

/// The saved state of a saved forward that must have succeeded.
fn saved_of<T>(out: wgpu_attention::Result<Output<T>>) -> Saved {
    out.unwrap()
        .saved
        .expect("a saved forward carries its Saved")
}

/// Outputs pre-filled with NaN, so an element no kernel wrote shows up.
fn nan_fill() -> Options {
    Options::default().nan_fill(true)
}

/// Every weight and bias, as bits.
fn weight_bits(p: &Projections<'_>) -> Vec<u32> {
    let ws = [Some(p.w_q), Some(p.w_k), Some(p.w_v), p.w_o];
    let bs = [p.b_q, p.b_k, p.b_v, p.b_o];
    let ws = ws.iter().flatten().flat_map(|w| w.iter());
    let bs = bs.iter().flatten().flat_map(|b| b.iter());
    ws.chain(bs).map(|v| v.to_bits()).collect()
}

#[test]
fn the_tensor_backward_is_the_array_backward_bit_for_bit_on_every_family() {
    let ctx = common::ctx();
    let ws = Weights::new();
    let p = ws.projections();
    let x = x(2, 37, 12);
    let d_out = Array3::from_shape_fn((2, 37, 5), |(b, i, j)| ((b + i * 3 + j) as f32 * 0.2).sin());
    let keep = Array2::from_shape_fn((37, 37), |(i, j)| (i + 2 * j) % 5 != 0);
    let base = Attention::new()
        .heads(4)
        .causal(true)
        .options(nan_fill())
        .save_for_backward(true);
    let mut ops: Vec<(String, Attention)> = Kernels::available(ctx)
        .into_iter()
        .map(|kernels| {
            let op = base.options(nan_fill().kernels(kernels));
            (kernels.to_string(), op)
        })
        .collect();
    let blocked = FlashVariant::Blocked { rows: 32, keys: 64 };
    let options = nan_fill().flash_variant(blocked);
    ops.push((blocked.to_string(), base.options(options)));
    if has_f16(ctx) {
        ops.push(("f16".into(), base.dtype(Dtype::F16)));
    }
    for (name, op) in ops {
        // Made here, not before the loop: `Inputs::mask` takes `&'a Mask<'a>`, which ties the
        // mask's lifetime to the borrow of this iteration's tensor.
        let mask = Mask::boolean(keep.view().into_dyn()).with_kv_lengths(&[30, 37]);
        let layer = Layer::new(ctx, op, &p).unwrap();
        let out = layer.run(ctx, Inputs::x(&x).mask(&mask)).unwrap();
        let want = out.saved.as_ref().unwrap().backward(ctx, &d_out).unwrap();
        let dtype = if name == "f16" {
            Dtype::F16
        } else {
            Dtype::F32
        };
        let x_t = tensor(ctx, &x, dtype);
        let out_t = layer.run(ctx, Inputs::x(&x_t).mask(&mask)).unwrap();
        assert_eq!(
            bits(&out_t.context.to_array(ctx).unwrap()),
            bits(&out.context),
            "{name}: output"
        );
        let d_t = tensor(ctx, &d_out, Dtype::F32);
        let got = out_t.saved.unwrap().backward(ctx, &d_t).unwrap();
        assert_eq!(got.x.as_ref().unwrap().shape(), &[2, 37, 12]);
        assert_eq!(got.w_k.as_ref().unwrap().shape(), &[12, 4]);
        assert_eq!(got.b_o.as_ref().unwrap().shape(), &[5]);
        same(&got.to_arrays(ctx).unwrap(), &want, &name);
    }
}

#[test]
fn the_parameter_free_tensor_backward_sums_dq_dk_dv_as_the_host_does() {
    let ctx = common::ctx();
    let x = x(2, 7, 8);
    let d_out = Array3::from_shape_fn((2, 7, 8), |(b, i, j)| ((b + i * 8 + j) as f32 * 0.3).cos());
    let op = Attention::new()
        .heads(2)
        .causal(true)
        .options(nan_fill())
        .save_for_backward(true);
    let out = op.run(ctx, Inputs::x(&x)).unwrap();
    let want = out.saved.as_ref().unwrap().backward(ctx, &d_out).unwrap();
    // Forward, backward and nothing else in one recorder and one submit.
    let mut rec = Recorder::new(ctx);
    let x_t = tensor(ctx, &x, Dtype::F32);
    let out_t = op.record(&mut rec, Inputs::x(&x_t)).unwrap();
    let saved_t = out_t.saved.as_ref().unwrap();
    let d_t = tensor(ctx, &d_out, Dtype::F32);
    let got = saved_t.record_backward(&mut rec, &d_t).unwrap();
    assert!(
        got.x.as_ref().unwrap().to_array(ctx).is_err(),
        "read before the submit"
    );
    rec.submit().unwrap();
    assert_eq!(
        bits(&out_t.context.to_array(ctx).unwrap()),
        bits(&out.context)
    );
    let got = got.to_arrays(ctx).unwrap();
    assert!(got.w_q.is_none() && got.b_o.is_none());
    same(&got, &want, "parameter-free");
}

#[test]
fn tensor_backward_errors_name_what_was_wrong() {
    let ctx = common::ctx();
    let ws = Weights::new();
    let op = Attention::new().heads(4).save_for_backward(true);
    let layer = Layer::new(ctx, op, &ws.projections()).unwrap();
    let x_t = tensor(ctx, &x(1, 5, 12), Dtype::F32);
    let saved = saved_of(layer.run(ctx, Inputs::x(&x_t)));
    let says = |r: wgpu_attention::Result<Gradients<Tensor>>, what: &str| {
        let e = r.unwrap_err().to_string();
        assert!(e.contains(what), "{e:?} should say {what:?}");
    };
    let wrong = tensor(ctx, &Array3::zeros((1, 5, 4)), Dtype::F32);
    says(saved.backward(ctx, &wrong), "without a matching forward");
    let other = Context::new().unwrap().with_tuning(false);
    let d = tensor(ctx, &Array3::zeros((1, 5, 5)), Dtype::F32);
    says(saved.backward(&other, &d), "another Context");
    if has_f16(ctx) {
        let d16 = tensor(ctx, &Array3::zeros((1, 5, 5)), Dtype::F16);
        says(saved.backward(ctx, &d16), "f32");
    }
    // dO from a recorder never submitted.
    let mut rec = Recorder::new(ctx);
    let y = layer.record(&mut rec, Inputs::x(&x_t)).unwrap();
    says(saved.backward(ctx, &y.context), "submit");
    drop(rec);
    // X of another context; X of the wrong width.
    let x_other = tensor(&other, &x(1, 5, 12), Dtype::F32);
    let e = layer.run(ctx, Inputs::x(&x_other)).unwrap_err();
    assert!(e.to_string().contains("another Context"), "{e}");
    let narrow = tensor(ctx, &x(1, 5, 7), Dtype::F32);
    assert!(layer.run(ctx, Inputs::x(&narrow)).is_err());
}

/// A CPU Adam in f32 (AdamW's decoupled decay), for one parameter.
struct CpuAdam {
    m: Vec<f32>,
    v: Vec<f32>,
}

impl CpuAdam {
    fn step(
        &mut self,
        w: &mut [f32],
        g: &[f32],
        t: i32,
        (lr, b1, b2, eps, wd): (f32, f32, f32, f32, f32),
    ) {
        let c1 = (1.0 - f64::from(b1).powi(t)) as f32;
        let c2 = (1.0 - f64::from(b2).powi(t)) as f32;
        for i in 0..w.len() {
            self.m[i] = b1 * self.m[i] + (1.0 - b1) * g[i];
            self.v[i] = b2 * self.v[i] + (1.0 - b2) * (g[i] * g[i]);
            w[i] -= lr * wd * w[i];
            w[i] -= lr * (self.m[i] / c1) / ((self.v[i] / c2).sqrt() + eps);
        }
    }
}

#[test]
fn adam_on_the_device_matches_a_cpu_adam_and_the_next_forward_uses_the_new_weights() {
    let ctx = common::ctx();
    // 23 × 23 weights: 529 elements, past one 256-wide workgroup and a multiple of nothing.
    let (d, n) = (23, 9);
    let mut host: Vec<Array2<f32>> = (0..4).map(|s| w(d, d, s + 5)).collect();
    let mut bias = Array1::from_shape_fn(d, |i| 0.05 * i as f32);
    let op = Attention::new().heads(1).causal(true);
    let mut p = Projections::new(host[0].view(), host[1].view(), host[2].view())
        .with_output(host[3].view(), None);
    p.b_v = Some(bias.view());
    let mut layer = Layer::new(ctx, op, &p).unwrap();
    // A layer's op is fixed when it is built, and a saved op's forward is the fused one
    // without weights: the gradients come from a twin of the layer that saves, at the same
    // weights (both take every update; checked below), and the layer's own forwards stay
    // plain ones.
    let mut twin = Layer::new(ctx, op.save_for_backward(true), &p).unwrap();
    let hyper = (3e-2f32, 0.8f32, 0.99f32, 1e-6f32, 0.01f32);
    let new_adam = || {
        Adam::new(hyper.0)
            .betas(hyper.1, hyper.2)
            .eps(hyper.3)
            .weight_decay(hyper.4)
    };
    let (mut adam, mut twin_adam) = (new_adam(), new_adam());
    let mut cpu: Vec<CpuAdam> = (0..5)
        .map(|i| {
            let len = if i == 4 { d } else { d * d };
            CpuAdam {
                m: vec![0.0; len],
                v: vec![0.0; len],
            }
        })
        .collect();
    let x = x(2, n, d);
    let x_t = tensor(ctx, &x, Dtype::F32);
    let d_out = Array3::from_shape_fn((2, n, d), |(b, i, j)| ((b + 2 * i + j) as f32 * 0.4).sin());
    let d_t = tensor(ctx, &d_out, Dtype::F32);
    let before = layer.run(ctx, Inputs::x(&x)).unwrap().context;
    for t in 1..=3 {
        let saved = saved_of(twin.run(ctx, Inputs::x(&x_t)));
        let grads = saved.backward(ctx, &d_t).unwrap();
        let g = grads.to_arrays(ctx).unwrap();
        let flat =
            |a: &Option<ArrayD<f32>>| a.as_ref().unwrap().iter().copied().collect::<Vec<_>>();
        let gs = [flat(&g.w_q), flat(&g.w_k), flat(&g.w_v), flat(&g.w_o)];
        for (i, (wm, gm)) in host.iter_mut().zip(&gs).enumerate() {
            cpu[i].step(wm.as_slice_mut().unwrap(), gm, t, hyper);
        }
        let gb: Vec<f32> = flat(&g.b_v);
        cpu[4].step(bias.as_slice_mut().unwrap(), &gb, t, hyper);
        layer.update(ctx, &mut adam, &grads).unwrap();
        twin.update(ctx, &mut twin_adam, &grads).unwrap();
        // The saved forward read the old weights: its backward now refuses.
        let e = saved.backward(ctx, &d_t).unwrap_err().to_string();
        assert!(e.contains("updated"), "{e}");
    }
    assert_eq!(adam.steps(), 3);
    layer.sync_host(ctx).unwrap();
    twin.sync_host(ctx).unwrap();
    assert_eq!(
        weight_bits(&twin.projections()),
        weight_bits(&layer.projections()),
        "the twin drifted"
    );
    let p = layer.projections();
    let got = [&p.w_q, &p.w_k, &p.w_v, p.w_o.as_ref().unwrap()];
    let close = |g: &ndarray::ArrayView2<'_, f32>, want: &Array2<f32>, what: &str| {
        for (a, b) in g.iter().zip(want) {
            assert!((a - b).abs() <= 1e-6 + 1e-5 * b.abs(), "{what}: {a} vs {b}");
        }
    };
    for (i, (g, want)) in got.into_iter().zip(&host).enumerate() {
        close(g, want, &format!("weight {i}"));
    }
    for (a, b) in p.b_v.unwrap().iter().zip(&bias) {
        assert!((a - b).abs() <= 1e-6 + 1e-5 * b.abs(), "b_V: {a} vs {b}");
    }
    // The next forward uses the device's new weights: it is the array API's with them.
    let after = layer.run(ctx, Inputs::x(&x)).unwrap().context;
    assert_ne!(after, before);
    let want = op
        .run(ctx, Inputs::x(&x).projections(&layer.projections()))
        .unwrap()
        .context;
    assert_eq!(after, want);
}

#[test]
fn the_mse_kernel_gives_the_gradient_and_the_loss() {
    let ctx = common::ctx();
    // 2 · 37 · 14 = 1036 elements: four full workgroups and a partial one.
    let o = Array3::from_shape_fn((2, 37, 14), |(b, i, j)| {
        ((b * 5 + i * 3 + j) as f32 * 0.1).sin()
    });
    let t = Array3::from_shape_fn((2, 37, 14), |(b, i, j)| {
        ((b + i + 2 * j) as f32 * 0.2).cos()
    });
    let mut rec = Recorder::new(ctx);
    let (o_t, t_t) = (tensor(ctx, &o, Dtype::F32), tensor(ctx, &t, Dtype::F32));
    let loss = MseLoss::record(&mut rec, &o_t, &t_t).unwrap();
    rec.submit().unwrap();
    let n = o.len() as f32;
    let want = (&o - &t).mapv(|v| 2.0 * v / n);
    let got = loss.grad.to_array(ctx).unwrap();
    for (a, b) in got.iter().zip(want.iter()) {
        assert!((a - b).abs() <= 1e-7, "{a} vs {b}");
    }
    let want: f64 = o
        .iter()
        .zip(t.iter())
        .map(|(a, b)| f64::from(a - b).powi(2))
        .sum::<f64>()
        / f64::from(n);
    let got = f64::from(loss.value(ctx).unwrap());
    assert!((got - want).abs() <= 1e-5 * want, "{got} vs {want}");
    let mut rec = Recorder::new(ctx);
    let short = tensor(ctx, &Array3::zeros((2, 37, 13)), Dtype::F32);
    assert!(MseLoss::record(&mut rec, &o_t, &short).is_err());
}

#[test]
fn a_training_loop_on_the_device_learns_and_holds_memory_flat() {
    // A context of its own: the pool's counters are per context.
    let ctx = Context::new().unwrap().with_tuning(false);
    let ws = Weights::new();
    let teacher = Layer::new(
        &ctx,
        Attention::new().heads(4).causal(true),
        &ws.projections(),
    )
    .unwrap();
    let small: Vec<Array2<f32>> = ws.w.iter().map(|w| w * 0.3).collect();
    let p = Projections::new(small[0].view(), small[1].view(), small[2].view())
        .with_output(small[3].view(), None);
    let op = Attention::new()
        .heads(4)
        .causal(true)
        .save_for_backward(true);
    let mut student = Layer::new(&ctx, op, &p).unwrap();
    let x_t = tensor(&ctx, &x(3, 11, 12), Dtype::F32);
    let target = teacher.run(&ctx, Inputs::x(&x_t)).unwrap().context;
    let mut adam = Adam::new(2e-2);
    let mut losses = Vec::new();
    let mut allocations = Vec::new();
    for _ in 0..40 {
        let mut rec = Recorder::new(&ctx);
        let y = student.record(&mut rec, Inputs::x(&x_t)).unwrap();
        let saved = y.saved.unwrap();
        let loss = MseLoss::record(&mut rec, &y.context, &target).unwrap();
        let grads = saved.record_backward(&mut rec, &loss.grad).unwrap();
        student.record_update(&mut rec, &mut adam, &grads).unwrap();
        rec.submit().unwrap();
        losses.push(loss.value(&ctx).unwrap());
        allocations.push(ctx.memory().allocations);
    }
    assert!(losses[39] < losses[0] / 4.0, "{losses:?}");
    assert_eq!(allocations[5], allocations[39], "{allocations:?}");
}

#[test]
fn bad_updates_are_errors_that_change_nothing() {
    let ctx = common::ctx();
    let ws = Weights::new();
    let p = ws.projections();
    let op = Attention::new().heads(4).save_for_backward(true);
    let mut layer = Layer::new(ctx, op, &p).unwrap();
    let x_t = tensor(ctx, &x(1, 5, 12), Dtype::F32);
    let d = tensor(ctx, &Array3::from_elem((1, 5, 5), 0.1), Dtype::F32);
    let saved = saved_of(layer.run(ctx, Inputs::x(&x_t)));
    let grads = saved.backward(ctx, &d).unwrap();
    let says = |r: wgpu_attention::Result<()>, what: &str| {
        let e = r.unwrap_err().to_string();
        assert!(e.contains(what), "{e:?} should say {what:?}");
    };
    says(
        layer.update(ctx, &mut Adam::new(f32::NAN), &grads),
        "learning rate",
    );
    says(
        layer.update(ctx, &mut Adam::new(0.1).betas(1.0, 0.9), &grads),
        "β1",
    );
    // Gradients of another layer (no biases, no W_O).
    let bare = Projections::new(ws.w[0].view(), ws.w[1].view(), ws.w[2].view());
    let other = Layer::new(ctx, op, &bare).unwrap();
    let s2 = saved_of(other.run(ctx, Inputs::x(&x_t)));
    let d2 = tensor(ctx, &Array3::from_elem((1, 5, 12), 0.1), Dtype::F32);
    let g2 = s2.backward(ctx, &d2).unwrap();
    says(layer.update(ctx, &mut Adam::new(0.1), &g2), "another layer");
    // One Adam, two layers.
    let mut adam = Adam::new(0.1);
    let mut other = other;
    other.update(ctx, &mut adam, &g2).unwrap();
    says(layer.update(ctx, &mut adam, &grads), "one Adam per layer");
    // Nothing changed: the saved forward still runs its backward.
    assert!(saved.backward(ctx, &d).is_ok());
}

#[test]
fn a_split_call_after_an_update_needs_the_host_copy_synced() {
    // 16 Ki floats per binding: an X of 2 · 800 · 12 = 19,200 floats is split and projected
    // on the CPU, with the layer's host copy of the weights.
    let ctx = common::context_with(|l| l.max_storage_buffer_binding_size = 64 << 10);
    let ws = Weights::new();
    let op = Attention::new().heads(4).causal(true).return_weights(false);
    let mut layer = Layer::new(&ctx, op, &ws.projections()).unwrap();
    let small = tensor(&ctx, &x(1, 5, 12), Dtype::F32);
    // The gradients at the layer's weights, from a twin that saves (a layer's op is fixed
    // when it is built, and this one's forwards must stay plain ones, which split).
    let twin = Layer::new(&ctx, op.save_for_backward(true), &ws.projections()).unwrap();
    let saved = saved_of(twin.run(&ctx, Inputs::x(&small)));
    let d = tensor(&ctx, &Array3::from_elem((1, 5, 5), 0.5), Dtype::F32);
    let grads = saved.backward(&ctx, &d).unwrap();
    layer.update(&ctx, &mut Adam::new(0.1), &grads).unwrap();
    let big = x(2, 800, 12);
    let e = layer.run(&ctx, Inputs::x(&big)).unwrap_err().to_string();
    assert!(e.contains("sync_host"), "{e}");
    // A call that fits runs on the device's weights without a sync.
    assert!(layer.run(&ctx, Inputs::x(&x(1, 5, 12))).is_ok());
    layer.sync_host(&ctx).unwrap();
    assert_ne!(layer.projections().w_q, ws.projections().w_q);
    let got = layer.run(&ctx, Inputs::x(&big)).unwrap().context;
    let want = op
        .run(&ctx, Inputs::x(&big).projections(&layer.projections()))
        .unwrap()
        .context;
    assert_eq!(got, want);
}

#[test]
fn an_f16_layer_trains_on_f32_master_weights() {
    let ctx = common::ctx();
    if !has_f16(ctx) {
        return;
    }
    // lr = 1e-4 against weights near 0.5, where f16's spacing is 4.9e-4: updated in place in
    // f16, every step would round away; from f32 master weights they add up.
    let (d, n, lr) = (12, 7, 1e-4f32);
    let w0: Vec<Array2<f32>> = (0..3).map(|s| w(d, d, s + 2).mapv(|v| v + 0.5)).collect();
    let p = Projections::new(w0[0].view(), w0[1].view(), w0[2].view());
    let op = Attention::new()
        .heads(2)
        .dtype(Dtype::F16)
        .save_for_backward(true);
    let mut layer = Layer::new(ctx, op, &p).unwrap();
    let mut adam = Adam::new(lr);
    let mut cpu = CpuAdam {
        m: vec![0.0; d * d],
        v: vec![0.0; d * d],
    };
    let mut master: Vec<f32> = w0[0].iter().copied().collect();
    let x_t = tensor(ctx, &x(1, n, d), Dtype::F16);
    let d_t = tensor(ctx, &Array3::from_elem((1, n, d), 0.3), Dtype::F32);
    for t in 1..=10 {
        let saved = saved_of(layer.run(ctx, Inputs::x(&x_t)));
        let grads = saved.backward(ctx, &d_t).unwrap();
        let g = grads.w_q.as_ref().unwrap().to_array(ctx).unwrap();
        let g: Vec<f32> = g.iter().copied().collect();
        cpu.step(&mut master, &g, t, (lr, 0.9, 0.999, 1e-8, 0.0));
        layer.update(ctx, &mut adam, &grads).unwrap();
    }
    layer.sync_host(ctx).unwrap();
    let got = layer.projections().w_q.to_owned();
    let start = w0[0].mapv(|v| wgpu_attention::half::f16::from_f32(v).to_f32());
    let half = |v: f32| wgpu_attention::half::f16::from_f32(v).to_f32();
    let moved = got.iter().zip(&start).filter(|(a, b)| a != b).count();
    assert!(moved > d * d / 2, "only {moved} weights moved");
    for (a, b) in got.iter().zip(&master) {
        // The master rounded to f16 (one f16 step apart where the GPU's rounding of the
        // update lands on the other side of a tie).
        assert!((a - half(*b)).abs() <= 1e-3 * b.abs(), "{a} vs {b}");
    }
}
