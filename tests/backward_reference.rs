//! The f64 backward reference (`reference::backward`, on Q, K, V and on X) against central
//! finite differences of the f64 forward reference, on every option the forward takes (the
//! modifier presets included); and its errors. No GPU needed.
//!
//! The loss is `ℓ = Σ dO ∘ output` for a random `dO`, so `∂ℓ/∂input` is exactly what the
//! backward returns for that `dO`. Each input element `x` is moved to the f32 values `x ± h`
//! and the difference quotient divides by their exact distance, so f32 inputs lose nothing.

use ndarray::{Array2, Array4, ArrayD, ArrayView2, Ix2, IxDyn};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use wgpu_attention::modifiers::{Modifiers, Preset};
use wgpu_attention::{reference, Attention, Error, Gradients, Inputs, Mask, Options, Projections};

/// The finite-difference step.
const H: f32 = 1e-3;
/// Relative error (`‖analytic − numeric‖ / ‖numeric‖`) allowed: central differences with
/// `h = 1e-3` are good to ~1e-7 here; a wrong sign or factor is off by O(1).
const TOL: f64 = 1e-5;

fn random(shape: &[usize], seed: u64) -> ArrayD<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    ArrayD::from_shape_simple_fn(IxDyn(shape), || rng.random_range(-1.0f32..1.0))
}

/// `∂loss/∂params[p]` by central differences, for every element.
fn numeric_grad(
    params: &[ArrayD<f32>],
    p: usize,
    loss: &dyn Fn(&[ArrayD<f32>]) -> f64,
) -> ArrayD<f64> {
    let mut moved = params.to_vec();
    let mut grad = ArrayD::<f64>::zeros(params[p].raw_dim());
    let indices: Vec<IxDyn> = params[p].indexed_iter().map(|(i, _)| i).collect();
    for idx in indices {
        let x0 = params[p][&idx];
        let (plus, minus) = (x0 + H, x0 - H);
        moved[p][&idx] = plus;
        let up = loss(&moved);
        moved[p][&idx] = minus;
        let down = loss(&moved);
        moved[p][&idx] = x0;
        grad[&idx] = (up - down) / (f64::from(plus) - f64::from(minus));
    }
    grad
}

fn norm(a: &ArrayD<f64>) -> f64 {
    a.iter().map(|v| v * v).sum::<f64>().sqrt()
}

/// The analytic gradient agrees with the numeric one to [`TOL`], relative to the numeric
/// one's norm (which must not be negligible, or the check proves nothing).
fn assert_agrees(name: &str, analytic: &ArrayD<f64>, numeric: &ArrayD<f64>) {
    assert_eq!(analytic.shape(), numeric.shape(), "{name}: shape");
    assert!(analytic.iter().all(|v| v.is_finite()), "{name}: not finite");
    if name == "db_K" {
        // b_K adds q_i·b_K to every score of row i: softmax does not see it, so ∂ℓ/∂b_K is
        // exactly 0 (each row of dS sums to 0).
        assert!(norm(numeric) < 1e-9, "{name}: numeric {numeric}");
        assert!(norm(analytic) < 1e-12, "{name}: analytic {analytic}");
        return;
    }
    let scale = norm(numeric);
    assert!(scale > 1e-3, "{name}: numeric gradient ~0 ({scale:e})");
    let err = norm(&(analytic - numeric)) / scale;
    assert!(
        err < TOL,
        "{name}: relative error {err:e}\nanalytic {analytic}\nnumeric {numeric}"
    );
}

fn loss(output: &ArrayD<f64>, d_o: &ArrayD<f32>) -> f64 {
    output
        .iter()
        .zip(d_o.iter())
        .map(|(o, g)| o * f64::from(*g))
        .sum()
}

