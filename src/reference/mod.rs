//! The CPU oracle: the same definition as the GPU path, written plainly with `ndarray` and
//! accumulated in f64. Slow on purpose; obviously right is the point. The gradients of both
//! ops are here too ([`backward()`]).

use ndarray::{s, Array1, Array2, Array4, ArrayD, ArrayView2, ArrayView4, ArrayViewD, Axis, IxDyn};

use crate::attention::inputs::Operands;
use crate::attention::{
    check_inputs_finite, Attention, Dims, Gradients, Host, Inputs, Output, Projections,
};
use crate::error::{Error, Result};
use crate::mask::Mask;
use crate::modifiers::Modifiers;

mod backward;
mod f16;
#[cfg(test)]
pub(crate) use backward::sdpa_backward;
pub use f16::{round_f16, run_f16};
pub(crate) use f16::{run_held, Held};

fn to_f64_2d(a: &ArrayView2<'_, f32>) -> Array2<f64> {
    a.mapv(f64::from)
}

fn project(
    x: &Array2<f64>,
    w: &ArrayView2<'_, f32>,
    b: Option<&ndarray::ArrayView1<'_, f32>>,
) -> Array2<f64> {
    let mut out = x.dot(&to_f64_2d(w));
    if let Some(b) = b {
        let b: Array1<f64> = b.mapv(f64::from);
        out += &b;
    }
    out
}

/// Softmax of one row of logits over its first `visible` entries; the rest are 0.
pub fn softmax_row(logits: &[f64], visible: usize) -> Vec<f64> {
    let masked: Vec<f64> = logits
        .iter()
        .enumerate()
        .map(|(j, &t)| if j < visible { t } else { f64::NEG_INFINITY })
        .collect();
    softmax_masked(&masked)
}

/// Softmax of one row of logits where `-inf` is masked out (weight exactly 0, whatever the
/// rest of the row holds); a row with nothing but `-inf` is all 0. A NaN logit makes every
/// other weight of its row NaN.
pub fn softmax_masked(logits: &[f64]) -> Vec<f64> {
    let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY && !logits.iter().any(|t| t.is_nan()) {
        return vec![0.0; logits.len()];
    }
    let e: Vec<f64> = logits.iter().map(|&t| (t - m).exp()).collect();
    let sum: f64 = e.iter().sum();
    logits
        .iter()
        .zip(e)
        .map(|(&t, v)| if t == f64::NEG_INFINITY { 0.0 } else { v / sum })
        .collect()
}

/// The resolved mask of a call with the batch index and head to read it at.
type BiasAt<'m> = Option<(&'m Array4<f32>, usize, usize)>;

/// A call's modifiers with the batch index and head they see.
pub(crate) type ModsAt<'m> = Option<(&'m Modifiers, usize, usize)>;

/// The modifiers of `mask`, when the reference can apply them as the kernels do (for the
/// `backward` too): the error of [`Modifiers::check_cpu`] for a caller's WGSL without its CPU
/// form, or a CPU form without its WGSL.
fn cpu_modifiers<'m>(mask: &Mask<'m>, backward: bool) -> Result<Option<&'m Modifiers>> {
    let mods = mask.modifiers();
    if let Some(m) = mods {
        m.check_cpu(backward)?;
    }
    Ok(mods)
}

/// The score modifiers of `m` on the scaled score `t` at `(b, h, i, j)` in the kernels' order,
/// the caller's CPU form first, then the score presets; and their derivative by `t`, the
/// product of each one's at its input (NaN without the caller's `score_mod_grad_cpu`: the
/// backward, which alone reads it, refuses that case first).
fn modified_score(m: &Modifiers, mut t: f64, [b, h, i, j]: [usize; 4]) -> (f64, f64) {
    let mut g = 1.0;
    if let Some(f) = m.score_mod_cpu_fn() {
        g *= m
            .score_mod_grad_cpu_fn()
            .map_or(f64::NAN, |d| d(t, b, h, i, j));
        t = f(t, b, h, i, j);
    }
    for p in m.presets().iter().filter(|p| !p.masks()) {
        g *= p.grad(t, b, h, i, j);
        t = p.apply(t, b, h, i, j).unwrap_or(t);
    }
    (t, g)
}

/// Whether the mask modifiers of `m` let query `i` see key `j` at `(b, h)`: the caller's CPU
/// form and-ed with the mask presets.
fn visible(m: &Modifiers, [b, h, i, j]: [usize; 4]) -> bool {
    m.mask_mod_cpu_fn().is_none_or(|f| f(b, h, i, j))
        && m.presets()
            .iter()
            .filter(|p| p.masks())
            .all(|p| p.apply(0.0, b, h, i, j).is_some())
}

