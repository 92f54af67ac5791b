//! Attention masks: which keys each query may attend to, and biases added to the scores.
//!
//! Semantics, as PyTorch's `scaled_dot_product_attention` and JAX's `dot_product_attention`:
//!
//! - A **boolean** mask says `true` = attend, `false` = masked out.
//! - A **float** mask is added to the scaled scores: `softmax(scale·Q·Kᵀ + mask)`. `-inf`
//!   masks a key out exactly; any finite value is a bias. Values below `-1e37` act as `-1e37`
//!   (f32 scores cannot tell them apart: a partly masked row gives them weight 0, a row of
//!   nothing else gives them equal weights, as PyTorch does with `torch.finfo.min`). NaN,
//!   `+inf` and values above `1e37` are errors.
//! - Either **broadcasts** to `(batch, heads, n_q, n_kv)` by NumPy's rules: its shape,
//!   right-aligned, has each axis equal to the target's or 1, at most four axes. A `(n_q,
//!   n_kv)` mask is the same for every batch index and head; `(batch, 1, 1, n_kv)` is a
//!   key-padding mask.
//! - **Key lengths** (`with_kv_lengths`): sequence `b` attends to its first `lengths[b]` keys
//!   only, as per-sequence padding; they combine with a mask and with causal.
//! - A **row with nothing to attend to** (every key masked out exactly) has weights 0 and a
//!   context of 0, never NaN. (PyTorch's math backend gives NaN there; its fused kernels
//!   give 0.)

use ndarray::{Array4, ArrayD, ArrayView4, ArrayViewD, Dimension};

use crate::error::{Error, Result};
use crate::modifiers::Modifiers;

/// Masked-out entries of a resolved bias: exactly `-inf`, as in the reference.
pub const MASKED: f32 = f32::NEG_INFINITY;

/// Finite mask values below this act as it (see the module docs).
pub const FLOOR: f32 = -1e37;

/// The largest finite mask value accepted.
pub const CEILING: f32 = 1e37;

/// What is masked: nothing, a mask (boolean or additive), key lengths, or both.
#[derive(Debug, Clone, Default)]
pub struct Mask<'a> {
    attn: Option<Kind<'a>>,
    kv_lengths: Option<Vec<usize>>,
    mods: Option<&'a Modifiers>,
}