/// `reference::backward` against finite differences of `reference::run` for Q, K and V of
/// the given shapes. Returns the analytic gradients for further checks.
fn check_sdpa(
    op: Attention,
    [b, h, h_kv, l, s, e, ev]: [usize; 7],
    mask: &Mask<'_>,
) -> Gradients<ArrayD<f64>> {
    let params = vec![
        random(&[b, h, l, e], 1),
        random(&[b, h_kv, s, e], 2),
        random(&[b, h_kv, s, ev], 3),
    ];
    let d_o = random(&[b, h, l, ev], 4);
    let f = |p: &[ArrayD<f32>]| {
        let out = reference::run(&op, &Inputs::qkv(&p[0], &p[1], &p[2]).mask(mask));
        loss(&out.unwrap().context, &d_o)
    };
    let inputs = Inputs::qkv(&params[0], &params[1], &params[2]).mask(mask);
    let g = reference::backward(&op, &inputs, d_o.view()).unwrap();
    for (i, (name, analytic)) in [("dQ", &g.q), ("dK", &g.k), ("dV", &g.v)]
        .into_iter()
        .enumerate()
    {
        let numeric = numeric_grad(&params, i, &f);
        assert_agrees(name, analytic.as_ref().unwrap(), &numeric);
    }
    g
}

#[test]
fn sdpa_gradients_match_finite_differences_on_odd_sizes_with_a_custom_scale() {
    check_sdpa(Attention::new(), [2, 3, 3, 3, 5, 3, 4], &Mask::none());
    check_sdpa(
        Attention::new().scale(0.8),
        [1, 1, 1, 7, 2, 5, 1],
        &Mask::none(),
    );
}

#[test]
fn sdpa_gradients_match_finite_differences_causal_with_l_not_s() {
    let causal = Attention::new().causal(true);
    // Queries past S see every key; with L < S the last keys are seen by no one.
    check_sdpa(causal, [1, 2, 2, 5, 3, 3, 2], &Mask::none());
    check_sdpa(causal, [2, 1, 1, 2, 4, 3, 3], &Mask::none());
}

#[test]
fn sdpa_gradients_match_finite_differences_with_masks_lengths_and_grouped_heads() {
    // A boolean (L, S) mask with row 1 fully masked, key lengths, 4 Q heads on 2 K/V heads.
    let keep = Array2::from_shape_fn((3, 5), |(i, j)| i != 1 && (i + j) % 3 != 0).into_dyn();
    let mask = Mask::boolean(keep.view()).with_kv_lengths(&[5, 2]);
    check_sdpa(Attention::new(), [2, 4, 2, 3, 5, 3, 2], &mask);
    // A float (batch, 1, L, S) mask with biases and -inf, multi-query (one K/V head), causal.
    let bias = Array4::from_shape_fn((2, 1, 4, 4), |(b, _, i, j)| match (b + i + 2 * j) % 4 {
        0 => f32::NEG_INFINITY,
        1 => 0.7,
        2 => -1.3,
        _ => 0.0,
    })
    .into_dyn();
    let op = Attention::new().causal(true).scale(1.7);
    check_sdpa(op, [2, 3, 1, 4, 4, 2, 3], &Mask::additive(bias.view()));
}

#[test]
fn sdpa_rows_with_nothing_to_attend_to_have_zero_gradients() {
    // Sequence 1 attends to no key at all; in sequence 0, query row 2 is masked out.
    let keep = Array4::from_shape_fn((2, 1, 3, 4), |(_, _, i, _)| i != 2).into_dyn();
    let mask = Mask::boolean(keep.view()).with_kv_lengths(&[4, 0]);
    let g = check_sdpa(Attention::new(), [2, 2, 1, 3, 4, 3, 3], &mask);
    let (q, k, v) = (g.q.unwrap(), g.k.unwrap(), g.v.unwrap());
    assert!(q.iter().chain(&k).chain(&v).all(|v| v.is_finite()));
    assert!(q
        .slice(ndarray::s![1, .., .., ..])
        .iter()
        .all(|&v| v == 0.0));
    assert!(k
        .slice(ndarray::s![1, .., .., ..])
        .iter()
        .all(|&v| v == 0.0));
    assert!(v
        .slice(ndarray::s![1, .., .., ..])
        .iter()
        .all(|&v| v == 0.0));
    assert!(q.slice(ndarray::s![0, .., 2, ..]).iter().all(|&v| v == 0.0));
}

