//! The backward pass on the CPU in f64, written from the analytic formulas: the oracle for
//! gradients, as the rest of [`crate::reference`] is for the forward.
//!
//! For one head, with `P = softmax(scale·Q·Kᵀ + bias)` (the forward's weights, masked
//! entries exactly 0) and `dO = ∂ℓ/∂O`, `O = P·V`:
//!
//! ```text
//! dV = Pᵀ·dO
//! dP = dO·Vᵀ
//! D_i = Σ_j P_ij·dP_ij              (= Σ_e dO_ie·O_ie)
//! dS = P ∘ (dP − D)                  (each row i shifted by its own D_i)
//! dQ = scale·dS·K
//! dK = scale·dSᵀ·Q
//! ```
//!
//! The bias (mask, causal, key lengths) and the mask modifiers do not depend on the inputs,
//! so they only enter through `P`. Score modifiers (`P = softmax(mod(scale·Q·Kᵀ) + bias)`)
//! chain into dS: it is taken back to the raw scaled score by `mod'`, the product of each
//! score modifier's derivative at its input (the caller's
//! [`crate::modifiers::Modifiers::score_mod_grad_cpu`] first, then each score preset's
//! [`crate::modifiers::Preset::grad`]), before dQ and dK. A row with nothing to attend to
//! has `P = 0`, hence `dS = 0`: its query gets a
//! gradient of exactly 0 and it adds nothing to any key or value. Grouped-query K/V heads
//! sum the gradients of the query heads that read them. The projected layer chains these
//! through `Q = X·W_Q + b_Q` (and K, V) and the output projection.

use ndarray::{s, Array1, Array2, Array3, Array4, ArrayView2, ArrayView4, ArrayViewD, Axis, IxDyn};

use super::{cpu_modifiers, head, head_weights, modified_score, project, BiasAt, ModsAt};
use crate::attention::{check_finite, check_inputs_finite, Attention, Projections};
use crate::attention::{LayerGradients, SdpaGradients};
use crate::error::{Error, Result};
use crate::mask::Mask;
use crate::modifiers::Preset;

/// One head's gradients `(dQ, dK, dV)` from the formulas in the module docs, with the
/// head's bias and modifiers, and with a relative bias among them its table's gradient for
/// this head, one value per bucket: the incoming gradient at the bias's output (dS taken back
/// through the score presets after it) summed over the pairs of each bucket.
#[allow(clippy::type_complexity)]
fn head_backward(
    q: ArrayView2<'_, f64>,
    k: ArrayView2<'_, f64>,
    v: ArrayView2<'_, f64>,
    d_o: ArrayView2<'_, f64>,
    scale: f64,
    causal: bool,
    (bias, mods): (BiasAt<'_>, ModsAt<'_>),
) -> (Array2<f64>, Array2<f64>, Array2<f64>, Option<Vec<f64>>) {
    let p = head_weights(q, k, scale, causal, bias, mods);
    let d_v = p.t().dot(&d_o);
    let d_p = d_o.dot(&v.t());
    let logits = q.dot(&k.t()) * scale;
    // d mod(s) / d s at (i, j): the chain through the score modifiers, in order (the
    // caller's score_mod_grad_cpu first).
    let chain = |i: usize, j: usize| match mods {
        Some((m, b, h)) => modified_score(m, logits[[i, j]], [b, h, i, j]).1,
        None => 1.0,
    };
    // The first relative bias: its table's gradient is the incoming gradient at its output,
    // taken back through the score presets after it (`tail`).
    let presets = mods.map_or(&[][..], |(m, _, _)| m.presets());
    let table = presets.iter().enumerate().find_map(|(at, p)| match p {
        Preset::RelativeBias {
            buckets,
            max_distance,
            bidirectional,
            ..
        } => Some((at, *buckets, *max_distance, *bidirectional)),
        _ => None,
    });
    let tail = |i: usize, j: usize, at: usize| {
        let Some((m, b, h)) = mods else { return 1.0 };
        let mut t = logits[[i, j]];
        if let Some(f) = m.score_mod_cpu_fn() {
            t = f(t, b, h, i, j);
        }
        let mut g = 1.0;
        for (n, p) in presets.iter().enumerate().filter(|(_, p)| !p.masks()) {
            if n > at {
                g *= p.grad(t, b, h, i, j);
            }
            t = p.apply(t, b, h, i, j).unwrap_or(t);
        }
        g
    };
    let mut d_table = table.map(|(_, buckets, ..)| vec![0.0; buckets as usize]);
    let mut d_s = Array2::<f64>::zeros(p.raw_dim());
    for i in 0..p.nrows() {
        let d_i: f64 = (&p.row(i) * &d_p.row(i)).sum();
        for j in 0..p.ncols() {
            if p[[i, j]] != 0.0 {
                let incoming = p[[i, j]] * (d_p[[i, j]] - d_i);
                d_s[[i, j]] = incoming * chain(i, j);
                if let (Some((at, buckets, reach, both)), Some(acc)) = (table, d_table.as_mut()) {
                    let bucket = Preset::t5_bucket(j as i64 - i as i64, buckets, reach, both);
                    acc[bucket as usize] += incoming * tail(i, j, at);
                }
            }
        }
    }
    let d_q = d_s.dot(&k) * scale;
    let d_k = d_s.t().dot(&q) * scale;
    (d_q, d_k, d_v, d_table)
}

