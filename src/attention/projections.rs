//! The projection weights of a layer (`X·W` orientation), their shapes checked against X.

use ndarray::{ArrayView1, ArrayView2};

use crate::error::{Error, Result};

/// The projection weights of one attention layer, in the `X·W` orientation:
/// `Q = X·W_Q + b_Q`, `K = X·W_K + b_K`, `V = X·W_V + b_V`.
///
/// `W_Q` and `W_K` are `(d, d_k)`, `W_V` is `(d, d_v)`, the biases `(d_k,)` and `(d_v,)`.
/// PyTorch's `nn.Linear(d, d_k).weight` is stored `(d_k, d)`: pass its transpose
/// (`linear.weight.T`, or `.t()` on an ndarray view, which costs nothing).
///
/// Built with [`Projections::new`], then [`Projections::with_bias`] (or
/// [`Projections::with_biases`], each its own) and [`Projections::with_output`]:
///
/// ```
/// use wgpu_attention::ndarray::{Array1, Array2};
/// use wgpu_attention::Projections;
/// let (w, b) = (Array2::<f32>::eye(8), Array1::<f32>::zeros(8));
/// let p = Projections::new(w.view(), w.view(), w.view()).with_biases(Some(b.view()), None, None);
/// assert!(p.b_q.is_some() && p.b_k.is_none());
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Projections<'a> {
    /// `W_Q`, `(d, d_k)`.
    pub w_q: ArrayView2<'a, f32>,
    /// `W_K`, `(d, d_k)`.
    pub w_k: ArrayView2<'a, f32>,
    /// `W_V`, `(d, d_v)`.
    pub w_v: ArrayView2<'a, f32>,
    /// `b_Q`, `(d_k,)`.
    pub b_q: Option<ArrayView1<'a, f32>>,
    /// `b_K`, `(d_k,)`.
    pub b_k: Option<ArrayView1<'a, f32>>,
    /// `b_V`, `(d_v,)`.
    pub b_v: Option<ArrayView1<'a, f32>>,
    /// The output projection `W_O`, `(d_v, d_out)`: the output is `context·W_O + b_O`, as
    /// `nn.MultiheadAttention`'s `out_proj` (pass `out_proj.weight.T`).
    pub w_o: Option<ArrayView2<'a, f32>>,
    /// `b_O`, `(d_out,)`.
    pub b_o: Option<ArrayView1<'a, f32>>,
}

/// Owned projection weights, as a checkpoint or a test case holds them: `(W_Q, W_K, W_V)`,
/// their biases, and the output projection.
pub type OwnedWeights = (
    ndarray::Array2<f32>,
    ndarray::Array2<f32>,
    ndarray::Array2<f32>,
);
/// Owned `(b_Q, b_K, b_V)`.
pub type OwnedBiases = (
    ndarray::Array1<f32>,
    ndarray::Array1<f32>,
    ndarray::Array1<f32>,
);
/// Owned `W_O` and optional `b_O`.
pub type OwnedOutput = (ndarray::Array2<f32>, Option<ndarray::Array1<f32>>);

impl<'a> Projections<'a> {
    /// The same views, borrowed for a shorter lifetime.
    pub(crate) fn reborrow<'b>(&self) -> Projections<'b>
    where
        'a: 'b,
    {
        Projections {
            w_q: self.w_q.reborrow(),
            w_k: self.w_k.reborrow(),
            w_v: self.w_v.reborrow(),
            b_q: self.b_q.map(|b| b.reborrow()),
            b_k: self.b_k.map(|b| b.reborrow()),
            b_v: self.b_v.map(|b| b.reborrow()),
            w_o: self.w_o.map(|w| w.reborrow()),
            b_o: self.b_o.map(|b| b.reborrow()),
        }
    }

    /// Views of owned weights, biases (all three or none) and output projection.
    pub fn of(
        (w_q, w_k, w_v): &'a OwnedWeights,
        biases: Option<&'a OwnedBiases>,
        output: Option<&'a OwnedOutput>,
    ) -> Self {
        let p = Projections::new(w_q.view(), w_k.view(), w_v.view());
        let p = match biases {
            Some((q, k, v)) => p.with_bias(q.view(), k.view(), v.view()),
            None => p,
        };
        match output {
            Some((w, b)) => p.with_output(w.view(), b.as_ref().map(|b| b.view())),
            None => p,
        }
    }

    /// Weights without biases.
    pub fn new(
        w_q: ArrayView2<'a, f32>,
        w_k: ArrayView2<'a, f32>,
        w_v: ArrayView2<'a, f32>,
    ) -> Self {
        Projections {
            w_q,
            w_k,
            w_v,
            b_q: None,
            b_k: None,
            b_v: None,
            w_o: None,
            b_o: None,
        }
    }