/// Which inputs a layer has; the parameters are `[X, W_Q, W_K, W_V, b_Q, b_K, b_V, W_O, b_O]`
/// with the absent ones left out.
#[derive(Clone, Copy)]
struct Layer {
    x: [usize; 3],
    batched: bool,
    d_k: usize,
    d_v: usize,
    proj: bool,
    bias: bool,
    d_out: Option<usize>,
    b_o: bool,
    /// Query heads per K/V head: W_K and W_V this many times narrower than W_Q (GQA).
    kv_ratio: usize,
}

impl Layer {
    fn params(&self) -> Vec<(&'static str, ArrayD<f32>)> {
        let [batch, n, d] = self.x;
        let x = if self.batched {
            random(&[batch, n, d], 10)
        } else {
            random(&[n, d], 10)
        };
        let mut p = vec![("dX", x)];
        if self.proj {
            p.push(("dW_Q", random(&[d, self.d_k], 11)));
            let (d_kv, dv_kv) = (self.d_k / self.kv_ratio, self.d_v / self.kv_ratio);
            p.push(("dW_K", random(&[d, d_kv], 12)));
            p.push(("dW_V", random(&[d, dv_kv], 13)));
            if self.bias {
                p.push(("db_Q", random(&[self.d_k], 14)));
                p.push(("db_K", random(&[d_kv], 15)));
                p.push(("db_V", random(&[dv_kv], 16)));
            }
            if let Some(d_out) = self.d_out {
                p.push(("dW_O", random(&[self.d_v, d_out], 17)));
                if self.b_o {
                    p.push(("db_O", random(&[d_out], 18)));
                }
            }
        }
        p
    }

    /// Runs `f` on the inputs of X and the projections held in `p` (laid out as
    /// [`Layer::params`]), masked by `mask`.
    fn with<R>(&self, p: &[ArrayD<f32>], mask: &Mask<'_>, f: impl FnOnce(&Inputs<'_>) -> R) -> R {
        if !self.proj {
            return f(&Inputs::x(&p[0]).mask(mask));
        }
        let w =
            |i: usize| -> ArrayView2<'_, f32> { p[i].view().into_dimensionality::<Ix2>().unwrap() };
        let v = |i: usize| p[i].view().into_dimensionality().unwrap();
        let mut proj = Projections::new(w(1), w(2), w(3));
        let mut next = 4;
        if self.bias {
            proj = proj.with_bias(v(4), v(5), v(6));
            next = 7;
        }
        if self.d_out.is_some() {
            let b_o = self.b_o.then(|| v(next + 1));
            proj = proj.with_output(w(next), b_o);
        }
        f(&Inputs::x(&p[0]).projections(&proj).mask(mask))
    }
}

fn check_layer(op: Attention, layer: Layer, mask: &Mask<'_>) {
    let named = layer.params();
    let params: Vec<ArrayD<f32>> = named.iter().map(|(_, a)| a.clone()).collect();
    let out_shape = layer.with(&params, mask, |inputs| {
        reference::run(&op, inputs)
            .unwrap()
            .context
            .shape()
            .to_vec()
    });
    let d_o = random(&out_shape, 19);
    let f = |p: &[ArrayD<f32>]| {
        layer.with(p, mask, |inputs| {
            loss(&reference::run(&op, inputs).unwrap().context, &d_o)
        })
    };
    let g = layer
        .with(&params, mask, |inputs| {
            reference::backward(&op, inputs, d_o.view())
        })
        .unwrap();
    let analytic: Vec<ArrayD<f64>> = [
        Some(g.x.expect("dX is always given")),
        g.w_q,
        g.w_k,
        g.w_v,
        g.b_q,
        g.b_k,
        g.b_v,
        g.w_o,
        g.b_o,
    ]
    .into_iter()
    .flatten()
    .collect();
    assert_eq!(analytic.len(), params.len(), "one gradient per input given");
    for (i, ((name, _), a)) in named.iter().zip(&analytic).enumerate() {
        assert_agrees(name, a, &numeric_grad(&params, i, &f));
    }
}

