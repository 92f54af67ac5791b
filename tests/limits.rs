//! Problems over a device's limits, lowered artificially so this runs anywhere:
//! - over the texture limit, the subgroup family (operands in textures) says so clearly when
//!   forced, and `Kernels::Auto` hands the problem to the storage kernels;
//! - over the storage-binding limit, the problem is split by batch, then by heads, and still
//!   matches the reference; what cannot be split small enough is a clear error; a split call
//!   (on X or on Q, K, V, f16 or f32) equals the same call run whole, bit for bit;
//! - over the buffer limit, a KV cache append uploads its rows in pieces that fit.

use ndarray::{Array2, Array3};
use wgpu_attention::{
    reference, Attention, Dtype, Error, Inputs, Kernels, Limit, Mask, Options, Projections,
};

mod common;
use common::context_with;

#[test]
fn over_the_texture_limit_auto_falls_back_and_forced_subgroup_errors() {
    let ctx = context_with(|l| l.max_texture_dimension_2d = 64);
    let n = 3000;
    let x = Array2::from_shape_fn((n, 8), |(i, j)| ((i * 8 + j) as f32 * 0.37).sin());
    let options = Options::default().nan_fill(true);
    let auto = Attention::new()
        .causal(true)
        .return_weights(false)
        .options(options);
    let out = auto.run(&ctx, Inputs::x(&x)).unwrap();
    let want = reference::run(&auto, &Inputs::x(&x)).unwrap();
    let (rel, _) = reference::compare(&out.context, &want.context);
    assert!(rel < 1e-5, "rel {rel}");

    if ctx.subgroup_size().is_some() {
        let forced = auto.options(options.kernels(Kernels::Subgroup));
        match forced.run(&ctx, Inputs::x(&x)) {
            Err(e @ Error::LimitExceeded { .. }) => {
                assert!(e.to_string().contains("max_texture_dimension_2d"), "{e}")
            }
            other => panic!("expected a texture-limit error, got {other:?}"),
        }
    }
}

/// A saved forward past the texture limit, on X and on Q, K, V: `Kernels::Auto` hands it to
/// the storage kernels as it does a plain call, and its backward runs.
#[test]
fn saved_forwards_over_the_texture_limit_fall_back_too() {
    let ctx = context_with(|l| l.max_texture_dimension_2d = 64);
    let n = 3000;
    let x = Array2::from_shape_fn((n, 8), |(i, j)| ((i * 8 + j) as f32 * 0.37).sin());
    let q = ndarray::Array4::from_shape_fn((1, 1, n, 8), wave(0.13));
    let k = ndarray::Array4::from_shape_fn((1, 1, n, 8), wave(0.29));
    let v = ndarray::Array4::from_shape_fn((1, 1, n, 8), wave(0.41));
    let op = Attention::new()
        .causal(true)
        .return_weights(false)
        .options(Options::default().nan_fill(true));
    for inputs in [Inputs::x(&x), Inputs::qkv(&q, &k, &v)] {
        let out = op
            .save_for_backward(true)
            .run(&ctx, inputs.clone())
            .unwrap();
        let want = reference::run(&op, &inputs).unwrap();
        let (rel, _) = reference::compare(&out.context, &want.context);
        assert!(rel < 1e-5, "rel {rel}");
        let saved = out.saved.unwrap();
        saved.backward(&ctx, &out.context).unwrap();
    }
}