#[derive(Debug, Clone)]
enum Kind<'a> {
    Bool(ArrayViewD<'a, bool>),
    Additive(ArrayViewD<'a, f32>),
}

impl<'a> Mask<'a> {
    /// The same mask, its views borrowed for a shorter lifetime.
    pub(crate) fn reborrow<'b>(&self) -> Mask<'b>
    where
        'a: 'b,
    {
        Mask {
            attn: self.attn.as_ref().map(|k| match k {
                Kind::Bool(m) => Kind::Bool(m.clone().reborrow()),
                Kind::Additive(m) => Kind::Additive(m.clone().reborrow()),
            }),
            kv_lengths: self.kv_lengths.clone(),
            mods: self.mods,
        }
    }

    /// No mask.
    pub fn none() -> Self {
        Self::default()
    }

    /// A boolean mask, `true` = attend, broadcastable to `(batch, heads, n_q, n_kv)`.
    pub fn boolean(mask: ArrayViewD<'a, bool>) -> Self {
        Mask {
            attn: Some(Kind::Bool(mask)),
            ..Mask::default()
        }
    }

    /// A float mask added to the scaled scores (`-inf` masks out), broadcastable to
    /// `(batch, heads, n_q, n_kv)`.
    pub fn additive(mask: ArrayViewD<'a, f32>) -> Self {
        Mask {
            attn: Some(Kind::Additive(mask)),
            ..Mask::default()
        }
    }

    /// Key padding: sequence `b` attends to keys `j < lengths[b]` only (one length per batch
    /// index).
    pub fn with_kv_lengths(mut self, lengths: &[usize]) -> Self {
        self.kv_lengths = Some(lengths.to_vec());
        self
    }

    /// Score and mask modifiers (a caller's WGSL, presets: [`crate::modifiers`]), applied
    /// with the rest of the mask: the score modifiers to the scaled score, then the bias,
    /// then the mask modifiers. So far on the forward on arrays (Q, K, V or X, with or
    /// without projections): the fused kernels (`flash_tiled`, `flash_blocked`,
    /// `flash_subgroup`) and the weights (`softmax`, the subgroup matmul's epilogues), and the
    /// fused backward of a forward on Q, K, V saved for it; every
    /// other path is an `Unsupported` error, never a silent omission.
    pub fn with_modifiers(mut self, mods: &'a Modifiers) -> Self {
        self.mods = Some(mods).filter(|m| !m.is_empty());
        self
    }

    /// The modifiers, if any.
    pub fn modifiers(&self) -> Option<&'a Modifiers> {
        self.mods
    }

    /// Whether nothing is masked (no bias, no key lengths, no modifiers).
    pub fn is_none(&self) -> bool {
        self.attn.is_none() && self.kv_lengths.is_none() && self.mods.is_none()
    }

    /// Whether there is no bias to build (no mask, no key lengths; modifiers aside).
    pub(crate) fn has_no_bias(&self) -> bool {
        self.attn.is_none() && self.kv_lengths.is_none()
    }

    /// Checks the mask against the problem `(batch, heads, n_q, n_kv)` without building
    /// the bias, and returns the bias's shape.
    ///
    /// # Errors
    /// As [`Mask::bias`].
    pub fn check(&self, target: [usize; 4]) -> Result<[usize; 4]> {
        let [batch, _, _, n_kv] = target;
        if let Some(m) = self.mods {
            m.check()?;
            m.check_problem(target)?;
        }
        let mut shape = [1usize; 4];
        if let Some(kind) = &self.attn {
            let src = match kind {
                Kind::Bool(m) => m.shape(),
                Kind::Additive(m) => m.shape(),
            };
            shape = broadcast_shape(src, target)?;
            if let Kind::Additive(m) = kind {
                check_values(m)?;
            }
        }
        if let Some(lengths) = &self.kv_lengths {
            if lengths.len() != batch {
                return Err(Error::shape(format!(
                    "kv_lengths has {} entries, one per batch index is {batch}",
                    lengths.len()
                )));
            }
            if let Some((b, &len)) = lengths.iter().enumerate().find(|(_, &l)| l > n_kv) {
                return Err(Error::invalid(
                    "kv_lengths",
                    format!("kv_lengths[{b}] = {len} is more than the {n_kv} keys"),
                ));
            }
            shape[0] = batch;
            shape[3] = n_kv;
        }
        Ok(shape)
    }

    /// The mask as one additive bias on the scaled scores, `-inf` where masked out, in the
    /// smallest shape that broadcasts to `(batch, heads, n_q, n_kv)` (each axis the target's or
    /// 1); `None` when nothing is masked.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] for a mask that does not broadcast or lengths that do not
    /// match the batch; [`Error::InvalidArgument`] for NaN, `+inf` or values over [`CEILING`]
    /// (naming the first index), and lengths over `n_kv`.
    pub fn bias(&self, target: [usize; 4]) -> Result<Option<Array4<f32>>> {
        // The modifiers are checked against the problem even when there is no bias to build.
        let shape = self.check(target)?;
        if self.has_no_bias() {
            return Ok(None);
        }
        // The mask in its own shape, padded on the left to four axes, then broadcast.
        let own = |m: ArrayD<f32>| -> Result<Array4<f32>> {
            let mut padded = [1usize; 4];
            padded[4 - m.ndim()..].copy_from_slice(m.shape());
            // Row-major first: a view of any strides (a transposed or permuted mask, such as
            // T5's position bias) reshapes only from there.
            m.as_standard_layout()
                .into_owned()
                .into_shape_with_order(padded)
                .map_err(|e| Error::shape(e.to_string()))
        };
        let base = match &self.attn {
            None => Array4::zeros((1, 1, 1, 1)),
            Some(Kind::Bool(m)) => own(m.mapv(|t| if t { 0.0 } else { MASKED }))?,
            Some(Kind::Additive(m)) => own(m.to_owned())?,
        };
        let mut bias = base
            .broadcast(shape)
            .ok_or_else(|| Error::shape(format!("mask {:?} to {shape:?}", base.shape())))?
            .to_owned();
        if let Some(lengths) = &self.kv_lengths {
            for (b, &len) in lengths.iter().enumerate() {
                bias.slice_mut(ndarray::s![b, .., .., len..]).fill(MASKED);
            }
        }
        Ok(Some(bias))
    }
}

/// The shape `src` takes when right-aligned against `target` and padded to four axes.
fn broadcast_shape(src: &[usize], target: [usize; 4]) -> Result<[usize; 4]> {
    let names = ["batch", "heads", "n_q", "n_kv"];
    if src.is_empty() || src.len() > 4 {
        return Err(Error::shape(format!(
            "mask of shape {src:?} does not broadcast to (batch, heads, n_q, n_kv) = \
             {target:?}: it needs one to four axes"
        )));
    }
    let mut shape = [1usize; 4];
    let skip = 4 - src.len();
    for (a, &len) in src.iter().enumerate() {
        let t = target[a + skip];
        if len != t && len != 1 {
            return Err(Error::shape(format!(
                "mask of shape {src:?} does not broadcast to (batch, heads, n_q, n_kv) = \
                 {target:?}: its axis {a} ({len}) lines up with {} ({t}); right-aligned, each \
                 axis must be the target's or 1",
                names[a + skip]
            )));
        }
        shape[a + skip] = len;
    }
    Ok(shape)
}

