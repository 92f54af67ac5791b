//! What a call returns: one [`Output`] for every forward, one [`Gradients`] for every
//! backward, and the [`Saved`] state between them. Each is generic over where its values
//! live: `ArrayD<f32>` on the host (arrays in) or [`Tensor`] on the device (tensors in).

use std::sync::Arc;

use ndarray::{ArrayD, Ix4};

use super::gradients::{LayerGradients, SdpaGradients};
use super::inputs::{Host, Kind, OnDevice, Operand};
use super::layer_saved::{LayerSaved, TensorGradients};
use super::saved::{SdpaSaved, SdpaTensorGradients};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::tensor::{Recorder, Tensor};

/// What a forward returns: the context, the attention weights when asked for, and what the
/// backward needs when asked to save it. `T` is `ArrayD<f32>` for arrays in and [`Tensor`]
/// for tensors in (the CPU reference returns `ArrayD<f64>`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Output<T = ArrayD<f32>> {
    /// The context vectors: `(n, d_out)` or `(batch, n, d_out)` for X (heads concatenated
    /// along the last axis), `(batch, heads, L, E_v)` for Q, K, V arrays and
    /// `(batch, L, heads, E_v)` for Q, K, V tensors.
    pub context: T,
    /// The attention weights, `(batch, heads, L, S)` (for X without a batch or with one
    /// head, the axes it lacks are left out: `(n, n)`, `(batch, n, n)`, `(H, n, n)`); `None`
    /// unless [`crate::Attention::return_weights`] is on and the call is not saved.
    pub weights: Option<T>,
    /// What [`Saved::backward`] needs, kept on the device; `None` unless
    /// [`crate::Attention::save_for_backward`] is on.
    pub saved: Option<Saved>,
}

impl<T> Output<T> {
    pub(crate) fn new(context: T, weights: Option<T>) -> Self {
        Output {
            context,
            weights,
            saved: None,
        }
    }

    pub(crate) fn with_saved(mut self, saved: Saved) -> Self {
        self.saved = Some(saved);
        self
    }
}

/// The gradients of a scalar loss `ℓ` with respect to every input of a saved forward, given
/// `dO = ∂ℓ/∂output` (the context's shape). A field is `Some` exactly when the forward had
/// that input:
///
/// - Q, K, V given: [`Gradients::q`], [`Gradients::k`], [`Gradients::v`], each in its
///   input's shape. With grouped-query attention the gradient of a shared K/V head sums the
///   query heads that read it.
/// - X given: [`Gradients::x`] (X's shape; without projections it sums X's three uses), and
///   one gradient per projection weight and bias given, in the `X·W` orientation of
///   [`crate::Projections`] (PyTorch's `nn.Linear(d, d_k).weight.grad` is the transpose of
///   [`Gradients::w_q`]), summed over the batch.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Gradients<T = ArrayD<f32>> {
    /// `∂ℓ/∂Q`, `(batch, heads, L, E)` (tensors: `(batch, L, heads, E)`).
    pub q: Option<T>,
    /// `∂ℓ/∂K`, K's shape.
    pub k: Option<T>,
    /// `∂ℓ/∂V`, V's shape.
    pub v: Option<T>,
    /// `∂ℓ/∂X`, X's shape.
    pub x: Option<T>,
    /// `∂ℓ/∂W_Q`, `(d, d_k)`.
    pub w_q: Option<T>,
    /// `∂ℓ/∂W_K`, `(d, d_k)`.
    pub w_k: Option<T>,
    /// `∂ℓ/∂W_V`, `(d, d_v)`.
    pub w_v: Option<T>,
    /// `∂ℓ/∂b_Q`, `(d_k,)`.
    pub b_q: Option<T>,
    /// `∂ℓ/∂b_K`, `(d_k,)`.
    pub b_k: Option<T>,
    /// `∂ℓ/∂b_V`, `(d_v,)`.
    pub b_v: Option<T>,
    /// `∂ℓ/∂W_O`, `(d_v, d_out)`.
    pub w_o: Option<T>,
    /// `∂ℓ/∂b_O`, `(d_out,)`.
    pub b_o: Option<T>,
    /// `∂ℓ/∂table` of the modifiers' relative position bias
    /// ([`crate::modifiers::Preset::RelativeBias`]), `(buckets, heads)` as the table is
    /// laid out; `None` without one.
    pub relative_bias: Option<T>,
}

impl<T> Default for Gradients<T> {
    fn default() -> Self {
        Gradients {
            q: None,
            k: None,
            v: None,
            x: None,
            w_q: None,
            w_k: None,
            w_v: None,
            b_q: None,
            b_k: None,
            b_v: None,
            w_o: None,
            b_o: None,
            relative_bias: None,
        }
    }
}