#[test]
fn over_the_storage_binding_limit_the_problem_is_split_and_still_right() {
    // 16 Ki floats per binding: 64 KiB.
    let ctx = context_with(|l| l.max_storage_buffer_binding_size = 64 << 10);
    let check = |op: Attention, inputs: Inputs<'_>| {
        let gpu = op.run(&ctx, inputs.clone()).unwrap();
        assert!(
            gpu.context.is_standard_layout(),
            "joined parts come back row-major"
        );
        let cpu = reference::run(&op, &inputs).unwrap();
        let (rel, _) = reference::compare(&gpu.context, &cpu.context);
        assert!(rel < 1e-5, "context rel {rel}");
        let (wrel, _) =
            reference::compare(gpu.weights.as_ref().unwrap(), cpu.weights.as_ref().unwrap());
        assert!(wrel < 1e-5, "weights rel {wrel}");
    };
    // Weights 3·2·64·64 = 24,576 floats: split by batch.
    let x = Array3::from_shape_fn((3, 64, 8), |(b, i, j)| {
        ((b * 7 + i * 3 + j) as f32 * 0.3).sin()
    });
    check(Attention::new().heads(2).causal(true), Inputs::x(&x));
    // One sequence, weights 4·100·100 = 40,000 floats: split by heads twice, with projections.
    let x = Array2::from_shape_fn((100, 6), |(i, j)| ((i * 6 + j) as f32 * 0.11).cos());
    let wq = Array2::from_shape_fn((6, 8), |(i, j)| ((i + j) as f32 * 0.5).sin());
    let wk = Array2::from_shape_fn((6, 8), |(i, j)| ((i * j) as f32 * 0.2).cos());
    let wv = Array2::from_shape_fn((6, 12), |(i, j)| ((i + 2 * j) as f32 * 0.3).sin());
    let (bq, bk, bv) = (
        ndarray::Array1::from_elem(8, 0.1f32),
        ndarray::Array1::from_elem(8, -0.2f32),
        ndarray::Array1::from_elem(12, 0.3f32),
    );
    let proj = Projections::new(wq.view(), wk.view(), wv.view()).with_bias(
        bq.view(),
        bk.view(),
        bv.view(),
    );
    check(Attention::new().heads(4), Inputs::x(&x).projections(&proj));
    // With an output projection, which mixes the heads: applied after the parts are joined.
    let wo = Array2::from_shape_fn((12, 5), |(i, j)| ((i * 5 + j) as f32 * 0.19).sin());
    let bo = ndarray::Array1::from_elem(5, 0.05f32);
    let with_out = proj.with_output(wo.view(), Some(bo.view()));
    check(
        Attention::new().heads(4),
        Inputs::x(&x).projections(&with_out),
    );
    // Grouped-query projections (2 K/V heads for 4 query heads), projected on the device and
    // split as sdpa splits them.
    let wk2 = Array2::from_shape_fn((6, 4), |(i, j)| ((i * j) as f32 * 0.3).cos());
    let wv2 = Array2::from_shape_fn((6, 6), |(i, j)| ((i + 3 * j) as f32 * 0.2).sin());
    let gqa = Projections::new(wq.view(), wk2.view(), wv2.view()).with_output(wo.view(), None);
    check(Attention::new().heads(4), Inputs::x(&x).projections(&gqa));
    // A layer's resident weights take the same split (projected with them on the device).
    let layer = wgpu_attention::Layer::new(&ctx, Attention::new().heads(4), &gqa).unwrap();
    let got = layer.run(&ctx, Inputs::x(&x)).unwrap();
    let want =
        reference::run(&Attention::new().heads(4), &Inputs::x(&x).projections(&gqa)).unwrap();
    assert!(reference::compare(&got.context, &want.context).0 < 1e-5);
    // Without projections the heads are column blocks of X.
    let x = Array2::from_shape_fn((100, 8), |(i, j)| ((i * 8 + j) as f32 * 0.07).sin());
    check(Attention::new().heads(4).causal(true), Inputs::x(&x));

    // One head of one sequence whose 300 × 300 weights alone exceed the limit: split into
    // blocks of query rows (causal offset per block), with projections and W_O too.
    let x = Array2::from_shape_fn((300, 8), |(i, j)| ((i * 8 + j) as f32 * 0.13).sin());
    check(Attention::new(), Inputs::x(&x));
    check(Attention::new().causal(true), Inputs::x(&x));
    let x6 = Array2::from_shape_fn((300, 6), |(i, j)| ((i * 6 + j) as f32 * 0.17).cos());
    check(
        Attention::new().causal(true),
        Inputs::x(&x6).projections(&with_out),
    );
    // The fused path has no n × n buffer, so the same problem runs whole without the weights.
    let out = Attention::new()
        .return_weights(false)
        .run(&ctx, Inputs::x(&x))
        .unwrap();
    assert_eq!(out.context.shape(), &[300, 8]);
    // What no split can help: X itself over the limit (17,000 floats), named.
    let x = Array2::from_shape_fn((4250, 4), |(i, j)| (i + j) as f32 * 0.01);
    let err = Attention::new().run(&ctx, Inputs::x(&x)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::LimitExceeded {
                limit_name: Limit::MaxStorageBufferBindingSize,
                ..
            }
        ),
        "{err:?}"
    );
}