    /// Adds the output projection `W_O (d_v, d_out)` and its optional bias `(d_out,)`.
    pub fn with_output(
        mut self,
        w_o: ArrayView2<'a, f32>,
        b_o: Option<ArrayView1<'a, f32>>,
    ) -> Self {
        self.w_o = Some(w_o);
        self.b_o = b_o;
        self
    }

    /// Sets the biases, each present or not on its own (`None`: that projection has none).
    pub fn with_biases(
        mut self,
        b_q: Option<ArrayView1<'a, f32>>,
        b_k: Option<ArrayView1<'a, f32>>,
        b_v: Option<ArrayView1<'a, f32>>,
    ) -> Self {
        (self.b_q, self.b_k, self.b_v) = (b_q, b_k, b_v);
        self
    }

    /// Adds the biases.
    pub fn with_bias(
        self,
        b_q: ArrayView1<'a, f32>,
        b_k: ArrayView1<'a, f32>,
        b_v: ArrayView1<'a, f32>,
    ) -> Self {
        self.with_biases(Some(b_q), Some(b_k), Some(b_v))
    }
}

/// Checks the projections against X's width `d` and `heads` (at least 1).
pub(crate) fn check_projections(d: usize, heads: usize, p: &Projections<'_>) -> Result<Widths> {
    let (wq, wk, wv) = (p.w_q.shape(), p.w_k.shape(), p.w_v.shape());
    for (name, w) in [("W_Q", wq), ("W_K", wk), ("W_V", wv)] {
        if w[0] != d {
            return Err(Error::shape(format!(
                "{name} is {w:?} but X has d = {d} columns, so {name} must have {d} rows \
                 (weights are (d, d_out), the X·W orientation; PyTorch's nn.Linear.weight is the transpose)"
            )));
        }
        if w[1] == 0 {
            return Err(Error::invalid(name, "has zero columns"));
        }
    }
    // Grouped-query attention: K and V have H_kv = H / r heads of the query heads' widths,
    // so W_K is r times narrower than W_Q.
    let ratio = match (wq[1] % wk[1], wq[1] / wk[1]) {
        (0, r) if r >= 1 && heads.is_multiple_of(r) => r,
        _ => {
            return Err(Error::shape(format!(
                "W_Q is {wq:?} and W_K is {wk:?}: queries and keys must have the same width d_k, \
                 or for grouped-query attention W_K must be r times narrower with r dividing \
                 heads = {heads}"
            )))
        }
    };
    let kv_heads = heads / ratio;
    if ratio > 1 && !wv[1].is_multiple_of(kv_heads) {
        return Err(Error::shape(format!(
            "W_V is {wv:?}: its width must divide by the {kv_heads} K/V heads"
        )));
    }
    // The context has every query head's value width: W_V's times the ratio.
    let (d_k, d_v) = (wq[1], wv[1] * ratio);
    let d_out = match p.w_o {
        None => d_v,
        Some(w_o) => {
            if w_o.nrows() != d_v {
                return Err(Error::shape(format!(
                    "W_O is {:?} but the context has d_v = {d_v} columns, so W_O must have {d_v} rows \
                     (out_proj.weight of nn.MultiheadAttention is the transpose)",
                    w_o.shape()
                )));
            }
            if w_o.ncols() == 0 {
                return Err(Error::invalid("W_O", "has zero columns"));
            }
            w_o.ncols()
        }
    };
    if let (Some(b), true) = (p.b_o, p.w_o.is_none()) {
        return Err(Error::invalid(
            "b_O",
            format!("given ({} values) without W_O", b.len()),
        ));
    }
    for (name, b, want) in [
        ("b_Q", p.b_q, d_k),
        ("b_K", p.b_k, wk[1]),
        ("b_V", p.b_v, wv[1]),
        ("b_O", p.b_o, d_out),
    ] {
        if let Some(b) = b {
            if b.len() != want {
                return Err(Error::shape(format!(
                    "{name} has length {} but its projection has {want} columns",
                    b.len()
                )));
            }
        }
    }
    Ok(Widths {
        d_k,
        d_v,
        d_out,
        kv_heads,
    })
}

/// The widths a layer's projections give, checked: over all heads, and the K/V heads.
pub(crate) struct Widths {
    /// Query/key width over every query head (`W_Q`'s columns).
    pub d_k: usize,
    /// The context's width over every query head.
    pub d_v: usize,
    /// The output's width (`W_O`'s columns, else `d_v`).
    pub d_out: usize,
    /// K/V heads (fewer than the query heads for grouped-query attention).
    pub kv_heads: usize,
}
