//! Shapes and validation: the sizes of a call ([`Dims`]), checked against every option, and
//! the inputs' values (finite, within f16's range when stored as f16).

use ndarray::ArrayViewD;

use super::call::heads_first;
use super::inputs::{Inputs, Kind, Operands};
use super::projections::{check_projections, Projections};
use super::{check_finite, Attention, Dtype};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::values::check_f16_range;

/// The sizes of one problem, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Dims {
    /// Whether X had a batch axis.
    pub batched: bool,
    /// Batch size (1 without a batch axis).
    pub batch: usize,
    /// Sequence length.
    pub n: usize,
    /// Embedding width of X.
    pub d: usize,
    /// Query/key width (all query heads; K is `d_k · kv_heads / heads` wide).
    pub d_k: usize,
    /// Value width of the context (all query heads; V is `d_v · kv_heads / heads` wide).
    pub d_v: usize,
    /// Output width: `W_O`'s columns, else `d_v`.
    pub d_out: usize,
    /// Heads.
    pub heads: usize,
    /// K/V heads: `heads` divides by it; fewer for grouped-query attention, where query head
    /// `h` reads K/V head `h / (heads / kv_heads)`.
    pub kv_heads: usize,
    /// Scale applied to `Q·Kᵀ`.
    pub scale: f32,
    /// Causal mask.
    pub causal: bool,
}

impl Dims {
    /// The sizes of `op` on `inputs`, checked: shapes that pair up, heads that divide the
    /// widths, projections that fit X, a valid scale. What [`Attention::plan`] takes.
    ///
    /// # Errors
    /// As [`Attention::run`]'s shape and option errors.
    pub fn new<K: Kind>(op: &Attention, inputs: &Inputs<'_, K>) -> Result<Dims> {
        match &inputs.operands {
            Operands::X(x) => op.dims(K::shape(x), inputs.projections.as_ref()),
            Operands::Qkv([q, k, v]) => {
                let shapes = [K::shape(q), K::shape(k), K::shape(v)];
                if K::HEADS_SECOND {
                    op.sdpa_dims(shapes[0], shapes[1], shapes[2])
                } else {
                    let [q, k, v] = [(shapes[0], "Q"), (shapes[1], "K"), (shapes[2], "V")]
                        .map(|(s, name)| heads_first(s, name));
                    op.sdpa_dims(&q?, &k?, &v?)
                }
            }
        }
    }

    /// Shape of the context output.
    pub fn context_shape(&self) -> Vec<usize> {
        let mut s = vec![self.n, self.d_out];
        if self.batched {
            s.insert(0, self.batch);
        }
        s
    }

    /// Shape of the weights output.
    pub fn weights_shape(&self) -> Vec<usize> {
        let mut s = vec![self.n, self.n];
        if self.heads > 1 {
            s.insert(0, self.heads);
        }
        if self.batched {
            s.insert(0, self.batch);
        }
        s
    }

    /// Floating-point operations of the attention itself (projections excluded):
    /// `2·n·n·(d_k + d_v)` per batch index.
    pub fn attention_flops(&self) -> f64 {
        2.0 * (self.batch * self.n * self.n) as f64 * (self.d_k + self.d_v) as f64
    }

    /// Floating-point operations of the three projections: `2·n·d·(d_k + (d_k + d_v)·kv/H)`
    /// per batch index (`2·n·d·(2·d_k + d_v)` without grouped-query heads).
    pub fn projection_flops(&self) -> f64 {
        let kv = (self.d_k + self.d_v) * self.kv_heads / self.heads;
        2.0 * (self.batch * self.n * self.d) as f64 * (self.d_k + kv) as f64
    }
}

impl Attention {
    /// Checks every shape and option against `x` and the projections.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] or [`Error::InvalidArgument`] naming what is wrong.
    pub(crate) fn dims(&self, x_shape: &[usize], proj: Option<&Projections<'_>>) -> Result<Dims> {
        let (batched, batch, n, d) = match *x_shape {
            [n, d] => (false, 1, n, d),
            [b, n, d] => (true, b, n, d),
            _ => {
                return Err(Error::shape(format!(
                    "X must be (n, d) or (batch, n, d), got shape {x_shape:?}"
                )))
            }
        };
        if n == 0 {
            return Err(Error::invalid("X", "empty sequence (n = 0)"));
        }
        if d == 0 {
            return Err(Error::invalid("X", "zero-width embeddings (d = 0)"));
        }
        if batch == 0 {
            return Err(Error::invalid("X", "empty batch (batch = 0)"));
        }
        if self.heads == 0 {
            return Err(Error::invalid("heads", "must be at least 1"));
        }
        let (d_k, d_v, d_out, kv_heads) = match proj {
            None => (d, d, d, self.heads),
            Some(p) => {
                let w = check_projections(d, self.heads, p)?;
                (w.d_k, w.d_v, w.d_out, w.kv_heads)
            }
        };
        if d_k % self.heads != 0 {
            return Err(Error::invalid(
                "heads",
                format!("d_k = {d_k} does not divide by heads = {}", self.heads),
            ));
        }
        if d_v % self.heads != 0 {
            return Err(Error::invalid(
                "heads",
                format!("d_v = {d_v} does not divide by heads = {}", self.heads),
            ));
        }
        let scale = match self.scale {
            Some(s) if !s.is_finite() => {
                return Err(Error::invalid("scale", format!("must be finite, got {s}")))
            }
            Some(s) => s,
            None => 1.0 / ((d_k / self.heads) as f32).sqrt(),
        };
        Ok(Dims {
            batched,
            batch,
            n,
            d,
            d_k,
            d_v,
            d_out,
            heads: self.heads,
            kv_heads,
            scale,
            causal: self.causal,
        })
    }

