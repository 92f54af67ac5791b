//! What a call is given: [`Inputs`], built from arrays or from device tensors, and the
//! advanced knobs of [`Options`].
//!
//! An input kind converts at the edge, as `ndarray` does with `AsArray`: any array or view of
//! `f32` (`&Array2`, `ArrayView4`, `&ArrayD`, …) is a [`Host`] operand, whose results come
//! back as `ArrayD<f32>`; a `&`[`Opened`] `.npy` file is a [`Files`] operand, read straight
//! into the device's memory, its results arrays too; a `&`[`Tensor`] is an [`OnDevice`]
//! operand, whose results stay on the device as tensors. One call takes one kind.

use ndarray::{ArrayBase, ArrayD, ArrayView, ArrayViewD, Data, Dimension};

use super::projections::Projections;
use crate::mask::Mask;
use crate::npy::Opened;
use crate::tensor::Tensor;
use crate::variant::{FlashVariant, Kernels, KeySplit, MatmulVariant};

mod sealed {
    pub trait Sealed {}
}

/// Where a call's operands live, and so what its results come back as: [`Host`] (arrays in,
/// `ArrayD<f32>` out) or [`OnDevice`] (tensors in, tensors out). Sealed.
pub trait Kind: sealed::Sealed + Sized {
    /// What each result of a call of this kind is.
    type Value;
    /// How an operand of this kind is held.
    #[doc(hidden)]
    type Ref<'a>: Clone;
    /// The operand's shape.
    #[doc(hidden)]
    fn shape<'s>(r: &'s Self::Ref<'_>) -> &'s [usize];
    /// Whether Q, K, V of this kind are `(batch, heads, rows, width)` (PyTorch's layout)
    /// rather than `(batch, rows, heads, width)` (the kernels' rows layout).
    #[doc(hidden)]
    const HEADS_SECOND: bool;
}

/// Arrays on the host: results come back as `ArrayD<f32>` (see [`Kind`]).
#[derive(Debug, Clone, Copy)]
pub enum Host {}

/// Tensors on the device: results stay there as [`Tensor`]s (see [`Kind`]).
#[derive(Debug, Clone, Copy)]
pub enum OnDevice {}

/// Opened `.npy` files ([`Opened`]): each file's values go from the file to the device in
/// one pass (a call on Q, K, V that fits the device; any other call reads them into arrays
/// first); results come back as `ArrayD<f32>`, as for [`Host`].
#[derive(Debug, Clone, Copy)]
pub enum Files {}

impl sealed::Sealed for Host {}
impl sealed::Sealed for Files {}
impl sealed::Sealed for OnDevice {}

impl Kind for Host {
    type Value = ArrayD<f32>;
    type Ref<'a> = ArrayViewD<'a, f32>;
    const HEADS_SECOND: bool = true;
    fn shape<'s>(r: &'s Self::Ref<'_>) -> &'s [usize] {
        r.shape()
    }
}

impl Kind for Files {
    type Value = ArrayD<f32>;
    type Ref<'a> = &'a Opened;
    const HEADS_SECOND: bool = true;
    fn shape<'s>(r: &'s Self::Ref<'_>) -> &'s [usize] {
        r.shape()
    }
}

impl Kind for OnDevice {
    type Value = Tensor;
    type Ref<'a> = &'a Tensor;
    const HEADS_SECOND: bool = false;
    fn shape<'s>(r: &'s Self::Ref<'_>) -> &'s [usize] {
        r.shape()
    }
}

/// One operand of a call: any `f32` array or view (a [`Host`] operand), a `&`[`Opened`]
/// file (a [`Files`] operand) or a `&`[`Tensor`] (an [`OnDevice`] operand).
pub trait Operand<'a> {
    /// The kind of call it makes.
    type Kind: Kind;
    /// The operand as its kind holds it.
    #[doc(hidden)]
    fn operand(self) -> <Self::Kind as Kind>::Ref<'a>;
}

impl<'a, S: Data<Elem = f32>, D: Dimension> Operand<'a> for &'a ArrayBase<S, D> {
    type Kind = Host;
    fn operand(self) -> ArrayViewD<'a, f32> {
        self.view().into_dyn()
    }
}

impl<'a, D: Dimension> Operand<'a> for ArrayView<'a, f32, D> {
    type Kind = Host;
    fn operand(self) -> ArrayViewD<'a, f32> {
        self.into_dyn()
    }
}

