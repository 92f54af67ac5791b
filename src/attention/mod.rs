//! The attention op. This file holds the public face: the [`Attention`] builder, its
//! options and outputs, and the entry points `forward` and `sdpa`, which check their inputs
//! and hand over to the steps, one file each, in the order a call runs:
//!
//! - `shape.rs`: the sizes of the call ([`Dims`]) and its inputs checked;
//! - `split.rs`: whole when it fits the device, else split (a `forward` call is projected on
//!   the CPU first, then split as `sdpa` is);
//! - `whole.rs`: a call that fits, start to end: `plan.rs` (which kernels and variants), then
//!   one encoder with `upload.rs` (Q, K, V, or X and the projections' matmuls), `dispatch.rs`
//!   (the attention kernels and the output projection), and `readback.rs`.

mod decode_step;
mod dispatch;
mod gradients;
mod layer_saved;
mod linear_grad;
mod plan;
mod projections;
mod qkv;
mod readback;
mod resident;
mod saved;
mod shape;
mod split;
mod upload;
mod weights;
mod whole;

use ndarray::{Array, ArrayD, ArrayView, ArrayView4, ArrayViewD, AsArray, Dimension, IxDyn};

pub use gradients::{Gradients, SdpaGradients};
pub use layer_saved::{LayerSaved, TensorGradients};
pub use plan::{Plan, TINY_ROWS};
pub use projections::{OwnedBiases, OwnedOutput, OwnedWeights, Projections};
pub use resident::TensorOutput;
pub use saved::{Saved, SdpaTensorGradients};
pub(crate) use shape::{check_f16_range, check_inputs_finite};
pub use shape::{check_finite, Dims};
pub use weights::train::{Adam, MseLoss};
pub use weights::Layer;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::gpu::oneshot::block_on;
use crate::mask::Mask;
use crate::variant::{FlashVariant, Kernels, KeySplit, MatmulVariant};
use shape::named_inputs;

/// What a forward pass returns. `D` is the dimension of the X it was given: an `Array2` X
/// gives an `Array2` context, an `ArrayD` one an `ArrayD`.
#[derive(Debug, Clone)]
pub struct Output<T = f32, D: Dimension = IxDyn> {
    /// The context vectors, `(n, d_v)` or `(batch, n, d_v)`, heads concatenated along the
    /// last axis.
    pub context: Array<T, D>,
    /// The attention weights, `(n, n)`, `(batch, n, n)`, `(H, n, n)` or `(batch, H, n, n)`
    /// (a heads axis only when `H > 1`); `None` when the caller opted out.
    pub weights: Option<ArrayD<T>>,
}

/// Scaled dot-product self-attention, configured with a builder:
///
/// ```text
/// Q = X·W_Q (+b_Q),  K = X·W_K (+b_K),  V = X·W_V (+b_V)      (Q = K = V = X without weights)
/// A_h = softmax(Q_h·K_hᵀ · scale)   row by row, scale = 1/sqrt(d_k/H) by default
/// context = [A_1·V_1, …, A_H·V_H]   (heads concatenated along the last axis)
/// ```
///
/// Head `h` uses columns `[h·d_k/H, (h+1)·d_k/H)` of Q and K and the matching slice of V, as
/// PyTorch's multi-head attention splits them. With `causal`, query `i` attends to keys
/// `j ≤ i` (top-left aligned, PyTorch's `is_causal`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Attention {
    heads: usize,
    causal: bool,
    scale: Option<f32>,
    return_weights: bool,
    nan_fill: bool,
    kernels: Kernels,
    flash: Option<FlashVariant>,
    matmul: Option<MatmulVariant>,
    dtype: Dtype,
    propagate: bool,
    key_split: KeySplit,
}

/// The element type the operands are stored in on the device.
///
/// With [`Dtype::F16`] (needs `Features::SHADER_F16`), X, the projection weights and biases
/// (or Q, K, V for [`Attention::sdpa`]) are rounded to f16 and uploaded as f16, and the
/// projected Q, K, V are stored as f16: half the memory and bandwidth. Every product, softmax
/// and sum is computed and accumulated in f32, and the context and weights come back as f32.
/// Inputs beyond f16's range (±65,504) are an error, as is a result that overflowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dtype {
    /// float32 everywhere.
    #[default]
    F32,
    /// float16 operands, float32 arithmetic.
    F16,
}