const PLAIN: Layer = Layer {
    x: [2, 3, 4],
    batched: true,
    d_k: 6,
    d_v: 4,
    proj: true,
    bias: false,
    d_out: None,
    b_o: false,
    kv_ratio: 1,
};

#[test]
fn layer_without_weights_sums_the_three_uses_of_x() {
    let layer = Layer {
        proj: false,
        ..PLAIN
    };
    check_layer(Attention::new().heads(2).causal(true), layer, &Mask::none());
    let one = Layer {
        x: [1, 5, 3],
        batched: false,
        ..layer
    };
    check_layer(Attention::new().scale(0.6), one, &Mask::none());
}

#[test]
fn layer_gradients_with_biases_heads_masks_and_lengths() {
    let layer = Layer {
        bias: true,
        ..PLAIN
    };
    // Row 0 of every head and sequence is fully masked; sequence 1 sees its first 2 keys.
    let keep = Array2::from_shape_fn((3, 3), |(i, j)| i != 0 && i + j != 3).into_dyn();
    let mask = Mask::boolean(keep.view()).with_kv_lengths(&[3, 2]);
    check_layer(Attention::new().heads(2), layer, &mask);
    let bias = Array2::from_shape_fn((3, 3), |(i, j)| 0.5 * i as f32 - 0.7 * j as f32).into_dyn();
    check_layer(
        Attention::new().heads(2).causal(true),
        layer,
        &Mask::additive(bias.view()),
    );
}

#[test]
fn layer_gradients_through_the_output_projection() {
    let with_bo = Layer {
        x: [1, 5, 3],
        batched: false,
        bias: true,
        d_out: Some(5),
        b_o: true,
        ..PLAIN
    };
    check_layer(
        Attention::new().heads(2).causal(true).scale(0.9),
        with_bo,
        &Mask::none(),
    );
    // W_O without b_O, no projection biases, three heads of widths 2 and 1.
    let no_bo = Layer {
        d_k: 6,
        d_v: 3,
        d_out: Some(2),
        ..PLAIN
    };
    check_layer(Attention::new().heads(3), no_bo, &Mask::none());
}

#[test]
fn layer_gradients_with_grouped_query_projections() {
    // Four query heads of width 2 sharing two K/V heads: W_K is (4, 4), W_V (4, 4) for a
    // context 8 wide; a shared K/V weight's gradient sums its query heads'.
    let gqa = Layer {
        d_k: 8,
        d_v: 8,
        bias: true,
        d_out: Some(3),
        b_o: true,
        kv_ratio: 2,
        ..PLAIN
    };
    let mask = Mask::none().with_kv_lengths(&[3, 2]);
    check_layer(Attention::new().heads(4).causal(true), gqa, &mask);
}

#[test]
fn sdpa_gradients_match_finite_differences_through_the_modifier_presets() {
    // Soft-capping (a score modifier with a derivative other than 1) after ALiBi, a window
    // and documents (mask modifiers, only through P), with a boolean mask and GQA.
    let (h, s) = (4, 6);
    let ids: Vec<i32> = (0..2 * s).map(|p| ((p % s) / 4 + p / s) as i32).collect();
    let mods = Modifiers::new()
        .preset(Preset::Alibi(Preset::alibi_slopes(h)))
        .preset(Preset::Softcap(0.8))
        .preset(Preset::Window { left: 3, right: 1 })
        .preset(Preset::Documents { ids, n: s as u32 });
    let keep = Array2::from_shape_fn((5, s), |(i, j)| (i + j) % 4 != 0).into_dyn();
    let mask = Mask::boolean(keep.view()).with_modifiers(&mods);
    check_sdpa(Attention::new().scale(1.3), [2, h, 2, 5, s, 3, 2], &mask);
    let mask = Mask::none().with_modifiers(&mods);
    check_sdpa(Attention::new().causal(true), [2, h, 2, 5, s, 3, 2], &mask);
}