/// A relative bias table's gradient, `(buckets, heads)`, made zero on its first head's.
fn g_table(table: &mut Option<Array2<f64>>, buckets: usize, heads: usize) -> &mut Array2<f64> {
    table.get_or_insert_with(|| Array2::zeros((buckets, heads)))
}

/// `Err(ShapeMismatch)` unless the output gradient has the output's shape.
fn check_grad_shape(d_o: &[usize], output: &[usize], what: &str) -> Result<()> {
    if d_o == output {
        return Ok(());
    }
    Err(Error::shape(format!(
        "dO is {d_o:?} but {what} is {output:?}: the output's gradient has the output's shape"
    )))
}

/// [`super::backward()`] on Q, K and V: the gradients of [`Attention::run`] on Q, K, V on the CPU
/// in f64. Given `dO = ∂ℓ/∂context` of shape `(batch, heads, L, E_v)`, returns `∂ℓ/∂Q`,
/// `∂ℓ/∂K` and `∂ℓ/∂V` in the shapes of Q, K and V (see [`SdpaGradients`]). Every option of
/// the forward applies: causal, the mask and key lengths, the modifiers (presets, and a
/// caller's in their CPU form), grouped-query heads, the scale. The weights are recomputed from Q and K, as a fused backward does.
///
/// # Errors
/// The forward's shape, option and mask errors (a caller's WGSL modifier without its CPU
/// form among them); [`Error::Unsupported`] for a caller's `score_mod` without the CPU form
/// of its derivative; [`Error::ShapeMismatch`] when `dO` does not have the context's shape;
/// [`Error::NonFinite`] for NaN or ±Inf in Q, K, V or dO, always
/// ([`crate::Options::propagate_non_finite`] applies to the forward only: a gradient through
/// a non-finite value has no meaning).
pub(crate) fn sdpa_backward(
    op: &Attention,
    q: ArrayView4<'_, f32>,
    k: ArrayView4<'_, f32>,
    v: ArrayView4<'_, f32>,
    d_o: ArrayView4<'_, f32>,
    mask: &Mask<'_>,
) -> Result<SdpaGradients<f64>> {
    let dims = op.sdpa_dims(q.shape(), k.shape(), v.shape())?;
    let (b, h, l, _) = q.dim();
    let (h_kv, s_len, e_v) = (k.dim().1, k.dim().2, v.dim().3);
    check_grad_shape(
        d_o.shape(),
        &[b, h, l, e_v],
        "the context (batch, heads, L, E_v)",
    )?;
    for (name, a) in [("Q", &q), ("K", &k), ("V", &v), ("dO", &d_o)] {
        check_finite(name, a)?;
    }
    let bias = mask.bias([b, h, l, s_len])?;
    let mods = cpu_modifiers(mask, true)?;
    let scale = f64::from(dims.scale);
    let mut d_q = Array4::<f64>::zeros(q.raw_dim());
    let mut d_k = Array4::<f64>::zeros(k.raw_dim());
    let mut d_v = Array4::<f64>::zeros(v.raw_dim());
    // A relative bias table's gradient, (buckets, heads), summed over the batch.
    let mut d_table: Option<Array2<f64>> = None;
    for bi in 0..b {
        for hi in 0..h {
            // Grouped-query attention: Q head hi reads K/V head hi / (H / H_kv).
            let hk = hi / (h / h_kv);
            let qm = q.slice(s![bi, hi, .., ..]).mapv(f64::from);
            let km = k.slice(s![bi, hk, .., ..]).mapv(f64::from);
            let vm = v.slice(s![bi, hk, .., ..]).mapv(f64::from);
            let dom = d_o.slice(s![bi, hi, .., ..]).mapv(f64::from);
            let at = bias.as_ref().map(|m| (m, bi, hi));
            let (gq, gk, gv, gt) = head_backward(
                qm.view(),
                km.view(),
                vm.view(),
                dom.view(),
                scale,
                dims.causal,
                (at, mods.map(|m| (m, bi, hi))),
            );
            d_q.slice_mut(s![bi, hi, .., ..]).assign(&gq);
            // A shared K/V head sums the gradients of every Q head reading it.
            d_k.slice_mut(s![bi, hk, .., ..]).scaled_add(1.0, &gk);
            d_v.slice_mut(s![bi, hk, .., ..]).scaled_add(1.0, &gv);
            if let Some(gt) = gt {
                let t = g_table(&mut d_table, gt.len(), h);
                t.column_mut(hi).scaled_add(1.0, &Array1::from(gt));
            }
        }
    }
    Ok(SdpaGradients {
        q: d_q,
        k: d_k,
        v: d_v,
        relative_bias: d_table,
    })
}