impl<'a> Operand<'a> for &'a Opened {
    type Kind = Files;
    fn operand(self) -> &'a Opened {
        self
    }
}

impl<'a> Operand<'a> for &'a Tensor {
    type Kind = OnDevice;
    fn operand(self) -> &'a Tensor {
        self
    }
}

/// The operands of a call: X (self-attention: `Q = K = V = X`, or projected by
/// [`Inputs::projections`]) or Q, K and V (PyTorch's `scaled_dot_product_attention`), and
/// a mask.
///
/// ```
/// use wgpu_attention::{Inputs, Mask, ndarray::{Array2, Array4}};
/// let x = Array2::<f32>::zeros((7, 16));
/// let mask = Mask::none().with_kv_lengths(&[5]); // keys past the 5th are masked
/// let self_attention = Inputs::x(&x).mask(&mask);
/// let q = Array4::<f32>::zeros((1, 2, 7, 8));
/// let sdpa = Inputs::qkv(&q, &q, &q);
/// # let _ = (self_attention, sdpa);
/// ```
///
/// Layouts. With X: `(n, d)` or `(batch, n, d)`; the context comes back as `(n, d_out)` or
/// `(batch, n, d_out)`. With Q, K, V as arrays: PyTorch's `(batch, heads, L, E)`,
/// `(batch, kv_heads, S, E)`, `(batch, kv_heads, S, E_v)`, the context
/// `(batch, heads, L, E_v)`. As tensors, the rows layout the kernels read
/// (FlashAttention's): `(batch, L, heads, E)`, `(batch, S, kv_heads, E)`,
/// `(batch, S, kv_heads, E_v)`, the context `(batch, L, heads, E_v)`.
#[derive(Clone)]
pub struct Inputs<'a, K: Kind = Host> {
    pub(crate) operands: Operands<'a, K>,
    pub(crate) projections: Option<Projections<'a>>,
    pub(crate) mask: Option<Mask<'a>>,
}

/// X alone, or Q, K and V.
pub(crate) enum Operands<'a, K: Kind> {
    X(K::Ref<'a>),
    Qkv([K::Ref<'a>; 3]),
}

impl<K: Kind> Clone for Operands<'_, K> {
    fn clone(&self) -> Self {
        match self {
            Operands::X(x) => Operands::X(x.clone()),
            Operands::Qkv(qkv) => Operands::Qkv(qkv.clone()),
        }
    }
}

impl<K: Kind> std::fmt::Debug for Inputs<'_, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = f.debug_struct("Inputs");
        match &self.operands {
            Operands::X(x) => s.field("x", &K::shape(x)),
            Operands::Qkv([q, k, v]) => s
                .field("q", &K::shape(q))
                .field("k", &K::shape(k))
                .field("v", &K::shape(v)),
        };
        s.field("projections", &self.projections.is_some())
            .field("mask", &self.mask.is_some())
            .finish()
    }
}

impl<'a, K: Kind> Inputs<'a, K> {
    /// Self-attention on X: `(n, d)` or `(batch, n, d)`. Without
    /// [`Inputs::projections`], `Q = K = V = X`.
    pub fn x(x: impl Operand<'a, Kind = K>) -> Self {
        Inputs {
            operands: Operands::X(x.operand()),
            projections: None,
            mask: None,
        }
    }

    /// Q, K and V as PyTorch's `scaled_dot_product_attention` takes them (see the layouts
    /// above). `L ≠ S` is allowed; K and V may have fewer heads than Q (grouped-query
    /// attention, PyTorch's `enable_gqa=True`): Q head `h` reads K/V head
    /// `h / (heads / kv_heads)`. The heads come from the operands, not from
    /// [`crate::Attention::heads`].
    pub fn qkv(
        q: impl Operand<'a, Kind = K>,
        k: impl Operand<'a, Kind = K>,
        v: impl Operand<'a, Kind = K>,
    ) -> Self {
        Inputs {
            operands: Operands::Qkv([q.operand(), k.operand(), v.operand()]),
            projections: None,
            mask: None,
        }
    }

    /// Projects X first: `Q = X·W_Q (+b_Q)`, `K = X·W_K (+b_K)`, `V = X·W_V (+b_V)`, and the
    /// context through `W_O (+b_O)` when given. With Q, K and V this is an error. On tensors,
    /// build a [`crate::Layer`] (its weights stay on the device).
    /// Takes `&Projections` or an `Option<&Projections>`.
    pub fn projections(mut self, projections: impl ProjectionsArg<'a>) -> Self {
        self.projections = projections.projections();
        self
    }