/// A smooth test pattern over a 4-d index, varied by `salt`.
fn wave(salt: f32) -> impl Fn((usize, usize, usize, usize)) -> f32 {
    move |(a, b, c, d)| ((a * 97 + b * 31 + c * 5 + d) as f32 * salt).sin()
}

/// The same calls (those of `cases`, by index) on a device with lowered limits (split) and on
/// one with its own (whole): what each case is, and its outputs split and whole.
fn split_and_whole(
    dtype: Dtype,
    chosen: &[usize],
) -> Vec<(String, ndarray::ArrayD<f32>, ndarray::ArrayD<f32>)> {
    // 16 Ki floats per binding.
    let small = context_with(|l| l.max_storage_buffer_binding_size = 64 << 10);
    let smaller = context_with(|l| l.max_storage_buffer_binding_size = 16 << 10);
    let whole = context_with(|_| {});
    let w = |rows: usize, cols: usize, k: f32| {
        Array2::from_shape_fn((rows, cols), |(i, j)| ((i + 2 * j) as f32 * k).sin() * 0.5)
    };
    let b = |n: usize, k: f32| ndarray::Array1::from_shape_fn(n, |i| (i as f32 * k).cos() * 0.2);
    let (wq, wk, wv, wo) = (w(6, 8, 0.5), w(6, 8, 0.2), w(6, 12, 0.3), w(12, 5, 0.7));
    let (bq, bk, bv, bo) = (b(8, 0.3), b(8, 0.5), b(12, 0.7), b(5, 0.9));
    let proj = Projections::new(wq.view(), wk.view(), wv.view())
        .with_bias(bq.view(), bk.view(), bv.view())
        .with_output(wo.view(), Some(bo.view()));
    let (wk2, wv2) = (w(6, 4, 0.4), w(6, 6, 0.6));
    let gqa = Projections::new(wq.view(), wk2.view(), wv2.view()).with_output(wo.view(), None);
    // Q itself (600 · 8 floats, over 4 Ki) past the limit: projected in blocks of rows.
    let (wq4, wk4, wv4, wo4) = (w(4, 8, 0.5), w(4, 8, 0.2), w(4, 8, 0.3), w(8, 4, 0.7));
    let tall = Projections::new(wq4.view(), wk4.view(), wv4.view()).with_output(wo4.view(), None);
    let x = Array2::from_shape_fn((100, 6), |(i, j)| ((i * 6 + j) as f32 * 0.11).cos());
    let x3 = Array3::from_shape_fn((3, 64, 8), |(b, i, j)| {
        ((b * 7 + i * 3 + j) as f32 * 0.3).sin()
    });
    let x_long = Array2::from_shape_fn((300, 6), |(i, j)| ((i * 6 + j) as f32 * 0.17).cos());
    let x_tall = Array2::from_shape_fn((600, 4), |(i, j)| ((i * 4 + j) as f32 * 0.013).sin());
    let q = ndarray::Array4::from_shape_fn((2, 4, 50, 8), wave(0.013));
    let k = ndarray::Array4::from_shape_fn((2, 2, 70, 8), wave(0.021));
    let v = ndarray::Array4::from_shape_fn((2, 2, 70, 6), wave(0.017));
    let q1 = ndarray::Array4::from_shape_fn((1, 1, 200, 4), wave(0.1));
    let k1 = ndarray::Array4::from_shape_fn((1, 1, 230, 4), wave(0.3));
    let op = Attention::new().dtype(dtype);
    let cases = [
        (
            "X, projections with biases and W_O (heads)",
            op.heads(2),
            Inputs::x(&x).projections(&proj),
        ),
        (
            "X, grouped-query projections (heads)",
            op.heads(4).causal(true),
            Inputs::x(&x).projections(&gqa),
        ),
        (
            "X, no projections (batch)",
            op.heads(2).causal(true),
            Inputs::x(&x3),
        ),
        (
            "X, projections (query rows)",
            op.causal(true),
            Inputs::x(&x_long).projections(&proj),
        ),
        (
            "X, Q past the limit (rows of X)",
            op.heads(2).return_weights(false),
            Inputs::x(&x_tall).projections(&tall),
        ),
        (
            "Q, K, V (batch, then K/V heads)",
            op.causal(true),
            Inputs::qkv(&q, &k, &v),
        ),
        (
            "Q, K, V (query rows)",
            op.causal(true),
            Inputs::qkv(&q1, &k1, &k1),
        ),
    ];
    let mut out = Vec::new();
    for (i, (what, op, inputs)) in cases.into_iter().enumerate() {
        if !chosen.contains(&i) {
            continue;
        }
        let small = if i == 4 { &smaller } else { &small };
        let split = op.run(small, inputs.clone()).unwrap();
        let one = op.run(&whole, inputs).unwrap();
        out.push((format!("{what}: context"), split.context, one.context));
        if let (Some(s), Some(o)) = (split.weights, one.weights) {
            out.push((format!("{what}: weights"), s, o));
        }
    }
    out
}

