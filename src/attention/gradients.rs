//! What a backward pass computes, in the typed forms the internal backwards return before
//! they become the public [`crate::Gradients`]: the gradient of a scalar loss with respect
//! to every input of a forward call, each in the shape and orientation of its input.

use ndarray::{Array1, Array2, Array4, ArrayD};

/// The gradients of a loss `ℓ` with respect to the inputs of a forward on X
/// ([`Attention::run`] with `Inputs::x`), given `dO = ∂ℓ/∂output`; it becomes a
/// [`crate::Gradients`] with `x` and the projections' fields.
///
/// Each field has exactly the shape and orientation of the input it is the gradient of, so it
/// can be subtracted from that input as is. Weights are in the `X·W` orientation of
/// [`Projections`]: PyTorch's `nn.Linear(d, d_k).weight.grad` is the transpose of
/// [`LayerGradients::w_q`].
///
/// A field is `Some` exactly when its input was given: the weight gradients need
/// [`Projections`], each bias gradient its bias, [`LayerGradients::w_o`] the output projection.
/// Without projections (`Q = K = V = X`), [`LayerGradients::x`] sums the gradients of X's three
/// uses.
///
/// [`Attention::run`]: crate::Attention::run
/// [`Projections`]: crate::Projections
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LayerGradients<T = f32> {
    /// `∂ℓ/∂X`: X's shape, `(n, d)` or `(batch, n, d)`.
    pub x: ArrayD<T>,
    /// `∂ℓ/∂W_Q`, `(d, d_k)`; summed over the batch.
    pub w_q: Option<Array2<T>>,
    /// `∂ℓ/∂W_K`, `(d, d_k)`; summed over the batch.
    pub w_k: Option<Array2<T>>,
    /// `∂ℓ/∂W_V`, `(d, d_v)`; summed over the batch.
    pub w_v: Option<Array2<T>>,
    /// `∂ℓ/∂b_Q`, `(d_k,)`: the column sums of `∂ℓ/∂Q` over every batch index and row.
    pub b_q: Option<Array1<T>>,
    /// `∂ℓ/∂b_K`, `(d_k,)`.
    pub b_k: Option<Array1<T>>,
    /// `∂ℓ/∂b_V`, `(d_v,)`.
    pub b_v: Option<Array1<T>>,
    /// `∂ℓ/∂W_O`, `(d_v, d_out)`: `contextᵀ·dO` summed over the batch.
    pub w_o: Option<Array2<T>>,
    /// `∂ℓ/∂b_O`, `(d_out,)`: the column sums of `dO`.
    pub b_o: Option<Array1<T>>,
    /// With a relative bias among the modifiers: `∂ℓ/∂table`, `(buckets, heads)`.
    pub relative_bias: Option<Array2<T>>,
}

/// The gradients of a loss with respect to the inputs of a forward on Q, K and V
/// ([`Attention::run`] with `Inputs::qkv`), given `dO = ∂ℓ/∂context` of shape
/// `(batch, heads, L, E_v)`; it becomes a [`crate::Gradients`] with `q`, `k` and `v`.
///
/// With grouped-query attention (K and V with `H_kv < H` heads), the gradient of a shared
/// K/V head is the sum over the `H / H_kv` query heads that read it, so [`SdpaGradients::k`]
/// and [`SdpaGradients::v`] have K's and V's shapes.
///
/// [`Attention::run`]: crate::Attention::run
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SdpaGradients<T = f32> {
    /// `∂ℓ/∂Q`, `(batch, heads, L, E)`.
    pub q: Array4<T>,
    /// `∂ℓ/∂K`, `(batch, heads_kv, S, E)`.
    pub k: Array4<T>,
    /// `∂ℓ/∂V`, `(batch, heads_kv, S, E_v)`.
    pub v: Array4<T>,
    /// With a relative bias among the modifiers: `∂ℓ/∂table`, `(buckets, heads)`.
    pub relative_bias: Option<Array2<T>>,
}