fn check_values(m: &ArrayViewD<'_, f32>) -> Result<()> {
    let bad = m.indexed_iter().find(|(_, &v)| v.is_nan() || v > CEILING);
    match bad {
        None => Ok(()),
        Some((idx, &v)) if !v.is_finite() => Err(Error::NonFinite {
            array: "mask (float masks take -inf or finite values)".into(),
            value: v,
            index: idx.slice().to_vec(),
        }),
        Some((idx, &v)) => Err(Error::invalid(
            "mask",
            format!(
                "mask{:?} = {v:e}: float masks take finite values up to {CEILING:e}, or -inf",
                idx.slice().to_vec()
            ),
        )),
    }
}

/// A resolved bias as the kernels read it: its elements in row-major order with `-inf`
/// mapped to `f32::MIN` (the kernels' masked marker, so no infinity reaches the GPU) and
/// finite values clamped to [`FLOOR`], and its element strides over `(batch, heads, n_q,
/// n_kv)`, 0 along broadcast axes.
pub fn gpu_layout(bias: &ArrayView4<'_, f32>) -> (Vec<f32>, [usize; 4]) {
    let data = bias
        .iter()
        .map(|&v| if v == MASKED { f32::MIN } else { v.max(FLOOR) })
        .collect();
    let dims = bias.shape();
    let mut strides = [0usize; 4];
    let mut step = 1;
    for a in (0..4).rev() {
        strides[a] = if dims[a] == 1 { 0 } else { step };
        step *= dims[a];
    }
    (data, strides)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{arr1, arr2, IxDyn};

    #[test]
    fn boolean_mask_broadcasts_right_aligned() {
        let m = arr2(&[[true, false, true]]).into_dyn();
        let bias = Mask::boolean(m.view()).bias([2, 3, 4, 3]).unwrap().unwrap();
        assert_eq!(bias.shape(), &[1, 1, 1, 3]);
        assert_eq!(bias.iter().copied().collect::<Vec<_>>(), [0.0, MASKED, 0.0]);
    }

    #[test]
    fn lengths_widen_the_batch_and_combine_with_the_mask() {
        let m = arr1(&[0.5f32, -1.0, 2.0]).into_dyn();
        let bias = Mask::additive(m.view())
            .with_kv_lengths(&[3, 1])
            .bias([2, 1, 2, 3])
            .unwrap()
            .unwrap();
        assert_eq!(bias.shape(), &[2, 1, 1, 3]);
        let v: Vec<f32> = bias.iter().copied().collect();
        assert_eq!(v, [0.5, -1.0, 2.0, 0.5, MASKED, MASKED]);
    }

    #[test]
    fn shapes_that_do_not_broadcast_are_errors() {
        for shape in [vec![2usize], vec![3, 3], vec![1, 1, 1, 1, 3], vec![]] {
            let m = ArrayD::from_elem(IxDyn(&shape), true);
            let e = Mask::boolean(m.view()).bias([1, 1, 2, 3]).unwrap_err();
            assert!(matches!(e, Error::ShapeMismatch { .. }), "{shape:?}: {e}");
        }
        let e = Mask::none()
            .with_kv_lengths(&[1])
            .bias([2, 1, 1, 3])
            .unwrap_err();
        assert!(e.to_string().contains("kv_lengths"), "{e}");
        let e = Mask::none()
            .with_kv_lengths(&[4])
            .bias([1, 1, 1, 3])
            .unwrap_err();
        assert!(e.to_string().contains("kv_lengths[0] = 4"), "{e}");
    }

    #[test]
    fn nan_and_positive_infinity_are_errors_minus_infinity_masks() {
        for bad in [f32::NAN, f32::INFINITY, 1e38] {
            let m = arr1(&[0.0f32, bad]).into_dyn();
            let e = Mask::additive(m.view()).bias([1, 1, 1, 2]).unwrap_err();
            let text = e.to_string();
            assert!(text.contains("mask[1]") || text.contains("[1]"), "{e}");
        }
        let m = arr1(&[0.0f32, f32::NEG_INFINITY]).into_dyn();
        assert!(Mask::additive(m.view()).bias([1, 1, 1, 2]).is_ok());
    }

    #[test]
    fn gpu_layout_has_zero_strides_on_broadcast_axes_and_no_infinity() {
        let bias =
            Array4::from_shape_vec((2, 1, 1, 3), vec![0.0, MASKED, -1e38, 1.0, 2.0, 3.0]).unwrap();
        let (data, strides) = gpu_layout(&bias.view());
        assert_eq!(strides, [3, 0, 0, 1]);
        assert_eq!(data[1], f32::MIN);
        assert_eq!(data[2], FLOOR);
        assert!(data.iter().all(|v| v.is_finite()));
    }
}