#[test]
fn f16_calls_past_the_limits_equal_the_same_calls_within_them() {
    if context_with(|_| {}).require_f16().is_err() {
        return; // No f16 on this adapter.
    }
    // Bit for bit: the parts run the whole call's kernels (its plan, and the key split it
    // would take: on a GPU a part with fewer query blocks would otherwise split its keys where
    // the whole call does not, as under WGPU_ATTENTION_SANITIZE=32) on operands stored as
    // it stores them (X, the weights, Q, K, V in f16 on the device, the context in f32), and
    // every output element is computed by one invocation from the same values in the same
    // order, whichever part it falls in. Before, the projections of a split call on X ran on
    // the CPU (f32 sums in another order, Q, K, V rounded to f16 from those): its outputs
    // moved by up to ~1e-4 relative with the call's size.
    for (what, split, whole) in split_and_whole(Dtype::F16, &[0, 1, 2, 3, 4, 5, 6]) {
        assert_same(&what, &split, &whole);
    }
}

#[test]
fn f32_calls_past_the_limits_equal_the_same_calls_within_them() {
    // As under f16 (one case of each kind of split: heads on X with every projection, batch
    // and K/V heads on Q, K, V; the others are the same code in f32).
    for (what, split, whole) in split_and_whole(Dtype::F32, &[0, 5]) {
        assert_same(&what, &split, &whole);
    }
}

/// `split` and `whole` equal bit for bit, else the first place they differ.
fn assert_same(what: &str, split: &ndarray::ArrayD<f32>, whole: &ndarray::ArrayD<f32>) {
    assert_eq!(split.shape(), whole.shape(), "{what}");
    let differ = split
        .indexed_iter()
        .find(|(i, s)| s.to_bits() != whole[i.clone()].to_bits());
    if let Some((i, s)) = differ {
        panic!("{what}: split {s:e} whole {:e} at {i:?}", whole[i.clone()]);
    }
}