/// A caller's score_mod (a per-head slope, then a soft-cap at 0.9, whose derivative is not
/// one) with its derivative, and a mask_mod hiding one key in three, as WGSL with their CPU
/// forms; `with_grad` gives the derivative (its WGSL and its CPU form).
fn callers_modifiers(h: usize, with_grad: bool) -> Modifiers {
    let slope: Vec<f64> = (0..h).map(|i| 0.3 - 0.2 * i as f64).collect();
    let grad_slope = slope.clone();
    let mods = Modifiers::new()
        .score_mod(
            "capped.wgsl",
            "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    \
             return 0.9 * tanh((score + (0.3 - 0.2 * f32(h)) * (f32(kv) - f32(q))) / 0.9);\n}\n",
        )
        .score_mod_cpu(move |s, _b, h, q, kv| {
            0.9 * ((s + slope[h] * (kv as f64 - q as f64)) / 0.9).tanh()
        })
        .mask_mod(
            "thirds.wgsl",
            "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {\n    \
             return (q + kv + b) % 3u != 2u;\n}\n",
        )
        .mask_mod_cpu(|b, _h, q, kv| (q + kv + b) % 3 != 2);
    if !with_grad {
        return mods;
    }
    mods.score_mod_grad(
        "capped_grad.wgsl",
        "fn score_mod_grad(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    \
         let t = tanh((score + (0.3 - 0.2 * f32(h)) * (f32(kv) - f32(q))) / 0.9);\n    \
         return 1.0 - t * t;\n}\n",
    )
    .score_mod_grad_cpu(move |s, _b, h, q, kv| {
        let t = ((s + grad_slope[h] * (kv as f64 - q as f64)) / 0.9).tanh();
        1.0 - t * t
    })
}

#[test]
fn sdpa_gradients_match_finite_differences_through_a_callers_modifiers_cpu_form() {
    // The caller's score_mod first, then a soft-cap preset on its output (the chain of two
    // derivatives), and its mask_mod and-ed with a window, GQA, L ≠ S.
    let h = 4;
    let mods = callers_modifiers(h, true)
        .preset(Preset::Softcap(1.1))
        .preset(Preset::Window { left: 4, right: 2 });
    let mask = Mask::none().with_modifiers(&mods);
    check_sdpa(Attention::new().scale(1.3), [2, h, 2, 5, 7, 3, 2], &mask);
    check_sdpa(Attention::new().causal(true), [1, h, 1, 6, 4, 3, 2], &mask);
}