/// [`super::backward()`] on X: the gradients of [`Attention::run`] on X (pass
/// [`Mask::none`] for no mask) on the CPU in f64. Given `dO = ∂ℓ/∂output`, of the output's
/// shape (`(n, d_out)` or `(batch, n, d_out)`), returns `∂ℓ/∂X` and, with projections, the
/// gradient of every weight and bias given (see [`LayerGradients`]). Without projections
/// (`Q = K = V = X`), `∂ℓ/∂X` is the sum of the gradients of X's three uses.
///
/// # Errors
/// The forward's shape, option and mask errors; [`Error::ShapeMismatch`] when `dO` does not
/// have the output's shape; [`Error::NonFinite`] for NaN or ±Inf in X, a weight, a bias or
/// dO, always (as [`sdpa_backward`]).
pub(crate) fn attention_backward(
    op: &Attention,
    x: ArrayViewD<'_, f32>,
    proj: Option<&Projections<'_>>,
    d_o: ArrayViewD<'_, f32>,
    mask: &Mask<'_>,
) -> Result<LayerGradients<f64>> {
    let dims = op.dims(x.shape(), proj)?;
    check_grad_shape(d_o.shape(), &dims.context_shape(), "the output")?;
    check_inputs_finite(&x, proj)?;
    check_finite("dO", &d_o)?;
    let (batch, n, d, d_k, d_v, d_out, heads) = (
        dims.batch, dims.n, dims.d, dims.d_k, dims.d_v, dims.d_out, dims.heads,
    );
    let bias = mask.bias([batch, heads, n, n])?;
    let mods = cpu_modifiers(mask, true)?;
    let shape_err = |e: ndarray::ShapeError| Error::shape(e.to_string());
    let x3 = x
        .to_shape((batch, n, d))
        .map_err(shape_err)?
        .mapv(f64::from);
    let d_o3 = d_o
        .to_shape((batch, n, d_out))
        .map_err(shape_err)?
        .mapv(f64::from);
    let (dk_h, dv_h) = (d_k / heads, d_v / heads);
    // Grouped-query layers: K and V have kv_heads heads, query head h reads K/V head h / ratio.
    let ratio = heads / dims.kv_heads;
    let (dk_kv, dv_kv) = (dims.kv_heads * dk_h, dims.kv_heads * dv_h);
    let scale = f64::from(dims.scale);
    let f64_2d = |w: &ArrayView2<'_, f32>| w.mapv(f64::from);
    let w_o = proj.and_then(|p| p.w_o.as_ref().map(f64_2d));
    let weights = proj.map(|p| (f64_2d(&p.w_q), f64_2d(&p.w_k), f64_2d(&p.w_v)));

    let mut g = LayerGradients {
        x: Array3::<f64>::zeros((batch, n, d)).into_dyn(),
        w_q: weights.as_ref().map(|_| Array2::zeros((d, d_k))),
        w_k: weights.as_ref().map(|_| Array2::zeros((d, dk_kv))),
        w_v: weights.as_ref().map(|_| Array2::zeros((d, dv_kv))),
        b_q: proj.and_then(|p| p.b_q).map(|_| Array1::zeros(d_k)),
        b_k: proj.and_then(|p| p.b_k).map(|_| Array1::zeros(dk_kv)),
        b_v: proj.and_then(|p| p.b_v).map(|_| Array1::zeros(dv_kv)),
        w_o: w_o.as_ref().map(|_| Array2::zeros((d_v, d_out))),
        b_o: proj.and_then(|p| p.b_o).map(|_| Array1::zeros(d_out)),
        relative_bias: None,
    };
    // A relative bias table's gradient, summed over the batch.
    let mut layer_table = None;
    for b in 0..batch {
        let xb = x3.index_axis(Axis(0), b).to_owned();
        let d_ob = d_o3.index_axis(Axis(0), b);
        let (q, k, v) = match proj {
            None => (xb.clone(), xb.clone(), xb.clone()),
            Some(p) => (
                project(&xb, &p.w_q, p.b_q.as_ref()),
                project(&xb, &p.w_k, p.b_k.as_ref()),
                project(&xb, &p.w_v, p.b_v.as_ref()),
            ),
        };
        let head_cols = |h: usize, w: usize| s![.., h * w..(h + 1) * w];
        // Through the output projection: out = C·W_O + b_O, so dC = dO·W_Oᵀ, dW_O = Cᵀ·dO.
        let d_context = match &w_o {
            None => d_ob.to_owned(),
            Some(w_o) => {
                let mut context = Array2::<f64>::zeros((n, d_v));
                for h in 0..heads {
                    let at = bias.as_ref().map(|m| (m, b, h));
                    let g = h / ratio;
                    let (qh, kh) = (q.slice(head_cols(h, dk_h)), k.slice(head_cols(g, dk_h)));
                    let (_, c) = head(
                        qh,
                        kh,
                        v.slice(head_cols(g, dv_h)),
                        scale,
                        dims.causal,
                        at,
                        mods.map(|m| (m, b, h)),
                    );
                    context.slice_mut(head_cols(h, dv_h)).assign(&c);
                }
                if let Some(gw) = g.w_o.as_mut() {
                    *gw += &context.t().dot(&d_ob);
                }
                d_ob.dot(&w_o.t())
            }
        };
        if let Some(gb) = g.b_o.as_mut() {
            *gb += &d_ob.sum_axis(Axis(0));
        }
        // Each head's Q, K, V gradients, in the heads-concatenated columns they came from.
        let mut grad_q = Array2::<f64>::zeros((n, d_k));
        let mut grad_k = Array2::<f64>::zeros((n, dk_kv));
        let mut grad_v = Array2::<f64>::zeros((n, dv_kv));
        for h in 0..heads {
            let at = bias.as_ref().map(|m| (m, b, h));
            // A shared K/V head's gradient sums its query heads'.
            let g = h / ratio;
            let (gq, gk, gv, gt) = head_backward(
                q.slice(head_cols(h, dk_h)),
                k.slice(head_cols(g, dk_h)),
                v.slice(head_cols(g, dv_h)),
                d_context.slice(head_cols(h, dv_h)),
                scale,
                dims.causal,
                (at, mods.map(|m| (m, b, h))),
            );
            grad_q.slice_mut(head_cols(h, dk_h)).assign(&gq);
            if let Some(gt) = gt {
                let t = g_table(&mut layer_table, gt.len(), heads);
                t.column_mut(h).scaled_add(1.0, &Array1::from(gt));
            }
            let mut k_cols = grad_k.slice_mut(head_cols(g, dk_h));
            k_cols += &gk;
            let mut v_cols = grad_v.slice_mut(head_cols(g, dv_h));
            v_cols += &gv;
        }
        // Through the projections: Q = X·W_Q + b_Q gives dW_Q = Xᵀ·dQ, db_Q = Σ_rows dQ,
        // and X's share dQ·W_Qᵀ; likewise K and V. Without them Q = K = V = X.
        let d_x = match &weights {
            None => &grad_q + &grad_k + &grad_v,
            Some((w_q, w_k, w_v)) => {
                let pairs = [
                    (g.w_q.as_mut(), g.b_q.as_mut(), &grad_q),
                    (g.w_k.as_mut(), g.b_k.as_mut(), &grad_k),
                    (g.w_v.as_mut(), g.b_v.as_mut(), &grad_v),
                ];
                for (gw, gb, dy) in pairs {
                    if let Some(gw) = gw {
                        *gw += &xb.t().dot(dy);
                    }
                    if let Some(gb) = gb {
                        *gb += &dy.sum_axis(Axis(0));
                    }
                }
                grad_q.dot(&w_q.t()) + grad_k.dot(&w_k.t()) + grad_v.dot(&w_v.t())
            }
        };
        g.x.index_axis_mut(Axis(0), b).assign(&d_x);
    }
    g.x =
        g.x.into_shape_with_order(IxDyn(x.shape()))
            .map_err(shape_err)?;
    g.relative_bias = layer_table;
    Ok(g)
}