impl<E: Clone> From<SdpaGradients<E>> for Gradients<ArrayD<E>> {
    fn from(g: SdpaGradients<E>) -> Self {
        Gradients {
            q: Some(g.q.into_dyn()),
            k: Some(g.k.into_dyn()),
            v: Some(g.v.into_dyn()),
            relative_bias: g.relative_bias.map(|a| a.into_dyn()),
            ..Gradients::default()
        }
    }
}

impl<E: Clone> From<LayerGradients<E>> for Gradients<ArrayD<E>> {
    fn from(g: LayerGradients<E>) -> Self {
        Gradients {
            x: Some(g.x),
            w_q: g.w_q.map(|a| a.into_dyn()),
            w_k: g.w_k.map(|a| a.into_dyn()),
            w_v: g.w_v.map(|a| a.into_dyn()),
            b_q: g.b_q.map(|a| a.into_dyn()),
            b_k: g.b_k.map(|a| a.into_dyn()),
            b_v: g.b_v.map(|a| a.into_dyn()),
            w_o: g.w_o.map(|a| a.into_dyn()),
            b_o: g.b_o.map(|a| a.into_dyn()),
            relative_bias: g.relative_bias.map(|a| a.into_dyn()),
            ..Gradients::default()
        }
    }
}

impl From<SdpaTensorGradients> for Gradients<Tensor> {
    fn from(g: SdpaTensorGradients) -> Self {
        Gradients {
            q: Some(g.q),
            k: Some(g.k),
            v: Some(g.v),
            relative_bias: g.relative_bias,
            ..Gradients::default()
        }
    }
}

impl From<TensorGradients> for Gradients<Tensor> {
    fn from(g: TensorGradients) -> Self {
        Gradients {
            x: Some(g.x),
            w_q: g.w_q,
            w_k: g.w_k,
            w_v: g.w_v,
            b_q: g.b_q,
            b_k: g.b_k,
            b_v: g.b_v,
            w_o: g.w_o,
            b_o: g.b_o,
            relative_bias: g.relative_bias,
            ..Gradients::default()
        }
    }
}

impl Gradients<Tensor> {
    /// Reads every gradient back.
    ///
    /// # Errors
    /// [`Error::Overflow`] for a gradient that overflowed; a recorder not yet submitted;
    /// another context; GPU errors.
    pub fn to_arrays(&self, ctx: &Context) -> Result<Gradients> {
        let read = |t: &Option<Tensor>, what: &str| -> Result<Option<ArrayD<f32>>> {
            t.as_ref()
                .map(|t| {
                    let a = t.to_array(ctx)?;
                    if let Some(s) = a.as_slice() {
                        crate::values::check_overflow(what, crate::Dtype::F32, s)?;
                    }
                    Ok(a)
                })
                .transpose()
        };
        Ok(Gradients {
            q: read(&self.q, "gradient dQ")?,
            k: read(&self.k, "gradient dK")?,
            v: read(&self.v, "gradient dV")?,
            x: read(&self.x, "gradient dX")?,
            w_q: read(&self.w_q, "gradient dW_Q")?,
            w_k: read(&self.w_k, "gradient dW_K")?,
            w_v: read(&self.w_v, "gradient dW_V")?,
            b_q: read(&self.b_q, "gradient db_Q")?,
            b_k: read(&self.b_k, "gradient db_K")?,
            b_v: read(&self.b_v, "gradient db_V")?,
            w_o: read(&self.w_o, "gradient dW_O")?,
            b_o: read(&self.b_o, "gradient db_O")?,
            relative_bias: read(&self.relative_bias, "gradient of the relative bias table")?,
        })
    }
}

/// What a saved forward keeps on the device for its backward: the operands as uploaded, the
/// output, each query row's log-sum-exp, the mask, and which [`Context`] holds them. Cloning
/// it clones a handle. A backward of a [`crate::Layer`]'s forward after the layer's weights
/// were updated is an error, not wrong gradients.
#[derive(Clone)]
pub struct Saved(Arc<SavedKind>);

// Always behind the `Arc` of a `Saved`: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum SavedKind {
    Sdpa(SdpaSaved),
    Layer(LayerSaved),
}

impl std::fmt::Debug for Saved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &*self.0 {
            SavedKind::Sdpa(s) => s.fmt(f),
            SavedKind::Layer(s) => s.fmt(f),
        }
    }
}

impl From<SdpaSaved> for Saved {
    fn from(s: SdpaSaved) -> Self {
        Saved(Arc::new(SavedKind::Sdpa(s)))
    }
}

impl From<LayerSaved> for Saved {
    fn from(s: LayerSaved) -> Self {
        Saved(Arc::new(SavedKind::Layer(s)))
    }
}