/// One head's attention weights: `A = softmax(scale·q·kᵀ + bias)` row by row, top-left
/// causal when asked, masked weights exactly 0, a row with nothing to attend to all 0.
fn head_weights(
    q: ArrayView2<'_, f64>,
    k: ArrayView2<'_, f64>,
    scale: f64,
    causal: bool,
    bias: BiasAt<'_>,
    mods: ModsAt<'_>,
) -> Array2<f64> {
    let (n_q, n_kv) = (q.nrows(), k.nrows());
    let logits = q.dot(&k.t()) * scale;
    let mut a = Array2::<f64>::zeros((n_q, n_kv));
    for i in 0..n_q {
        let row: Vec<f64> = (0..n_kv)
            .map(|j| {
                let mut t = logits[[i, j]];
                if causal && j > i {
                    return f64::NEG_INFINITY;
                }
                // The modifiers as the kernels apply them: the score modifiers on the scaled
                // score (the caller's first), then the bias, then the mask modifiers.
                if let Some((m, b, h)) = mods {
                    t = modified_score(m, t, [b, h, i, j]).0;
                }
                if let Some((bias, b, h)) = bias {
                    let pick =
                        |axis: usize, idx: usize| if bias.shape()[axis] == 1 { 0 } else { idx };
                    let add = f64::from(bias[[pick(0, b), pick(1, h), pick(2, i), pick(3, j)]]);
                    // Masked out means -inf whatever the logit was (NaN included).
                    t = if add == f64::NEG_INFINITY {
                        add
                    } else {
                        t + add
                    };
                }
                if mods.is_some_and(|(m, b, h)| !visible(m, [b, h, i, j])) {
                    t = f64::NEG_INFINITY;
                }
                t
            })
            .collect();
        a.row_mut(i).assign(&Array1::from(softmax_masked(&row)));
    }
    a
}

/// One head of attention: the weights `A` of [`head_weights`] and the context `A·v`.
fn head(
    q: ArrayView2<'_, f64>,
    k: ArrayView2<'_, f64>,
    v: ArrayView2<'_, f64>,
    scale: f64,
    causal: bool,
    bias: BiasAt<'_>,
    mods: ModsAt<'_>,
) -> (Array2<f64>, Array2<f64>) {
    let (n_q, n_kv) = (q.nrows(), k.nrows());
    let a = head_weights(q, k, scale, causal, bias, mods);
    // context = A·V over the keys of non-zero weight: a key of weight 0 contributes nothing,
    // even where its value is NaN or Inf.
    let mut context = Array2::<f64>::zeros((n_q, v.ncols()));
    for i in 0..n_q {
        for j in 0..n_kv {
            let w = a[[i, j]];
            if w != 0.0 {
                context.row_mut(i).scaled_add(w, &v.row(j));
            }
        }
    }
    (a, context)
}

/// [`Attention::run`] on the CPU in f64, with exactly its semantics (the weights always
/// returned, nothing saved): the same [`Inputs`] (arrays), masks, causal, scale, heads and
/// grouped-query layout. The oracle every GPU result is checked against.
///
/// ```
/// use wgpu_attention::{reference, Attention, Inputs, ndarray::Array2};
/// let x = Array2::from_shape_fn((4, 6), |(i, j)| (i as f32 - j as f32) * 0.3);
/// let out = reference::run(&Attention::new().causal(true), &Inputs::x(&x))?;
/// let w = out.weights.unwrap();
/// assert_eq!(w[[0, 0]], 1.0); // the first query sees only the first key
/// # Ok::<(), wgpu_attention::Error>(())
/// ```
///
/// A caller's own modifiers apply in their CPU form, the closures of
/// [`Modifiers::score_mod_cpu`] and [`Modifiers::mask_mod_cpu`], where the kernels apply
/// their WGSL.
///
/// # Errors
/// The same shape, option, mask and finiteness errors as the GPU path; an
/// [`Error::InvalidArgument`] for a caller's WGSL modifier without its CPU form (or a CPU
/// form without its WGSL).
pub fn run(op: &Attention, inputs: &Inputs<'_, Host>) -> Result<Output<ndarray::ArrayD<f64>>> {
    let mask = inputs.mask_or_none();
    match &inputs.operands {
        Operands::X(x) => attention_masked(op, x.view(), inputs.projections.as_ref(), &mask),
        Operands::Qkv([q, k, v]) => {
            let [q, k, v] = four([q, k, v], inputs.projections.is_some())?;
            sdpa_masked(op, q, k, v, &mask)
        }
    }
}

