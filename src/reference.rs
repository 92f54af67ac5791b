//! The CPU oracle: the same definition as the GPU path, written plainly with `ndarray` and
//! accumulated in f64. Slow on purpose; obviously right is the point.

use ndarray::{s, Array1, Array2, ArrayD, ArrayView2, ArrayView4, ArrayViewD, Axis, IxDyn};

use crate::attention::{check_inputs_finite, Attention, Dims, Output, Projections};
use crate::error::{Error, Result};

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
    let m = logits[..visible]
        .iter()
        .copied()
        .fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits[..visible].iter().map(|&t| (t - m).exp()).collect();
    let sum: f64 = e.iter().sum();
    let mut out = vec![0.0; logits.len()];
    for (o, v) in out.iter_mut().zip(e) {
        *o = v / sum;
    }
    out
}

/// [`Attention::sdpa`] on the CPU in f64 (weights always returned): per (batch, head),
/// `softmax(scale·Q·Kᵀ)·V` with PyTorch's top-left causal mask.
///
/// # Errors
/// The same shape, option and finiteness errors as the GPU path.
pub fn sdpa(
    op: &Attention,
    q: ArrayView4<'_, f32>,
    k: ArrayView4<'_, f32>,
    v: ArrayView4<'_, f32>,
) -> Result<Output<f64>> {
    let dims = op.sdpa_dims(q.shape(), k.shape(), v.shape())?;
    crate::attention::check_finite("Q", &q)?;
    crate::attention::check_finite("K", &k)?;
    crate::attention::check_finite("V", &v)?;
    let (b, h, l, _) = q.dim();
    let (s_len, e_v) = (k.dim().2, v.dim().3);
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
            let scores = qm.dot(&km.t()) * scale;
            for i in 0..l {
                let visible = if dims.causal {
                    (i + 1).min(s_len)
                } else {
                    s_len
                };
                let row = softmax_row(scores.row(i).as_slice().expect("contiguous"), visible);
                weights
                    .slice_mut(s![bi, hi, i, ..])
                    .assign(&Array1::from(row));
            }
            let w = weights.slice(s![bi, hi, .., ..]);
            context.slice_mut(s![bi, hi, .., ..]).assign(&w.dot(&vm));
        }
    }
    Ok(Output {
        context: context.into_dyn(),
        weights: Some(weights.into_dyn()),
    })
}

/// Attention on the CPU in f64, with exactly the semantics of [`Attention::forward`]
/// (weights always returned).
///
/// # Errors
/// The same shape, option and finiteness errors as the GPU path.
pub fn attention(
    op: &Attention,
    x: ArrayViewD<'_, f32>,
    proj: Option<&Projections<'_>>,
) -> Result<Output<f64>> {
    let dims = op.dims(x.shape(), proj)?;
    check_inputs_finite(&x, proj)?;
    let Dims {
        batch,
        n,
        d,
        d_k,
        d_v,
        heads,
        scale,
        causal,
        ..
    } = dims;
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
        let (q, k, v) = match proj {
            None => (xb.clone(), xb.clone(), xb),
            Some(p) => (
                project(&xb, &p.w_q, p.b_q.as_ref()),
                project(&xb, &p.w_k, p.b_k.as_ref()),
                project(&xb, &p.w_v, p.b_v.as_ref()),
            ),
        };
        for h in 0..heads {
            let qh = q.slice(s![.., h * dk_h..(h + 1) * dk_h]);
            let kh = k.slice(s![.., h * dk_h..(h + 1) * dk_h]);
            let vh = v.slice(s![.., h * dv_h..(h + 1) * dv_h]);
            let logits = qh.dot(&kh.t()) * scale;
            let mut a = Array2::<f64>::zeros((n, n));
            for i in 0..n {
                let visible = if causal { i + 1 } else { n };
                let row: Vec<f64> = logits.row(i).to_vec();
                a.row_mut(i)
                    .assign(&Array1::from(softmax_row(&row, visible)));
            }
            context
                .slice_mut(s![b, .., h * dv_h..(h + 1) * dv_h])
                .assign(&a.dot(&vh));
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
    })
}

/// The largest `|scale · Σ_k |q_ik|·|k_jk||` over the problem: how big the logits can get,
/// which sets how much f32 rounding the softmax can amplify.
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
            let ka = k.slice(s![.., h * dk_h..(h + 1) * dk_h]).mapv(f64::abs);
            let m = qa.dot(&ka.t()).fold(0.0f64, |a, &v| a.max(v));
            bound = bound.max(m * f64::from(dims.scale).abs());
        }
    }
    Ok(bound)
}

/// Relative error `‖out − ref‖₂ / ‖ref‖₂` and max absolute error of a GPU result.
pub fn compare(out: &ArrayD<f32>, reference: &ArrayD<f64>) -> (f64, f64) {
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