    /// Checks the shapes of a call on Q, K, V (PyTorch's layout; [`Dims::new`] for
    /// `Inputs::qkv`); the returned [`Dims`] describe it
    /// with `n = L` and widths over all heads.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] or [`Error::InvalidArgument`] naming what is wrong.
    pub(crate) fn sdpa_dims(&self, q: &[usize], k: &[usize], v: &[usize]) -> Result<Dims> {
        let [b, h, l, e] = *q else {
            return Err(Error::shape(format!(
                "Q must be (batch, heads, L, E), got {q:?}"
            )));
        };
        let ([kb, kh, s_len, ke], [vb, vh, vs, ev]) = match (k, v) {
            (&[a, b2, c, d], &[w, x, y, z]) => ([a, b2, c, d], [w, x, y, z]),
            _ => {
                return Err(Error::shape(format!(
                    "K and V must be (batch, heads, S, E) and (batch, heads, S, E_v), got {k:?} and {v:?}"
                )))
            }
        };
        if kb != b || vb != b || (vh, vb) != (kh, kb) {
            return Err(Error::shape(format!(
                "Q {q:?}, K {k:?} and V {v:?} must share the batch, and K and V the heads"
            )));
        }
        if kh == 0 || h % kh != 0 {
            return Err(Error::shape(format!(
                "Q has {h} heads and K, V {kh}: for grouped-query attention the Q heads must \
                 be a multiple of the K/V heads"
            )));
        }
        if ke != e {
            return Err(Error::shape(format!(
                "Q {q:?} and K {k:?} must have the same width E"
            )));
        }
        if vs != s_len {
            return Err(Error::shape(format!(
                "K {k:?} and V {v:?} must have the same length S"
            )));
        }
        for (name, len) in [
            ("batch", b),
            ("heads", h),
            ("L", l),
            ("S", s_len),
            ("E", e),
            ("E_v", ev),
        ] {
            if len == 0 {
                return Err(Error::invalid("Q, K, V", format!("{name} is 0")));
            }
        }
        let scale = match self.scale {
            Some(s) if !s.is_finite() => {
                return Err(Error::invalid("scale", format!("must be finite, got {s}")))
            }
            Some(s) => s,
            None => 1.0 / (e as f32).sqrt(),
        };
        Ok(Dims {
            batched: true,
            batch: b,
            n: l,
            d: h * e,
            d_k: h * e,
            d_v: h * ev,
            d_out: h * ev,
            heads: h,
            kv_heads: kh,
            scale,
            causal: self.causal,
        })
    }

    /// Whether the operands are stored as f16.
    pub(super) fn f16(&self) -> bool {
        self.dtype == Dtype::F16
    }

    /// Every value of `inputs`: no NaN or infinity (unless passed through), and with f16
    /// operands [`Attention::check_dtype`]; errors name the caller's index. What a call that
    /// splits checks first (a whole call checks its operands while uploading them).
    pub(super) fn check_values(
        &self,
        ctx: &Context,
        inputs: &[(&str, ArrayViewD<'_, f32>)],
    ) -> Result<()> {
        if !self.propagate {
            for (name, a) in inputs {
                check_finite(name, a)?;
            }
        }
        self.check_dtype(ctx, inputs)
    }

    /// With f16 operands: the device can run them, and every input is within f16's range.
    pub(super) fn check_dtype(
        &self,
        ctx: &Context,
        inputs: &[(&str, ArrayViewD<'_, f32>)],
    ) -> Result<()> {
        if !self.f16() {
            return Ok(());
        }
        ctx.require_f16()?;
        for (name, a) in inputs {
            check_f16_range(name, a)?;
        }
        Ok(())
    }
}

/// Every input array of a forward call, named: X, then the weights, then the biases.
pub(super) fn named_inputs<'v>(
    x: &'v ArrayViewD<'_, f32>,
    proj: Option<&'v Projections<'_>>,
) -> Vec<(&'static str, ArrayViewD<'v, f32>)> {
    let mut inputs = vec![("X", x.view())];
    if let Some(p) = proj {
        let weights = [
            ("W_Q", Some(&p.w_q)),
            ("W_K", Some(&p.w_k)),
            ("W_V", Some(&p.w_v)),
            ("W_O", p.w_o.as_ref()),
        ];
        inputs.extend(
            weights
                .into_iter()
                .filter_map(|(n, w)| Some((n, w?.view().into_dyn()))),
        );
        let biases = [
            ("b_Q", p.b_q.as_ref()),
            ("b_K", p.b_k.as_ref()),
            ("b_V", p.b_v.as_ref()),
            ("b_O", p.b_o.as_ref()),
        ];
        inputs.extend(
            biases
                .into_iter()
                .filter_map(|(n, b)| Some((n, b?.view().into_dyn()))),
        );
    }
    inputs
}

pub(crate) fn check_inputs_finite(
    x: &ArrayViewD<'_, f32>,
    proj: Option<&Projections<'_>>,
) -> Result<()> {
    for (name, a) in named_inputs(x, proj) {
        check_finite(name, &a)?;
    }
    Ok(())
}