/// The gradients of [`run`]'s forward on the CPU in f64, given `dO = ∂ℓ/∂output` of the
/// context's shape: what [`crate::Saved::backward`] computes on the GPU (see
/// [`Gradients`] for which fields are given). The weights are recomputed from Q and K, as a
/// fused backward does.
///
/// # Errors
/// The forward's shape, option and mask errors; an [`Error::Unsupported`] for a caller's
/// `score_mod` without [`Modifiers::score_mod_grad_cpu`]; a `dO` not of the context's shape;
/// NaN or ±Inf in any input or in dO, always (a gradient through a non-finite value means nothing).
pub fn backward(
    op: &Attention,
    inputs: &Inputs<'_, Host>,
    d_o: ndarray::ArrayViewD<'_, f32>,
) -> Result<Gradients<ndarray::ArrayD<f64>>> {
    let mask = inputs.mask_or_none();
    match &inputs.operands {
        Operands::X(x) => Ok(backward::attention_backward(
            op,
            x.view(),
            inputs.projections.as_ref(),
            d_o,
            &mask,
        )?
        .into()),
        Operands::Qkv([q, k, v]) => {
            let [q, k, v] = four([q, k, v], inputs.projections.is_some())?;
            let [d_o] = four([&d_o], false)?;
            Ok(backward::sdpa_backward(op, q, k, v, d_o, &mask)?.into())
        }
    }
}

/// Q, K, V (or dO) as 4-d views; projections with them are an error.
fn four<'a, const N: usize>(
    a: [&ndarray::ArrayViewD<'a, f32>; N],
    projected: bool,
) -> Result<[ArrayView4<'a, f32>; N]> {
    if projected {
        return Err(Error::invalid(
            "inputs",
            "projections apply to X, not to Q, K and V: give Inputs::x(x)",
        ));
    }
    let mut out = Vec::with_capacity(N);
    for a in a {
        out.push(
            a.clone()
                .into_dimensionality::<ndarray::Ix4>()
                .map_err(|_| {
                    Error::shape(format!(
                        "Q, K, V and dO must be 4-d (batch, heads, rows, width), got {:?}",
                        a.shape()
                    ))
                })?,
        );
    }
    out.try_into()
        .map_err(|_| Error::shape("operand count".to_string()))
}

/// [`run`] on Q, K and V (PyTorch's layout, `(batch, heads, L, E)`), with `mask` added to the
/// scaled scores (see [`crate::mask`]): the CPU peer of [`Attention::run`] on Q, K, V.
///
/// # Errors
/// As [`run`].
pub(crate) fn sdpa_masked(
    op: &Attention,
    q: ArrayView4<'_, f32>,
    k: ArrayView4<'_, f32>,
    v: ArrayView4<'_, f32>,
    mask: &Mask<'_>,
) -> Result<Output<ndarray::ArrayD<f64>>> {
    let dims = op.sdpa_dims(q.shape(), k.shape(), v.shape())?;
    if !op.propagates_non_finite() {
        crate::attention::check_finite("Q", &q)?;
        crate::attention::check_finite("K", &k)?;
        crate::attention::check_finite("V", &v)?;
    }
    let (b, h, l, _) = q.dim();
    let (s_len, e_v) = (k.dim().2, v.dim().3);
    let bias = mask.bias([b, h, l, s_len])?;
    let mods = cpu_modifiers(mask, false)?;
    let scale = f64::from(dims.scale);
    let mut context = ndarray::Array4::<f64>::zeros((b, h, l, e_v));
    let mut weights = ndarray::Array4::<f64>::zeros((b, h, l, s_len));
    for bi in 0..b {
        for hi in 0..h {
            let qm = q.slice(s![bi, hi, .., ..]).mapv(f64::from);
            // Grouped-query attention: h / (H / H_kv) is the K/V head of Q head h.
            let hk = hi / (h / k.dim().1);
            let km = k.slice(s![bi, hk, .., ..]).mapv(f64::from);
            let vm = v.slice(s![bi, hk, .., ..]).mapv(f64::from);
            let at = bias.as_ref().map(|m| (m, bi, hi));
            let (a, c) = head(
                qm.view(),
                km.view(),
                vm.view(),
                scale,
                dims.causal,
                at,
                mods.map(|m| (m, bi, hi)),
            );
            weights.slice_mut(s![bi, hi, .., ..]).assign(&a);
            context.slice_mut(s![bi, hi, .., ..]).assign(&c);
        }
    }
    Ok(Output::new(context.into_dyn(), Some(weights.into_dyn())))
}

