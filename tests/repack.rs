//! A `Layer` keeps its packed weights (`W_Q | W_K | W_V` in one, and on the subgroup family
//! that weight and `W_O` in the subgroup matmul's texture layout) through Adam updates: each
//! update writes them again on the device, in the update's own encoder, so every later forward
//! still runs one projection matmul and packs no weight, and its results are those of a fresh
//! layer built from the updated weights, bit for bit (both families, f32 and f16, biases
//! present and absent, widths that are and are not multiples of 4).

mod common;

use ndarray::{Array1, Array2, Array3};
use wgpu_attention::{
    Adam, Attention, Context, Dtype, Inputs, Kernels, Layer, Options, Projections, Recorder, Tensor,
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

/// A layer's weights: `[W_Q, W_K, W_V, W_O]` and the biases `[b_Q, b_K, b_V, b_O]` it has.
struct Weights {
    w: [Array2<f32>; 4],
    b: [Option<Array1<f32>>; 4],
    heads: usize,
}

impl Weights {
    /// d = 12 in, W_Q 8 wide, W_K 4, W_V 6 (two K/V heads for four query heads: W_QKV 18
    /// wide, no multiple of 4), W_O 12 → 5; every bias but b_K (its part of the packed bias
    /// stays zero).
    fn grouped() -> Self {
        let bias = |n: usize| Some(Array1::from_shape_fn(n, |i| 0.1 * i as f32 - 0.2));
        Weights {
            w: [w(12, 8, 1), w(12, 4, 2), w(12, 6, 3), w(12, 5, 4)],
            b: [bias(8), None, bias(6), bias(5)],
            heads: 4,
        }
    }

    /// d = 16, every projection 16 wide (the packs' aligned vec4 path), every bias.
    fn square() -> Self {
        let bias = |s: f32| Some(Array1::from_shape_fn(16, |i| s * (i as f32 * 0.3).sin()));
        Weights {
            w: [w(16, 16, 5), w(16, 16, 6), w(16, 16, 7), w(16, 16, 8)],
            b: [bias(0.1), bias(-0.2), bias(0.3), bias(0.05)],
            heads: 2,
        }
    }

    fn projections(&self) -> Projections<'_> {
        let [q, k, v, o] = &self.w;
        fn view(b: &Option<Array1<f32>>) -> Option<ndarray::ArrayView1<'_, f32>> {
            b.as_ref().map(|b| b.view())
        }
        let mut p =
            Projections::new(q.view(), k.view(), v.view()).with_output(o.view(), view(&self.b[3]));
        p.b_q = view(&self.b[0]);
        p.b_k = view(&self.b[1]);
        p.b_v = view(&self.b[2]);
        p
    }
}

fn has_f16(ctx: &Context) -> bool {
    ctx.device()
        .features()
        .contains(wgpu_attention::wgpu::Features::SHADER_F16)
}

fn bits<D: ndarray::Dimension>(a: &ndarray::Array<f32, D>) -> Vec<u32> {
    a.iter().map(|v| v.to_bits()).collect()
}

/// Every weight and bias, as bits.
fn weight_bits(p: &Projections<'_>) -> Vec<u32> {
    let ws = [Some(p.w_q), Some(p.w_k), Some(p.w_v), p.w_o];
    let bs = [p.b_q, p.b_k, p.b_v, p.b_o];
    let ws = ws.iter().flatten().flat_map(|w| w.iter());
    let bs = bs.iter().flatten().flat_map(|b| b.iter());
    ws.chain(bs).map(|v| v.to_bits()).collect()
}

/// The layer that saves for the backward beside `layer`: its op with
/// `save_for_backward(true)`, built from the same weights. A layer's op is fixed when it is
/// built and a saved op's forward is always the fused one without weights, so the layer whose
/// plain forwards these tests check cannot make the gradients itself: its twin does, and both
/// take every update, so they stay at the same weights (checked).
fn twin(ctx: &Context, layer: &Layer) -> Layer {
    let op = layer.op().save_for_backward(true);
    Layer::new(ctx, op, &layer.projections()).unwrap()
}

/// A training step in one recorder: the saved forward (of `twin`, at `layer`'s weights), its
/// backward from a fixed dO, and the updates of both (each repacking after the forward read
/// the packed copies).
fn train(
    ctx: &Context,
    [layer, twin]: [&mut Layer; 2],
    [adam, twin_adam]: [&mut Adam; 2],
    x: &Tensor,
    d_out: &Tensor,
) {
    let mut rec = Recorder::new(ctx);
    let out = twin.record(&mut rec, Inputs::x(x)).unwrap();
    let saved = out.saved.expect("a saved forward carries its Saved");
    let grads = saved.record_backward(&mut rec, d_out).unwrap();
    twin.record_update(&mut rec, twin_adam, &grads).unwrap();
    layer.record_update(&mut rec, adam, &grads).unwrap();
    rec.submit().unwrap();
}