#[test]
fn sdpa_over_the_storage_binding_limit_is_split_and_still_right() {
    let ctx = context_with(|l| l.max_storage_buffer_binding_size = 64 << 10);
    // Weights 2·3·50·70 = 21,000 floats: split by batch, then by heads.
    let q = ndarray::Array4::from_shape_fn((2, 3, 50, 8), wave(0.013));
    let k = ndarray::Array4::from_shape_fn((2, 3, 70, 8), wave(0.021));
    let v = ndarray::Array4::from_shape_fn((2, 3, 70, 6), wave(0.017));
    for causal in [false, true] {
        let op = Attention::new().causal(causal);
        let got = op.run(&ctx, Inputs::qkv(&q, &k, &v)).unwrap();
        let want = reference::run(&op, &Inputs::qkv(&q, &k, &v)).unwrap();
        assert!(got.context.is_standard_layout());
        assert!(reference::compare(&got.context, &want.context).0 < 1e-5);
        let (w, ww) = (got.weights.unwrap(), want.weights.unwrap());
        assert!(reference::compare(&w, &ww).0 < 1e-5);
    }
    // Grouped-query (4 Q heads, 2 K/V heads), weights 4·60·80 = 19,200 floats: the split
    // halves the K/V heads and keeps each one's Q heads with it.
    let q = ndarray::Array4::from_shape_fn((1, 4, 60, 8), wave(0.019));
    let k = ndarray::Array4::from_shape_fn((1, 2, 80, 8), wave(0.023));
    let v = ndarray::Array4::from_shape_fn((1, 2, 80, 6), wave(0.029));
    let op = Attention::new().causal(true);
    let got = op.run(&ctx, Inputs::qkv(&q, &k, &v)).unwrap();
    let want = reference::run(&op, &Inputs::qkv(&q, &k, &v)).unwrap();
    assert!(reference::compare(&got.context, &want.context).0 < 1e-5);
    assert!(
        reference::compare(
            got.weights.as_ref().unwrap(),
            want.weights.as_ref().unwrap()
        )
        .0 < 1e-5
    );
    // One head of one sequence with 200 × 230 weights: blocks of query rows, causal offset
    // per block, a mask sliced with them.
    let q1 = ndarray::Array4::from_shape_fn((1, 1, 200, 4), wave(0.1));
    let k1 = ndarray::Array4::from_shape_fn((1, 1, 230, 4), wave(0.3));
    let keep = ndarray::Array2::from_shape_fn((200, 230), |(i, j)| (i * 7 + j) % 9 != 0).into_dyn();
    // Borrowed from an array that outlives the loops: `Inputs::mask` takes `&'a Mask<'a>`.
    let masks = [Mask::none(), Mask::boolean(keep.view())];
    for causal in [false, true] {
        for mask in &masks {
            let op = Attention::new().causal(causal);
            let inputs = Inputs::qkv(&q1, &k1, &k1).mask(mask);
            let got = op.run(&ctx, inputs.clone()).unwrap();
            let want = reference::run(&op, &inputs).unwrap();
            assert!(reference::compare(&got.context, &want.context).0 < 1e-5);
            let (w, ww) = (got.weights.unwrap(), want.weights.unwrap());
            assert!(reference::compare(&w, &ww).0 < 1e-5, "causal={causal}");
        }
    }
    // One query row whose weights row alone is over the limit (20,000 keys): the error.
    let q2 = ndarray::Array4::from_shape_fn((1, 1, 1, 1), wave(0.1));
    let k2 = ndarray::Array4::from_shape_fn((1, 1, 20_000, 1), wave(0.1));
    let err = Attention::new()
        .run(&ctx, Inputs::qkv(&q2, &k2, &k2))
        .unwrap_err();
    assert!(
        err.to_string().contains("max_storage_buffer_binding_size"),
        "{err}"
    );
}

