//! The attention op. This file holds the public face: the [`Attention`] builder and its
//! options. A call goes in through [`Attention::run`], [`Attention::run_async`] or
//! [`Attention::record`] (and [`Layer::run`], [`Layer::record`]) with [`Inputs`] and comes
//! back as an [`Output`] (`run.rs`, `inputs.rs`, `outputs.rs`). Every call — on arrays or
//! tensors, of X or of Q, K, V, saved for the backward or not — is built as a value and
//! checked once (`call.rs`), then handed over to the steps, one file each, in the order a
//! call runs:
//!
//! - `shape.rs`: the sizes of the call ([`Dims`]) and the checks of its inputs;
//! - `split.rs`: whole when it fits the device, else split on the device in the call's dtype
//!   with the whole call's plan (a call on X is projected in blocks of rows first, then split
//!   as one on Q, K, V is);
//! - `whole.rs`: a call that fits, start to end: `plan.rs` (which kernels and variants), then
//!   one encoder with `upload.rs` (Q, K, V, or X and the projections' matmuls), `dispatch.rs`
//!   (the attention kernels and the output projection), and `readback.rs`;
//! - `resident.rs`: a call on tensors, the same plan and dispatch recorded into a
//!   [`crate::Recorder`], its results left on the device;
//! - `saved.rs` (on Q, K, V) and `layer_saved.rs` (on X): a call saved for the backward, the
//!   fused kernel keeping its row statistics, and the backward itself.

mod call;
mod decode_step;
mod dispatch;
mod gradients;
pub(crate) mod inputs;
mod layer_saved;
mod linear_grad;
mod outputs;
pub(crate) mod plan;
mod projections;
mod qkv;
mod readback;
mod resident;
mod run;
mod saved;
mod shape;
mod split;
mod upload;
mod weights;
mod whole;

pub use crate::dtype::Dtype;
pub use crate::values::check_finite;
pub(crate) use gradients::{LayerGradients, SdpaGradients};
pub use inputs::{Files, Host, Inputs, Kind, OnDevice, Operand, Options, ProjectionsArg};
pub use outputs::{Backward, Gradients, Output, Saved};
pub use projections::{OwnedBiases, OwnedOutput, OwnedWeights, Projections};
pub(crate) use resident::TensorOutput;
pub use run::Run;
pub(crate) use shape::check_inputs_finite;
pub use shape::Dims;
pub use weights::train::{Adam, MseLoss};
pub use weights::Layer;

use crate::error::{Error, Result};
use crate::variant::{FlashVariant, Kernels, KeySplit, MatmulVariant};

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
///
/// The builder describes the op; a call gives it [`Inputs`] (X, or Q, K and V as PyTorch's
/// `scaled_dot_product_attention` takes them, and a mask) and runs it with
/// [`Attention::run`], [`Attention::run_async`] or [`Attention::record`] (tensors, into a
/// [`crate::Recorder`]). Each returns an [`Output`].
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
    save: bool,
}

// `Dtype` itself lives in `crate::dtype`, below `crate::error`, whose `Overflow` reports it;
// parsing one gives an `Error`, so it is here.
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

impl Default for Attention {
    fn default() -> Self {
        Self::new()
    }
}

impl Attention {
    /// One head, no mask, the default scale, weights returned, nothing saved, f32.
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
            save: false,
        }
    }

    /// Number of heads for X (`d_k` and `d_v` must divide by it). Q, K and V carry their
    /// own heads.
    pub fn heads(mut self, heads: usize) -> Self {
        self.heads = heads;
        self
    }

    /// Causal mask: query `i` attends to keys `j ≤ i` (top-left aligned, PyTorch's
    /// `is_causal`: with more queries than keys, the queries past the last key see every key).
    pub fn causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }

    /// The factor applied to `Q·Kᵀ` before the softmax (default `1/sqrt(E)`, the per-head
    /// width: `1/sqrt(d_k/H)` for X).
    pub fn scale(mut self, scale: f32) -> Self {
        self.scale = Some(scale);
        self
    }

    /// The element type of the operands on the device (default f32; see [`Dtype`]).
    pub fn dtype(mut self, dtype: Dtype) -> Self {
        self.dtype = dtype;
        self
    }

    /// Whether the attention weights (the softmax probabilities) come back beside the
    /// context (default true). Off, the fused kernels never write them: faster, and no
    /// `(L, S)` matrix per head. A saved forward never returns them.
    pub fn return_weights(mut self, yes: bool) -> Self {
        self.return_weights = yes;
        self
    }

    /// Keeps what the backward needs on the device: the output then carries a [`Saved`]
    /// whose [`Saved::backward`] gives the gradients (default false). A saved forward always
    /// runs the fused kernel, returns no weights, and rejects NaN/Inf inputs.
    pub fn save_for_backward(mut self, yes: bool) -> Self {
        self.save = yes;
        self
    }

    /// The advanced knobs: kernel family and variants, key split, NaN pre-fill, non-finite
    /// inputs (see [`Options`]).
    pub fn options(mut self, options: Options) -> Self {
        self.kernels = options.kernels;
        self.flash = options.flash_variant;
        self.matmul = options.matmul_variant;
        self.key_split = options.key_split;
        self.nan_fill = options.nan_fill;
        self.propagate = options.propagate_non_finite;
        self
    }

    /// Which kernel family to use.
    pub(crate) fn kernels(mut self, kernels: Kernels) -> Self {
        self.kernels = kernels;
        self
    }

    /// Whether NaN/Inf inputs are passed through.
    pub(crate) fn propagate_non_finite(mut self, yes: bool) -> Self {
        self.propagate = yes;
        self
    }

    /// Whether NaN/Inf inputs are passed through ([`Options::propagate_non_finite`]).
    pub(crate) fn propagates_non_finite(&self) -> bool {
        self.propagate
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