#[test]
fn after_updates_a_layer_forward_is_a_fresh_layers_on_the_updated_weights_bit_for_bit() {
    let ctx = common::ctx();
    let mut failures = Vec::new();
    let mut dtypes = vec![Dtype::F32];
    if has_f16(ctx) {
        dtypes.push(Dtype::F16);
    }
    for ws in [Weights::grouped(), Weights::square()] {
        let d = ws.w[0].nrows();
        let d_out = ws.w[3].ncols();
        let x_host = x(2, 7, d);
        let dy = Array3::from_shape_fn((2, 7, d_out), |(b, i, j)| {
            ((b + 2 * i + j) as f32 * 0.4).sin()
        });
        let d_t = Tensor::from_array(ctx, dy.view().into_dyn(), Dtype::F32).unwrap();
        let families = [
            Attention::new(),
            Attention::new().options(Options::default().kernels(Kernels::Storage)),
        ];
        // With the weights returned (unfused) and without (the fused kernels).
        let bases = families
            .iter()
            .flat_map(|f| [f.return_weights(true), f.return_weights(false)]);
        for base in bases {
            for &dtype in &dtypes {
                let op = base.heads(ws.heads).causal(true).dtype(dtype);
                let mut layer = Layer::new(ctx, op, &ws.projections()).unwrap();
                let mut twin = twin(ctx, &layer);
                let x_t = Tensor::from_array(ctx, x_host.view().into_dyn(), dtype).unwrap();
                let mut adam = Adam::new(1e-2).weight_decay(0.01);
                let mut twin_adam = Adam::new(1e-2).weight_decay(0.01);
                let before = layer.run(ctx, Inputs::x(&x_host)).unwrap().context;
                let mut done = 0;
                for steps in [1, 3] {
                    while done < steps {
                        let layers = [&mut layer, &mut twin];
                        train(ctx, layers, [&mut adam, &mut twin_adam], &x_t, &d_t);
                        done += 1;
                    }
                    let got = layer.run(ctx, Inputs::x(&x_host)).unwrap().context;
                    layer.sync_host(ctx).unwrap();
                    twin.sync_host(ctx).unwrap();
                    let (t, l) = (twin.projections(), layer.projections());
                    assert_eq!(weight_bits(&t), weight_bits(&l), "{op:?}: the twin drifted");
                    let fresh = Layer::new(ctx, op, &layer.projections()).unwrap();
                    let want = fresh.run(ctx, Inputs::x(&x_host)).unwrap().context;
                    let what = format!("d={d} {op:?} after {steps} updates");
                    assert_ne!(
                        bits(&got),
                        bits(&before),
                        "{what}: the weights did not move"
                    );
                    if bits(&got) != bits(&want) {
                        let max = (&got - &want).iter().fold(0f32, |m, v| m.max(v.abs()));
                        failures.push(format!("{what}: max |Δ| {max:e}"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn after_an_update_a_layer_call_still_runs_one_projection_matmul_and_packs_only_x() {
    // Its own context: profiling records the passes of whichever call ran last on it.
    let ctx = &Context::new().unwrap().with_tuning(false);
    let ws = Weights::square();
    let x_host = x(1, 9, 16);
    let dy = Array3::from_shape_fn((1, 9, 16), |(_, i, j)| ((i + j) as f32 * 0.3).cos());
    let d_t = Tensor::from_array(ctx, dy.view().into_dyn(), Dtype::F32).unwrap();
    let x_t = Tensor::from_array(ctx, x_host.view().into_dyn(), Dtype::F32).unwrap();
    for family in Kernels::available(ctx) {
        let op = Attention::new()
            .heads(2)
            .options(Options::default().kernels(family));
        let mut layer = Layer::new(ctx, op, &ws.projections()).unwrap();
        let built = common::passes(ctx, || drop(layer.run(ctx, Inputs::x(&x_host)).unwrap()));
        let mut adam = Adam::new(1e-2);
        // The gradients at the layer's weights, from its saving twin (see `twin`).
        let out = twin(ctx, &layer).run(ctx, Inputs::x(&x_t)).unwrap();
        let grads = out.saved.unwrap().backward(ctx, &d_t).unwrap();
        let update = common::passes(ctx, || layer.update(ctx, &mut adam, &grads).unwrap());
        let after = common::passes(ctx, || drop(layer.run(ctx, Inputs::x(&x_host)).unwrap()));
        let all = format!("{family}: built {built:?}, update {update:?}, after {after:?}");
        // The same passes as before any update (Q, K and V in one matmul; on the subgroup
        // family no weight packed), the weights' textures having been packed again by the
        // update (two packs after its eight Adam steps). Without the repack: three
        // projection matmuls, and on the subgroup family W_O packed per call.
        assert_eq!(after, built, "{all}");
        assert_eq!(common::count(&update, "adam"), 8, "{all}");
        if family == Kernels::Subgroup {
            assert_eq!(common::count(&update, "pack"), 2, "{all}");
        }
    }
}