#[test]
fn masked_calls_over_the_storage_binding_limit_are_split_with_their_masks() {
    let ctx = context_with(|l| l.max_storage_buffer_binding_size = 64 << 10);
    // Weights (and a full mask) of 2·4·50·70 = 28,000 floats: split by batch, then by heads;
    // the mask's parts go with them, and a broadcast mask stays whole.
    let q = ndarray::Array4::from_shape_fn((2, 4, 50, 8), wave(0.013));
    let k = ndarray::Array4::from_shape_fn((2, 2, 70, 8), wave(0.021));
    let v = ndarray::Array4::from_shape_fn((2, 2, 70, 6), wave(0.017));
    let full = ndarray::Array4::from_shape_fn((2, 4, 50, 70), |(a, b, c, d)| {
        (a * 7 + b * 5 + c * 3 + d) % 4 != 0
    })
    .into_dyn();
    let per_head =
        ndarray::Array3::from_shape_fn((4, 1, 70), |(h, _, j)| (h + j) as f32 * -0.1).into_dyn();
    let masks = [
        Mask::boolean(full.view()),
        Mask::additive(per_head.view()).with_kv_lengths(&[70, 9]),
    ];
    for mask in &masks {
        for fused in [false, true] {
            let op = Attention::new().causal(true).return_weights(!fused);
            let inputs = Inputs::qkv(&q, &k, &v).mask(mask);
            let got = op.run(&ctx, inputs.clone()).unwrap();
            let want = reference::run(&op, &inputs).unwrap();
            assert!(reference::compare(&got.context, &want.context).0 < 1e-5);
            if let Some(w) = &got.weights {
                assert!(reference::compare(w, want.weights.as_ref().unwrap()).0 < 1e-5);
            }
        }
    }
    // A masked forward on X splits the same way.
    let x = ndarray::Array3::from_shape_fn((2, 60, 8), |(a, b, c)| {
        ((a * 31 + b * 5 + c) as f32 * 0.07).sin()
    })
    .into_dyn();
    let m = ndarray::Array4::from_shape_fn((2, 2, 60, 60), |(a, b, c, d)| (a + b + c * d) % 3 != 1)
        .into_dyn();
    let op = Attention::new().heads(2);
    let mask = Mask::boolean(m.view());
    let got = op.run(&ctx, Inputs::x(&x).mask(&mask)).unwrap();
    let want = reference::run(&op, &Inputs::x(&x).mask(&mask)).unwrap();
    assert!(reference::compare(&got.context, &want.context).0 < 1e-5);
    let (w, ww) = (got.weights.unwrap(), want.weights.unwrap());
    assert!(reference::compare(&w, &ww).0 < 1e-5);
}