/// [`run`] on X (`(n, d)` or `(batch, n, d)`), projected when `proj` is given, with `mask`
/// added to the scaled scores: the CPU peer of [`Attention::run`] on X.
///
/// # Errors
/// As [`run`].
pub(crate) fn attention_masked(
    op: &Attention,
    x: ArrayViewD<'_, f32>,
    proj: Option<&Projections<'_>>,
    mask: &Mask<'_>,
) -> Result<Output<ndarray::ArrayD<f64>>> {
    attention_masked_rounded(op, x, proj, mask, [None; 3])
}

/// A rounding of stored values ([`round_f16`]).
type Round = fn(f64) -> f64;

/// [`attention_masked`] with Q, K and V (projected, or X itself) each passed through its
/// `round` (the f16 path's storage between kernels, [`run_f16`]; the cooperative matrices'
/// staging, [`run_held`]).
///
/// # Errors
/// As [`run`].
fn attention_masked_rounded(
    op: &Attention,
    x: ArrayViewD<'_, f32>,
    proj: Option<&Projections<'_>>,
    mask: &Mask<'_>,
    round: [Option<Round>; 3],
) -> Result<Output<ndarray::ArrayD<f64>>> {
    let dims = op.dims(x.shape(), proj)?;
    if !op.propagates_non_finite() {
        check_inputs_finite(&x, proj)?;
    }
    let Dims {
        batch,
        n,
        d,
        d_k,
        d_v,
        heads,
        kv_heads,
        scale,
        causal,
        ..
    } = dims;
    let bias = mask.bias([batch, heads, n, n])?;
    let mods = cpu_modifiers(mask, false)?;
    let x3 = x
        .to_shape((batch, n, d))
        .map_err(|e| Error::shape(e.to_string()))?
        .mapv(f64::from);
    let (dk_h, dv_h) = (d_k / heads, d_v / heads);
    let scale = f64::from(scale);
    let mut context = ndarray::Array3::<f64>::zeros((batch, n, d_v));
    let mut weights = ndarray::Array4::<f64>::zeros((batch, heads, n, n));
    for b in 0..batch {
        let xb = x3.index_axis(Axis(0), b).to_owned();
        let stored = |a: Array2<f64>, i: usize| match round[i] {
            Some(r) => a.mapv(r),
            None => a,
        };
        let (q, k, v) = match proj {
            None => (stored(xb.clone(), 0), stored(xb.clone(), 1), stored(xb, 2)),
            Some(p) => (
                stored(project(&xb, &p.w_q, p.b_q.as_ref()), 0),
                stored(project(&xb, &p.w_k, p.b_k.as_ref()), 1),
                stored(project(&xb, &p.w_v, p.b_v.as_ref()), 2),
            ),
        };
        for h in 0..heads {
            let qh = q.slice(s![.., h * dk_h..(h + 1) * dk_h]);
            // Grouped-query attention: query head h reads K/V head h / (H / H_kv).
            let g = h / (heads / kv_heads);
            let kh = k.slice(s![.., g * dk_h..(g + 1) * dk_h]);
            let vh = v.slice(s![.., g * dv_h..(g + 1) * dv_h]);
            let at = bias.as_ref().map(|m| (m, b, h));
            let (a, c) = head(qh, kh, vh, scale, causal, at, mods.map(|m| (m, b, h)));
            context
                .slice_mut(s![b, .., h * dv_h..(h + 1) * dv_h])
                .assign(&c);
            weights.slice_mut(s![b, h, .., ..]).assign(&a);
        }
    }
    // The output projection, when there is one: context·W_O + b_O.
    let context = match proj.and_then(|p| p.w_o.map(|w| (w, p.b_o))) {
        None => context.into_dyn(),
        Some((w_o, b_o)) => {
            let flat = context
                .into_shape_with_order((batch * n, d_v))
                .map_err(|e| Error::shape(e.to_string()))?;
            project(&flat, &w_o, b_o.as_ref()).into_dyn()
        }
    };
    let context = context
        .into_shape_with_order(IxDyn(&dims.context_shape()))
        .map_err(|e| Error::shape(e.to_string()))?;
    let weights: ArrayD<f64> = weights
        .into_shape_with_order(IxDyn(&dims.weights_shape()))
        .map_err(|e| Error::shape(e.to_string()))?;
    Ok(Output {
        context,
        weights: Some(weights),
        saved: None,
    })
}