#[test]
fn the_reference_refuses_a_callers_modifier_without_its_cpu_form() {
    let [q, k, v] = [
        random(&[1, 2, 2, 3], 1),
        random(&[1, 2, 2, 3], 2),
        random(&[1, 2, 2, 3], 3),
    ];
    let d_o = random(&[1, 2, 2, 3], 4);
    let run = |mods: &Modifiers| {
        let mask = Mask::none().with_modifiers(mods);
        let inputs = Inputs::qkv(&q, &k, &v).mask(&mask);
        (
            reference::run(&Attention::new(), &inputs).map(drop),
            reference::backward(&Attention::new(), &inputs, d_o.view()).map(drop),
        )
    };
    // WGSL alone: an error naming the closure to give, forward and backward.
    let wgsl_only = Modifiers::new().mask_mod(
        "m.wgsl",
        "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {\n    return true;\n}\n",
    );
    let (forward, backward) = run(&wgsl_only);
    for e in [forward.unwrap_err(), backward.unwrap_err()] {
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        assert!(e.to_string().contains("Modifiers::mask_mod_cpu"), "{e}");
    }
    // A score_mod with its CPU form but not its derivative's: the forward runs, the backward
    // is refused as the GPU's is without score_mod_grad.
    let (forward, backward) = run(&callers_modifiers(2, false));
    forward.unwrap();
    match backward {
        Err(Error::Unsupported { feature, hint, .. }) => {
            assert!(feature.contains("score_mod_grad"), "{feature}");
            assert!(hint.contains("Modifiers::score_mod_grad_cpu("), "{hint}");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let (forward, backward) = run(&callers_modifiers(2, true));
    forward.unwrap();
    backward.unwrap();
}

#[test]
fn backward_errors_name_what_is_wrong() {
    let [q, k, v] = [
        random(&[1, 2, 3, 4], 1),
        random(&[1, 2, 5, 4], 2),
        random(&[1, 2, 5, 3], 3),
    ];
    let op = Attention::new();
    let sdpa = |d_o: &ArrayD<f32>, q: &ArrayD<f32>, k: &ArrayD<f32>| {
        reference::backward(&op, &Inputs::qkv(q, k, &v).mask(&Mask::none()), d_o.view())
            .unwrap_err()
    };
    // dO of the wrong shape (E instead of E_v).
    let e = sdpa(&random(&[1, 2, 3, 4], 4), &q, &k);
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    assert!(e.to_string().contains("dO is [1, 2, 3, 4]"), "{e}");
    assert!(e.to_string().contains("[1, 2, 3, 3]"), "{e}");
    // NaN in dO, and in Q even when the forward would propagate it.
    let mut d_o = random(&[1, 2, 3, 3], 4);
    d_o[[0, 1, 2, 0]] = f32::NAN;
    let e = sdpa(&d_o, &q, &k);
    assert!(
        matches!(&e, Error::NonFinite { array, index, .. } if array == "dO" && index == &[0, 1, 2, 0]),
        "{e}"
    );
    let mut bad_q = q.clone();
    bad_q[[0, 0, 1, 1]] = f32::INFINITY;
    let propagating = op.options(Options::default().propagate_non_finite(true));
    let e = reference::backward(
        &propagating,
        &Inputs::qkv(&bad_q, &k, &v).mask(&Mask::none()),
        random(&[1, 2, 3, 3], 4).view(),
    )
    .unwrap_err();
    assert!(
        matches!(&e, Error::NonFinite { array, .. } if array == "Q"),
        "{e}"
    );
    // The forward's own shape errors: K narrower than Q.
    let e = sdpa(&random(&[1, 2, 3, 3], 4), &q, &random(&[1, 2, 5, 2], 2));
    assert!(e.to_string().contains("same width E"), "{e}");
    // A mask that does not broadcast.
    let keep = ArrayD::from_elem(IxDyn(&[2, 5]), true);
    let mask = Mask::boolean(keep.view());
    let e = reference::backward(
        &op,
        &Inputs::qkv(&q, &k, &v).mask(&mask),
        random(&[1, 2, 3, 3], 4).view(),
    )
    .unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");

    // The layer: dO must have the output's shape, (n, d_out) with W_O.
    let x = random(&[3, 4], 5);
    let (w, w_o) = (random(&[4, 4], 6), random(&[4, 2], 7));
    let w2 = w.view().into_dimensionality::<Ix2>().unwrap();
    let proj =
        Projections::new(w2, w2, w2).with_output(w_o.view().into_dimensionality().unwrap(), None);
    let e = reference::backward(
        &op,
        &Inputs::x(&x).projections(&proj).mask(&Mask::none()),
        random(&[3, 4], 8).view(),
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("dO is [3, 4] but the output is [3, 2]"),
        "{e}"
    );
    let mut d_o = random(&[3, 2], 8);
    d_o[[2, 1]] = f32::NEG_INFINITY;
    let e = reference::backward(
        &op,
        &Inputs::x(&x).projections(&proj).mask(&Mask::none()),
        d_o.view(),
    )
    .unwrap_err();
    assert!(
        matches!(&e, Error::NonFinite { array, .. } if array == "dO"),
        "{e}"
    );
    let mut bad_w = w.clone();
    bad_w[[0, 0]] = f32::NAN;
    let bad = Projections::new(w2, bad_w.view().into_dimensionality().unwrap(), w2);
    let e = reference::backward(
        &op,
        &Inputs::x(&x).projections(&bad).mask(&Mask::none()),
        random(&[3, 4], 8).view(),
    )
    .unwrap_err();
    assert!(
        matches!(&e, Error::NonFinite { array, .. } if array == "W_K"),
        "{e}"
    );
    let e = reference::backward(
        &op.heads(3),
        &Inputs::x(&x).mask(&Mask::none()),
        random(&[3, 4], 8).view(),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("does not divide by heads = 3"),
        "{e}"
    );
}