#[test]
fn calls_with_modifiers_over_the_storage_binding_limit_are_split_and_still_right() {
    use wgpu_attention::modifiers::{BufferData, Modifiers, Preset};
    let ctx = context_with(|l| l.max_storage_buffer_binding_size = 16 << 10);
    // Q of 2·4·150·8 = 9,600 floats over 4,096: split by batch, then by K/V heads (each with
    // its 2 query heads); then one head of 700 rows: split by query rows. The second parts
    // must see the whole call's batch, head and row indices: ALiBi reads the head, document
    // ids the batch and positions, a window the row, and so does a caller's mask.
    let ids: Vec<i32> = (0..2 * 700)
        .map(|p: usize| ((p % 700) / (40 + 30 * (p / 700))) as i32)
        .collect();
    let own = "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {\n    \
               return kv + 30u + 20u * h + 10u * b >= q;\n}\n";
    let cases = [((2, 4, 2, 150, 170), false), ((1, 1, 1, 700, 300), true)];
    for ((b, h, kvh, l, s), causal) in cases {
        let q = ndarray::Array4::from_shape_fn((b, h, l, 8), wave(0.013));
        let k = ndarray::Array4::from_shape_fn((b, kvh, s, 8), wave(0.021));
        let v = ndarray::Array4::from_shape_fn((b, kvh, s, 8), wave(0.017));
        let ids = Preset::Documents {
            ids: ids[..b * 700].to_vec(),
            n: 700,
        };
        let presets = Modifiers::new()
            .preset(Preset::Alibi(Preset::alibi_slopes(h)))
            .preset(Preset::Window {
                left: 60,
                right: 25,
            })
            .preset(ids.clone());
        // The caller's mask, its CPU form the reference's (at the whole call's indices).
        let mine = Modifiers::new()
            .mask_mod("mine.wgsl", own)
            .mask_mod_cpu(|b, h, q, kv| kv + 30 + 20 * h + 10 * b >= q)
            .buffer("unused", BufferData::F32(vec![0.0]));
        let op = Attention::new().causal(causal).return_weights(false);
        for mods in [&presets, &mine] {
            let mask = Mask::none().with_modifiers(mods);
            let inputs = Inputs::qkv(&q, &k, &v).mask(&mask);
            let got = op.run(&ctx, inputs.clone()).unwrap();
            let want = reference::run(&op, &inputs).unwrap();
            let (rel, _) = reference::compare(&got.context, &want.context);
            assert!(rel < 1e-5, "{:?}: {rel:.2e}", (b, h, l, s));
        }
    }
}

#[test]
fn modifiers_fit_webgpus_default_limits() {
    // WebGPU's defaults (8 storage buffers per stage, 16 KiB of workgroup memory, 256
    // invocations), as the browser's page runs them: every preset at once, whose data
    // the presets share in one buffer, on each family, fused and with the weights, and
    // through the backward.
    use wgpu_attention::modifiers::{Modifiers, Preset};
    let ctx = context_with(|l| {
        l.max_storage_buffers_per_shader_stage = 8;
        l.max_compute_workgroup_storage_size = 16 << 10;
        l.max_compute_invocations_per_workgroup = 256;
    });
    let (b, h, n) = (2, 4, 37);
    let [q, k, v] = common::sdpa_arrays(b, h, n, n, 16, 16);
    // One of T5's two tables: the backward takes one table's gradient per call.
    let mut mods = Modifiers::new();
    for (i, p) in common::every_preset(b, h, n).into_iter().enumerate() {
        if !matches!(p, Preset::PrefixLm(_)) && i != 6 {
            mods = mods.preset(p);
        }
    }
    let mask = Mask::none().with_modifiers(&mods);
    let inputs = Inputs::qkv(&q, &k, &v).mask(&mask);
    for kernels in [Kernels::Storage, Kernels::Subgroup] {
        for weights in [false, true] {
            let op = Attention::new()
                .causal(true)
                .return_weights(weights)
                .options(Options::default().kernels(kernels));
            let got = op.run(&ctx, inputs.clone()).unwrap();
            let want = reference::run(&op.return_weights(true), &inputs).unwrap();
            let rel = reference::compare(&got.context, &want.context).0;
            assert!(rel < 1e-5, "{kernels:?} weights={weights}: {rel:.2e}");
        }
    }
    let saved = Attention::new()
        .causal(true)
        .return_weights(false)
        .save_for_backward(true)
        .run(&ctx, inputs.clone())
        .unwrap()
        .saved
        .unwrap();
    // T5's table's gradient too (its two kernels bind the presets' one buffer).
    let g = saved.backward(&ctx, q.view()).unwrap();
    assert!(g.relative_bias.is_some());
}