    /// A boolean or additive mask, or key lengths, combined with causal (see [`Mask`] for
    /// the semantics and how it broadcasts).
    pub fn mask<'m: 'a>(mut self, mask: &'a Mask<'m>) -> Self {
        self.mask = Some(mask.reborrow());
        self
    }

    /// The mask, or none.
    pub(crate) fn mask_or_none(&self) -> Mask<'a> {
        self.mask.clone().unwrap_or_else(Mask::none)
    }
}

/// What [`Inputs::projections`] takes: `&Projections`, or `Option<&Projections>`. The
/// projections' own views may outlive the borrow of X.
pub trait ProjectionsArg<'a> {
    /// The projections, their views reborrowed for the inputs' lifetime.
    fn projections(self) -> Option<Projections<'a>>;
}

impl<'a, 'p: 'a> ProjectionsArg<'a> for &'a Projections<'p> {
    fn projections(self) -> Option<Projections<'a>> {
        Some(self.reborrow())
    }
}

impl<'a, 'p: 'a> ProjectionsArg<'a> for Option<&'a Projections<'p>> {
    fn projections(self) -> Option<Projections<'a>> {
        self.map(Projections::reborrow)
    }
}

/// The knobs a caller rarely turns: which kernels run, and how checks behave. Set them with
/// [`crate::Attention::options`]; the defaults suit every adapter. Built from
/// [`Options::default`] with one method per field (the fields are read-only outside the
/// crate, so that a new knob is not a breaking change):
///
/// ```
/// use wgpu_attention::{Attention, Kernels, Options};
/// let op = Attention::new().options(Options::default().kernels(Kernels::Storage).nan_fill(true));
/// # let _ = op;
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Options {
    /// The kernel family (default [`Kernels::Auto`]: the fastest the adapter runs).
    pub kernels: Kernels,
    /// Forces the fused kernel's variant instead of the tuned one (its family then overrides
    /// [`Options::kernels`]); for testing and benchmarking every variant.
    pub flash_variant: Option<FlashVariant>,
    /// Forces the matmul's variant instead of the tuned one.
    pub matmul_variant: Option<MatmulVariant>,
    /// Whether the real-GPU fused kernel splits the keys over several workgroups (default
    /// [`KeySplit::Auto`]: on GPUs, for calls too small to fill one).
    pub key_split: KeySplit,
    /// Pre-fill the GPU outputs with NaN, so any element a kernel failed to write shows up
    /// (for testing kernels; default false).
    pub nan_fill: bool,
    /// Let NaN and ±Inf in the inputs through instead of rejecting them (default false: an
    /// `Error::NonFinite` naming the array and index). They then propagate as IEEE arithmetic
    /// and PyTorch do: a non-finite query, or a non-finite key or value at a key of non-zero
    /// weight, makes the row's context (and a non-finite score its weights) NaN or Inf. A key
    /// of weight exactly 0 — masked, hidden by causal, or underflowed — never contributes, so
    /// masked weights stay exactly 0 (PyTorch's fused kernels behave so). Results are then not
    /// checked for overflow either. Masks and the scale are still checked; a saved forward
    /// always rejects them.
    pub propagate_non_finite: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            kernels: Kernels::Auto,
            flash_variant: None,
            matmul_variant: None,
            key_split: KeySplit::Auto,
            nan_fill: false,
            propagate_non_finite: false,
        }
    }
}

crate::setters::setters!(Options {
    kernels: Kernels,
    flash_variant: Option<FlashVariant>,
    matmul_variant: Option<MatmulVariant>,
    key_split: KeySplit,
    nan_fill: bool,
    propagate_non_finite: bool,
});

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;

    #[test]
    fn projections_may_outlive_the_borrow_of_x() {
        let w = Array2::<f32>::eye(4);
        let p = Projections::new(w.view(), w.view(), w.view());
        for rows in 1..3 {
            let x = Array2::<f32>::zeros((rows, 4)); // dropped each turn, p lives on
            let inputs = Inputs::x(&x).projections(&p);
            assert_eq!(inputs.projections.map(|p| p.w_q.dim()), Some((4, 4)));
            let none: Option<&Projections<'_>> = None;
            assert!(Inputs::x(&x).projections(none).projections.is_none());
        }
        assert_eq!(p.w_k.dim(), (4, 4));
    }
}