impl<T> Output<T> {
    /// The context with the dimension type `D` (the X's the caller gave).
    pub(super) fn into_dimensionality<D: Dimension>(self) -> Result<Output<T, D>> {
        Ok(Output {
            context: self
                .context
                .into_dimensionality()
                .map_err(|e| Error::shape(e.to_string()))?,
            weights: self.weights,
        })
    }
}

impl std::str::FromStr for Dtype {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(Dtype::F32),
            "f16" | "float16" | "half" => Ok(Dtype::F16),
            other => Err(Error::invalid(
                "dtype",
                format!("unknown dtype {other:?}: expected f32 or f16"),
            )),
        }
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
        })
    }
}

impl Default for Attention {
    fn default() -> Self {
        Self::new()
    }
}

impl Attention {
    /// One head, no mask, default scale, weights returned.
    pub fn new() -> Self {
        Attention {
            heads: 1,
            causal: false,
            scale: None,
            return_weights: true,
            nan_fill: false,
            kernels: Kernels::Auto,
            flash: None,
            matmul: None,
            dtype: Dtype::F32,
            propagate: false,
            key_split: KeySplit::Auto,
        }
    }

    /// Which kernel family to use (default [`Kernels::Auto`]).
    pub fn kernels(mut self, kernels: Kernels) -> Self {
        self.kernels = kernels;
        self
    }

    /// Forces the fused kernel's variant instead of the tuned one (its family then overrides
    /// [`Attention::kernels`]); for testing and benchmarking every variant.
    pub fn flash_variant(mut self, variant: FlashVariant) -> Self {
        self.flash = Some(variant);
        self
    }

    /// Whether the real-GPU fused kernel splits the keys over several workgroups (default
    /// [`KeySplit::Auto`]: on GPUs, for calls too small to fill one; see [`KeySplit`]).
    pub fn key_split(mut self, split: KeySplit) -> Self {
        self.key_split = split;
        self
    }

    /// Forces the matmul's variant instead of the tuned one.
    pub fn matmul_variant(mut self, variant: MatmulVariant) -> Self {
        self.matmul = Some(variant);
        self
    }

    /// Number of heads (`d_k` and `d_v` must divide by it).
    pub fn heads(mut self, heads: usize) -> Self {
        self.heads = heads;
        self
    }