#[test]
fn a_callers_buffers_past_the_storage_binding_count_are_a_clear_error() {
    use wgpu_attention::modifiers::{BufferData, Modifiers};
    let ctx = context_with(|l| l.max_storage_buffers_per_shader_stage = 8);
    let [q, k, v] = common::sdpa_arrays(1, 2, 9, 9, 8, 8);
    // Four buffers of the caller's beside the kernel's own six: one error line naming the
    // limit, not wgpu's bare validation error.
    let mut mods = Modifiers::new().score_mod(
        "four.wgsl",
        "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    \
         return score + m0[0] + m1[0] + m2[0] + m3[0];\n}\n",
    );
    for name in ["m0", "m1", "m2", "m3"] {
        mods = mods.buffer(name, BufferData::F32(vec![0.0]));
    }
    let mask = Mask::none().with_modifiers(&mods);
    let op = Attention::new()
        .return_weights(false)
        .options(Options::default().kernels(Kernels::Storage));
    let err = op
        .run(&ctx, Inputs::qkv(&q, &k, &v).mask(&mask))
        .unwrap_err();
    assert!(matches!(err, Error::LimitExceeded { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("max_storage_buffers_per_shader_stage"),
        "{err}"
    );
    // One buffer fits.
    let one = Modifiers::new()
        .score_mod(
            "one.wgsl",
            "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    \
             return score + a[0];\n}\n",
        )
        .buffer("a", BufferData::F32(vec![0.0]));
    let mask = Mask::none().with_modifiers(&one);
    op.run(&ctx, Inputs::qkv(&q, &k, &v).mask(&mask)).unwrap();
}

#[test]
fn an_append_larger_than_one_buffer_is_uploaded_in_pieces() {
    use ndarray::{s, Array4};
    use wgpu_attention::{Decoder, KvCache, KvCacheSpec};
    // 4 KiB buffers: K's 2 · 2 · 150 rows of 32 bytes (19 KiB) go in 5 pieces, V's (d 6, padded
    // to 8) too; in f16 in 3.
    let ctx = context_with(|l| {
        l.max_buffer_size = 4 << 10;
        l.max_storage_buffer_binding_size = 4 << 10;
        l.max_uniform_buffer_binding_size = 4 << 10;
    });
    let f = |salt: usize| {
        move |(a, b, c, d): (usize, usize, usize, usize)| {
            (((a * 31 + b * 17 + c * 7 + d) * (salt + 2)) as f32 * 0.013).sin()
        }
    };
    let (n, d, dv) = (150, 8, 6);
    let q = Array4::from_shape_fn((2, 2, n, d), f(1));
    let k = Array4::from_shape_fn((2, 2, n, d), f(2));
    let v = Array4::from_shape_fn((2, 2, n, dv), f(3));
    let last = s![.., .., n - 1.., ..];
    let op = Attention::new().causal(true);
    for dtype in [Dtype::F32, Dtype::F16] {
        let spec = KvCacheSpec::new(n, 2, 2, d, dv).dtype(dtype);
        let mut cache = KvCache::new(&ctx, spec).unwrap();
        let (k, v) = match dtype {
            Dtype::F32 => {
                cache.append(&ctx, k.view(), v.view()).unwrap();
                (k.clone(), v.clone())
            }
            Dtype::F16 => {
                let h = |a: &Array4<f32>| a.mapv(half::f16::from_f32);
                let (kh, vh) = (h(&k), h(&v));
                cache.append(&ctx, kh.view(), vh.view()).unwrap();
                let w = |a: Array4<half::f16>| a.mapv(half::f16::to_f32);
                (w(kh), w(vh))
            }
        };
        let want = reference::run(&op, &Inputs::qkv(&q, &k, &v))
            .unwrap()
            .context;
        let want = want.slice(s![.., .., n - 1.., ..]).to_owned();
        let got = Decoder::new()
            .nan_fill(true)
            .step(&ctx, &cache, q.slice(last))
            .unwrap();
        let (rel, _) = reference::compare(&got.into_dyn(), &want.into_dyn());
        assert!(rel < 1e-5, "{dtype}: rel {rel:e}");
    }
}