impl Saved {
    /// The gradients of a loss with respect to the forward's inputs, from
    /// `dO = ∂ℓ/∂output` (the context's shape), computed on the device by the fused
    /// FlashAttention-2 backward. `d_o` is an array (gradients come back as arrays) or a
    /// tensor (they stay on the device); see [`Gradients`] for which are given.
    ///
    /// ```
    /// use wgpu_attention::{Attention, Context, Inputs, ndarray::Array4};
    /// # fn main() -> wgpu_attention::Result<()> {
    /// let ctx = Context::new()?;
    /// let q = Array4::from_shape_fn((1, 2, 5, 8), |(_, h, i, e)| {
    ///     ((h * 40 + i * 8 + e) as f32).sin()
    /// });
    /// let (k, v) = (q.mapv(|x| 0.5 * x), q.mapv(|x| x + 1.0));
    /// let op = Attention::new().causal(true).save_for_backward(true);
    /// let out = op.run(&ctx, Inputs::qkv(&q, &k, &v))?;
    /// let saved = out.saved.expect("the op saves for the backward");
    /// let d_o = out.context.mapv(|o| 2.0 * o); // ℓ = Σ O², so dO = 2·O
    /// let grads = saved.backward(&ctx, d_o.view())?;
    /// assert_eq!(grads.q.unwrap().shape(), q.shape());
    /// assert_eq!(grads.v.unwrap().shape(), v.shape());
    /// assert!(grads.x.is_none()); // the forward had Q, K, V, not X
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A `dO` not of the output's shape, NaN/Inf in `dO`, another context, a layer updated
    /// since the forward, a result that overflowed, and GPU errors.
    pub fn backward<'a, O: Operand<'a>>(
        &self,
        ctx: &Context,
        d_o: O,
    ) -> Result<Gradients<<O::Kind as Kind>::Value>>
    where
        O::Kind: Backward,
    {
        O::Kind::backward(self, ctx, d_o.operand())
    }

    /// [`Saved::backward`] on a tensor `dO`, recorded into `rec` (submitted with it), so a
    /// forward, a loss and this backward can share one submit.
    ///
    /// # Errors
    /// As [`Saved::backward`].
    pub fn record_backward(
        &self,
        rec: &mut Recorder<'_>,
        d_o: &Tensor,
    ) -> Result<Gradients<Tensor>> {
        Ok(match &*self.0 {
            SavedKind::Sdpa(s) => s.record_backward(rec, d_o)?.into(),
            SavedKind::Layer(s) => s.record_backward(rec, d_o)?.into(),
        })
    }

    /// Each query row's log-sum-exp of its scaled, masked scores (natural log), `(batch,
    /// heads, L)`; a row with nothing to attend to gives `-inf` (PyTorch's `logsumexp` of
    /// nothing).
    ///
    /// # Errors
    /// A forward on X (only Q, K, V forwards keep it in this form), and GPU errors.
    pub fn log_sum_exp(&self, ctx: &Context) -> Result<ArrayD<f32>> {
        match &*self.0 {
            SavedKind::Sdpa(s) => Ok(s.log_sum_exp(ctx)?.into_dyn()),
            SavedKind::Layer(_) => Err(Error::invalid(
                "saved forward",
                "the log-sum-exp is read back for forwards on Q, K, V only",
            )),
        }
    }
}

/// How a backward runs for each [`Kind`] of `dO`.
#[doc(hidden)]
pub trait Backward: Kind {
    /// Runs the backward of `saved` from `d_o`.
    fn backward(saved: &Saved, ctx: &Context, d_o: Self::Ref<'_>)
        -> Result<Gradients<Self::Value>>;
}

impl Backward for Host {
    fn backward(saved: &Saved, ctx: &Context, d_o: Self::Ref<'_>) -> Result<Gradients> {
        Ok(match &*saved.0 {
            SavedKind::Sdpa(s) => {
                let shape = d_o.shape().to_vec();
                let d_o = d_o.into_dimensionality::<Ix4>().map_err(|_| {
                    Error::shape(format!(
                        "dO must be (batch, heads, L, E_v) like the output, got {shape:?}"
                    ))
                })?;
                s.backward(ctx, d_o)?.into()
            }
            SavedKind::Layer(s) => s.backward(ctx, d_o)?.into(),
        })
    }
}

impl Backward for OnDevice {
    fn backward(saved: &Saved, ctx: &Context, d_o: &Tensor) -> Result<Gradients<Tensor>> {
        Ok(match &*saved.0 {
            SavedKind::Sdpa(s) => s.backward_tensor(ctx, d_o)?.into(),
            SavedKind::Layer(s) => s.backward_tensor(ctx, d_o)?.into(),
        })
    }
}
