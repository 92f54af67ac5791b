//! The cooperative-matrix (tensor-core) kernels: against the f64 reference wherever the
//! adapter has `Features::EXPERIMENTAL_COOPERATIVE_MATRIX` (odd sizes, causal, f16, with and
//! without the weights), and elsewhere (lavapipe) a clear `Unsupported` error when they are
//! forced, never a panic. That their WGSL validates is a unit test (`cargo test --lib coop`),
//! which runs without the feature.

mod common;

use ndarray::{Array2, Array4, ArrayD, IxDyn};
use wgpu_attention::internals::{FlashVariant, MatmulVariant};
use wgpu_attention::verify::{self, Case, CaseData, Expected, MaskData};
use wgpu_attention::{
    reference, Attention, Dims, Dtype, Error, Inputs, Kernels, Modifiers, Options, Projections,
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

/// The case of `coop_kernels_match…` at these sizes as `verify` describes it: X
/// `(batch, n, d)` of [`x`], two heads, `W_Q`, `W_K`, `W_V` and `W_O` of [`w`], no biases.
fn coop_case(batch: usize, n: usize, d: usize, causal: bool, weights: bool) -> (Case, CaseData) {
    let case = Case::new(n, d, d, d)
        .batch(Some(batch))
        .heads(2)
        .causal(causal)
        .out_proj(Some(d))
        .kernels(Kernels::Coop)
        .fused(!weights);
    let data = CaseData {
        x: x(batch, n, d),
        weights: Some((w(d, d, 1), w(d, d, 2), w(d, d, 3))),
        biases: None,
        output: Some((w(d, d, 4), None)),
        mask: MaskData::None,
        qkv: None,
        mods: Modifiers::new(),
    };
    (case, data)
}

/// `a` with its rows (the last axis's) moved down by one, the last to the top.
fn rows_moved(a: &ArrayD<f32>) -> ArrayD<f32> {
    let width = a.shape().last().copied().unwrap_or(1).max(1);
    let flat: Vec<f32> = a.iter().copied().collect();
    let rows = flat.len() / width;
    let moved = (0..rows)
        .flat_map(|r| {
            let from = (r + rows - 1) % rows;
            flat[from * width..(from + 1) * width].iter().copied()
        })
        .collect();
    ArrayD::from_shape_vec(IxDyn(a.shape()), moved).expect("same length")
}

/// Against the reference and bound `verify` holds the case to (`verify::Expected`): an f16
/// call's reference on what it holds, an f32 call's the f32 reference with the bound of the
/// f16 roundings its cooperative matrices make (both stated in `src/verify/f16.rs`), on two
/// sets of arrays at each size: those of [`x`] and [`w`], and `verify`'s drawn from a seed.
/// On the drawn ones a wrong answer fails too: the context 10% off the reference, and with
/// its rows moved. (The arrays of [`x`] and [`w`] are of rank 2: where the context cancels
/// through `W_O`, at n = 130 unmasked, the result is ~1e-4 of its terms and the bound of the
/// context's f16 rounding before `W_O`, element by element, is several times the result:
/// right answers must meet it, no wrong one is asked to fail it.)
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
    let mut sabotaged = 0;
    for (batch, n, d) in [(1, 1, 8), (2, 7, 24), (1, 37, 40), (2, 130, 72)] {
        for causal in [false, true] {
            for weights in [false, true] {
                for dtype in [Dtype::F32, Dtype::F16] {
                    let (case, waves) = coop_case(batch, n, d, causal, weights);
                    let case = case.dtype(dtype);
                    let drawn = case.data(n as u64);
                    for (data, wrong) in [(waves, false), (drawn, true)] {
                        let what = format!("{shape} {case} (drawn: {wrong})");
                        let expected = Expected::new(ctx, &case, &data).unwrap();
                        let got =
                            pollster::block_on(verify::run_gpu(ctx, &case.op(), &data)).unwrap();
                        let r = expected.check(&got.context, got.weights.as_ref());
                        eprintln!("{r}");
                        assert!(r.passed(), "{what}: {r}");
                        assert_eq!(got.weights.is_some(), weights, "{what}");
                        if !wrong {
                            continue;
                        }
                        let reference = &expected.reference().context;
                        let off = reference.mapv(|v| v as f32 * 0.1) + &got.context;
                        let mut wrong = vec![("10% off", off)];
                        if n > 1 {
                            wrong.push(("rows moved", rows_moved(&got.context)));
                        }
                        for (how, context) in wrong {
                            let r = expected.check(&context, got.weights.as_ref());
                            assert!(!r.passed(), "{what}: {how} passes: {r}");
                            sabotaged += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(sabotaged, 56);
}

/// `flash_coop` alone (Q, K and V given, f16 storage) at head widths 64 and 128, over keys
/// past several tiles, causal and not: its fast K/V staging, its shared softmax and its
/// lazy rescale, on logits that grow with the key (so each tile raises rows' maxes by more
/// than its threshold) against the reference on the same f16-rounded inputs.
#[test]
fn flash_coop_matches_the_reference_at_wide_heads() {
    let ctx = common::ctx();
    if ctx.coop_shape().is_none() {
        eprintln!("skipped: no cooperative-matrix shape (the test above says why)");
        return;
    }
    let f16 = |x: f32| half::f16::from_f32(x).to_f32();
    for (n, d) in [(100, 64), (77, 128)] {
        // Q and K the same waves (logits up to ~√d·(1 + 0.04·j) in both signs), K's growing
        // with the key: each tile of 32 raises a row's max by ~15 (log2 units).
        let wave = |salt: usize, ramp: f32| {
            Array4::from_shape_fn((1, 2, n, d), |(_, h, i, c)| {
                let x = (((h * 7 + i * 13 + c * 5) * salt) as f32 * 0.071).sin();
                f16(x * (1.0 + ramp * i as f32))
            })
        };
        let (q, k, v) = (wave(1, 0.0).mapv(|x| 2.0 * x), wave(1, 0.04), wave(3, 0.0));
        for causal in [false, true] {
            let base = Attention::new()
                .causal(causal)
                .return_weights(false)
                .options(Options::default().nan_fill(true));
            let inputs = Inputs::qkv(&q, &k, &v);
            let want = reference::run(&base, &inputs).unwrap();
            let op = base
                .options(
                    Options::default()
                        .flash_variant(FlashVariant::Coop)
                        .nan_fill(true),
                )
                .dtype(Dtype::F16);
            let plan = op.plan(ctx, &Dims::new(&op, &inputs).unwrap()).unwrap();
            assert!(plan.to_string().contains("flash-coop"), "{plan}");
            let got = op.run(ctx, inputs.clone()).unwrap();
            let (rel, max) = reference::compare(&got.context, &want.context);
            assert!(
                rel < 5e-3,
                "n={n} d={d} causal={causal}: rel {rel:e}, max abs {max:e}"
            );
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