    /// Causal mask: query `i` attends to keys `j ≤ i`.
    pub fn causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }

    /// The factor applied to `Q·Kᵀ` before the softmax (default `1/sqrt(d_k/H)`).
    pub fn scale(mut self, scale: f32) -> Self {
        self.scale = Some(scale);
        self
    }

    /// Whether to read back the attention weights (default true).
    pub fn return_weights(mut self, yes: bool) -> Self {
        self.return_weights = yes;
        self
    }

    /// Pre-fill the GPU outputs with NaN, so any element a kernel failed to write shows up
    /// (for testing kernels; default false).
    pub fn nan_fill(mut self, yes: bool) -> Self {
        self.nan_fill = yes;
        self
    }

    /// The element type of the operands on the device (default f32; see [`Dtype`]).
    pub fn dtype(mut self, dtype: Dtype) -> Self {
        self.dtype = dtype;
        self
    }

    /// Let NaN and ±Inf in the inputs through instead of rejecting them (default false: an
    /// `Error::NonFinite` naming the array and index). They then propagate as IEEE arithmetic
    /// and PyTorch do: a non-finite query, or a non-finite key or value at a key of non-zero
    /// weight, makes the row's context (and a non-finite score its weights) NaN or Inf. A
    /// key of weight exactly 0 — masked, hidden by causal, or underflowed — never contributes,
    /// so its values cannot reach the row, and masked weights stay exactly 0 (PyTorch's fused
    /// kernels behave so; its math backend lets `0·NaN` through). Results are then not checked
    /// for overflow either. Masks and the scale are still checked.
    pub fn propagate_non_finite(mut self, yes: bool) -> Self {
        self.propagate = yes;
        self
    }

    /// Whether NaN/Inf inputs are passed through ([`Attention::propagate_non_finite`]).
    pub fn propagates_non_finite(&self) -> bool {
        self.propagate
    }

    /// Whether the weights are returned.
    pub fn returns_weights(&self) -> bool {
        self.return_weights
    }

    /// Computes attention on the GPU.
    ///
    /// `x` is `(n, d)` or `(batch, n, d)`: any array or view of those (`&Array2`,
    /// `ArrayView3`, `ArrayViewD`, …); the context comes back with the same dimension type.
    /// Without `proj`, `Q = K = V = X`.
    ///
    /// # Errors
    /// Bad shapes or options, non-finite inputs, sizes over the device's limits, and any
    /// wgpu validation, out-of-memory or device-lost error, as [`Error`] variants.
    pub fn forward<'a, D: Dimension>(
        &self,
        ctx: &Context,
        x: impl AsArray<'a, f32, D>,
        proj: Option<&Projections<'_>>,
    ) -> Result<Output<f32, D>> {
        self.forward_masked(ctx, x, proj, &Mask::none())
    }

    /// [`Attention::forward`] without blocking: what the browser (wasm32, WebGPU) calls; the
    /// blocking API is this, waited for.
    ///
    /// # Errors
    /// As [`Attention::forward`].
    pub async fn forward_async(
        &self,
        ctx: &Context,
        x: ArrayViewD<'_, f32>,
        proj: Option<&Projections<'_>>,
    ) -> Result<Output> {
        self.forward_masked_async(ctx, x, proj, &Mask::none()).await
    }

    /// [`Attention::forward_masked`] without blocking.
    ///
    /// # Errors
    /// As [`Attention::forward_masked`].
    pub async fn forward_masked_async(
        &self,
        ctx: &Context,
        x: ArrayViewD<'_, f32>,
        proj: Option<&Projections<'_>>,
        mask: &Mask<'_>,
    ) -> Result<Output> {
        self.forward_with_async(ctx, x, proj, mask, None).await
    }

    /// [`Attention::forward`] with a mask: `softmax(scale·Q·Kᵀ + mask)` per head, the mask
    /// broadcast to `(batch, heads, n, n)` and combined with causal (see [`crate::mask`] for
    /// the semantics; a row with nothing to attend to gives zeros).
    ///
    /// # Errors
    /// As [`Attention::forward`], and a mask that does not broadcast, holds NaN or `+inf`,
    /// or key lengths that do not fit.
    pub fn forward_masked<'a, D: Dimension>(
        &self,
        ctx: &Context,
        x: impl AsArray<'a, f32, D>,
        proj: Option<&Projections<'_>>,
        mask: &Mask<'_>,
    ) -> Result<Output<f32, D>> {
        let x: ArrayView<'a, f32, D> = x.into();
        self.forward_with(ctx, x.into_dyn(), proj, mask, None)?
            .into_dimensionality()
    }

    /// [`Attention::forward_masked`], with the projections' weights already on the device
    /// when `resident` has them (a [`Layer`]'s, checked when it was built).
    fn forward_with(
        &self,
        ctx: &Context,
        x: ArrayViewD<'_, f32>,
        proj: Option<&Projections<'_>>,
        mask: &Mask<'_>,
        resident: Option<&weights::DeviceWeights>,
    ) -> Result<Output> {
        block_on(self.forward_with_async(ctx, x, proj, mask, resident))
    }

    async fn forward_with_async(
        &self,
        ctx: &Context,
        x: ArrayViewD<'_, f32>,
        proj: Option<&Projections<'_>>,
        mask: &Mask<'_>,
        resident: Option<&weights::DeviceWeights>,
    ) -> Result<Output> {
        let _call = ctx.phases.call();
        let dims = self.dims(x.shape(), proj)?;
        let inputs = match resident {
            Some(_) => vec![("X", x.view())],
            None => named_inputs(&x, proj),
        };
        if !self.propagate {
            for (name, a) in &inputs {
                check_finite(name, a)?;
            }
        }
        let bias = mask.bias([dims.batch, dims.heads, dims.n, dims.n])?;
        self.check_dtype(ctx, &inputs)?;
        ctx.check_alive()?;
        let bias = bias.as_ref().map(|b| b.view());
        self.forward_checked(ctx, &dims, x, proj, bias, resident)
            .await
    }

    /// PyTorch's `scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)`
    /// for callers who already have Q, K and V, in PyTorch's layout: `q` is
    /// `(batch, heads, L, E)`, `k` is `(batch, heads, S, E)`, `v` is `(batch, heads, S, E_v)`.
    /// `L ≠ S` is allowed. Causal is top-left aligned as PyTorch aligns it: query `i` sees
    /// keys `j ≤ i`, so queries past `S` see every key. The default scale is `1/sqrt(E)`. The
    /// heads come from the arrays; [`Attention::heads`] is not used. K and V may have fewer
    /// heads than Q (grouped-query / multi-query attention, PyTorch's `enable_gqa=True`): Q
    /// head `h` uses K/V head `h / (H_q / H_kv)`, read in place, never copied per Q head.
    ///
    /// Returns the context `(batch, heads, L, E_v)` and, unless
    /// [`Attention::return_weights`] is off, the weights `(batch, heads, L, S)`.
    ///
    /// # Errors
    /// Shapes that do not pair up, empty axes, NaN/Inf, a single head too large for the
    /// device's limits (larger calls are split by batch, then heads), and GPU errors, as
    /// [`Error`] variants.
    pub fn sdpa(
        &self,
        ctx: &Context,
        q: ArrayView4<'_, f32>,
        k: ArrayView4<'_, f32>,
        v: ArrayView4<'_, f32>,
    ) -> Result<Output> {
        self.sdpa_masked(ctx, q, k, v, &Mask::none())
    }

    /// [`Attention::sdpa`] without blocking.
    ///
    /// # Errors
    /// As [`Attention::sdpa`].
    pub async fn sdpa_async(
        &self,
        ctx: &Context,
        q: ArrayView4<'_, f32>,
        k: ArrayView4<'_, f32>,
        v: ArrayView4<'_, f32>,
    ) -> Result<Output> {
        self.sdpa_masked_async(ctx, q, k, v, &Mask::none()).await
    }

    /// [`Attention::sdpa`] with PyTorch's `attn_mask`: boolean (`true` = attend) or float
    /// (added to the scaled scores), broadcast to `(batch, heads, L, S)`, and key lengths;
    /// combined with causal. See [`crate::mask`] for the semantics; a row with nothing to
    /// attend to gives zeros.
    ///
    /// # Errors
    /// As [`Attention::sdpa`], and a mask that does not broadcast, holds NaN or `+inf`, or key
    /// lengths that do not fit.
    pub fn sdpa_masked(
        &self,
        ctx: &Context,
        q: ArrayView4<'_, f32>,
        k: ArrayView4<'_, f32>,
        v: ArrayView4<'_, f32>,
        mask: &Mask<'_>,
    ) -> Result<Output> {
        block_on(self.sdpa_masked_async(ctx, q, k, v, mask))
    }

    /// [`Attention::sdpa_masked`] without blocking.
    ///
    /// # Errors
    /// As [`Attention::sdpa_masked`].
    pub async fn sdpa_masked_async(
        &self,
        ctx: &Context,
        q: ArrayView4<'_, f32>,
        k: ArrayView4<'_, f32>,
        v: ArrayView4<'_, f32>,
        mask: &Mask<'_>,
    ) -> Result<Output> {
        let _call = ctx.phases.call();
        self.sdpa_dims(q.shape(), k.shape(), v.shape())?;
        if !self.propagate {
            check_finite("Q", &q)?;
            check_finite("K", &k)?;
            check_finite("V", &v)?;
        }
        let (b, h, l, _) = q.dim();
        let bias = mask.bias([b, h, l, k.dim().2])?;
        let inputs = [
            ("Q", q.into_dyn()),
            ("K", k.into_dyn()),
            ("V", v.into_dyn()),
        ];
        self.check_dtype(ctx, &inputs)?;
        ctx.check_alive()?;
        let bias = bias.as_ref().map(|b| b.view());
        self.sdpa_in_parts(ctx, q, k, v, bias).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;

    #[test]
    fn dims_default_scale_uses_per_head_width() {
        let d = Attention::new().heads(4).dims(&[2, 5, 32], None).unwrap();
        assert_eq!(d.scale, 1.0 / 8f32.sqrt());
        assert_eq!(d.weights_shape(), vec![2, 4, 5, 5]);
        assert_eq!(d.context_shape(), vec![2, 5, 32]);
    }

    #[test]
    fn dims_rejects_heads_that_do_not_divide() {
        let err = Attention::new().heads(3).dims(&[5, 8], None).unwrap_err();
        assert!(err.to_string().contains("does not divide"), "{err}");
    }

    #[test]
    fn dims_rejects_mismatched_weights() {
        let wq = Array2::<f32>::zeros((4, 3));
        let wk = Array2::<f32>::zeros((4, 2));
        let wv = Array2::<f32>::zeros((4, 5));
        let p = Projections::new(wq.view(), wk.view(), wv.view());
        let err = Attention::new().dims(&[7, 4], Some(&p)).unwrap_err();
        assert!(err.to_string().contains("W_K"), "{err}");
    }
}