/// The largest `|scale · Σ_k |q_ik|·|k_jk||` over the problem: how big the logits can get,
/// which sets how much f32 rounding the softmax can amplify.
///
/// # Errors
/// The shape errors of [`run`] for `Inputs::x(x).projections(proj)`.
pub fn logit_bound(
    op: &Attention,
    x: ArrayViewD<'_, f32>,
    proj: Option<&Projections<'_>>,
) -> Result<f64> {
    let dims = op.dims(x.shape(), proj)?;
    let x3 = x
        .to_shape((dims.batch, dims.n, dims.d))
        .map_err(|e| Error::shape(e.to_string()))?
        .mapv(f64::from);
    let dk_h = dims.d_k / dims.heads;
    let mut bound = 0.0f64;
    for b in 0..dims.batch {
        let xb = x3.index_axis(Axis(0), b).to_owned();
        let (q, k) = match proj {
            None => (xb.clone(), xb),
            Some(p) => (
                project(&xb, &p.w_q, p.b_q.as_ref()),
                project(&xb, &p.w_k, p.b_k.as_ref()),
            ),
        };
        for h in 0..dims.heads {
            let qa = q.slice(s![.., h * dk_h..(h + 1) * dk_h]).mapv(f64::abs);
            let g = h / (dims.heads / dims.kv_heads);
            let ka = k.slice(s![.., g * dk_h..(g + 1) * dk_h]).mapv(f64::abs);
            let m = qa.dot(&ka.t()).fold(0.0f64, |a, &v| a.max(v));
            bound = bound.max(m * f64::from(dims.scale).abs());
        }
    }
    Ok(bound)
}

/// Relative error `‖out − ref‖₂ / ‖ref‖₂` and max absolute error of a GPU result, of any
/// dimension type; arrays of different shapes compare as infinitely far apart.
pub fn compare<D1: ndarray::Dimension, D2: ndarray::Dimension>(
    out: &ndarray::Array<f32, D1>,
    reference: &ndarray::Array<f64, D2>,
) -> (f64, f64) {
    if out.shape() != reference.shape() {
        return (f64::INFINITY, f64::INFINITY);
    }
    let mut diff2 = 0.0f64;
    let mut ref2 = 0.0f64;
    let mut max_abs = 0.0f64;
    for (&o, &r) in out.iter().zip(reference.iter()) {
        let e = (f64::from(o) - r).abs();
        // NaN must fail: f64::max would drop it.
        let e = if e.is_nan() { f64::INFINITY } else { e };
        diff2 += e * e;
        ref2 += r * r;
        max_abs = max_abs.max(e);
    }
    let rel = if ref2 > 0.0 {
        (diff2 / ref2).sqrt()
    } else {
        diff2.sqrt()
    };
    (rel, max_abs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_fails_arrays_of_different_shapes() {
        let a = ndarray::Array2::<f32>::zeros((2, 3));
        let b = ndarray::Array2::<f64>::zeros((3, 2));
        assert_eq!(compare(&a, &b), (f64::INFINITY, f64::INFINITY));
        assert_eq!(compare(&a, &a.mapv(f64::from).into_dyn()), (0.0, 0.0));
    }

    #[test]
    fn softmax_row_is_stable_for_huge_logits() {
        let w = softmax_row(&[1000.0, 1001.0, 3.0], 3);
        assert!(w.iter().all(|v| v.is_finite()));
        assert!((w[1] - 1.0 / (1.0 + (-1.0f64).exp())).abs() < 1e-12);
    }

    #[test]
    fn softmax_row_masks_beyond_visible() {
        let w = softmax_row(&[1.0, 2.0, 3.0], 1);
        assert_eq!(w, vec![1.0, 0.0, 0.0]);
    }

    #[test]
    fn compare_counts_nan_as_failure() {
        let out = ArrayD::from_shape_vec(IxDyn(&[2]), vec![1.0f32, f32::NAN]).unwrap();
        let r = ArrayD::from_shape_vec(IxDyn(&[2]), vec![1.0f64, 2.0]).unwrap();
        let (rel, max) = compare(&out, &r);
        assert!(rel.is_infinite() && max.is_infinite());
    }
}
