//! The problems `verify` runs: [`Case`] (sizes and options) and its numbers, drawn from a
//! seed ([`CaseData`]). The lists of cases are in `sweep.rs`.

use std::fmt;

use ndarray::{Array1, Array2, ArrayD, IxDyn};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

use crate::attention::{Attention, Dtype, Projections};
use crate::mask::Mask;
use crate::modifiers::{Modifiers, Preset};
use crate::variant::Kernels;

/// One problem: sizes and options; its numbers come from a seed. Built from [`Case::new`]
/// with one method per field: `Case::new(64, 16, 16, 16).heads(2).causal(true)`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Case {
    /// Batch axis size; `None` for a 2-D X.
    pub batch: Option<usize>,
    /// Sequence length.
    pub n: usize,
    /// Embedding width.
    pub d: usize,
    /// Query/key width (ignored without projections: then `d`).
    pub d_k: usize,
    /// Value width (ignored without projections: then `d`).
    pub d_v: usize,
    /// Heads.
    pub heads: usize,
    /// Causal mask.
    pub causal: bool,
    /// Projections given (else `Q = K = V = X`).
    pub weights: bool,
    /// Biases given (with projections).
    pub bias: bool,
    /// A scale other than the default.
    pub scale: Option<f32>,
    /// X is multiplied by this, to make large logits.
    pub magnitude: f32,
    /// Output projection to this width (with projections only).
    pub out_proj: Option<usize>,
    /// The kernel family.
    pub kernels: Kernels,
    /// The fused path without weights (else the weights are returned and checked too).
    pub fused: bool,
    /// A mask, drawn from the seed.
    pub mask: MaskCase,
    /// The operands' element type on the device.
    pub dtype: Dtype,
    /// Run on Q, K, V ([`Attention::run`] with `Inputs::qkv`) instead of X: Q
    /// `(batch, heads, n, d_k/heads)` against `n_kv` keys in `kv_heads` K/V heads
    /// (`(n_kv, kv_heads)`; grouped-query when fewer heads).
    pub sdpa: Option<(usize, usize)>,
    /// Score and mask modifiers, drawn from the seed after the mask.
    pub mods: ModsCase,
    /// The fused kernel's variant, forced (`None`: the tuner's choice).
    pub flash: Option<crate::variant::FlashVariant>,
    /// The matmul's variant, forced (`None`: the tuner's choice).
    pub matmul: Option<crate::variant::MatmulVariant>,
}

crate::setters::setters!(Case {
    batch: Option<usize>,
    n: usize,
    d: usize,
    d_k: usize,
    d_v: usize,
    heads: usize,
    causal: bool,
    weights: bool,
    bias: bool,
    scale: Option<f32>,
    magnitude: f32,
    out_proj: Option<usize>,
    kernels: Kernels,
    fused: bool,
    mask: MaskCase,
    dtype: Dtype,
    sdpa: Option<(usize, usize)>,
    mods: ModsCase,
    flash: Option<crate::variant::FlashVariant>,
    matmul: Option<crate::variant::MatmulVariant>,
});

/// Which score and mask modifiers a [`Case`] has (presets, see [`crate::modifiers`]), at the
/// case's sizes: `n` queries against `n_kv` keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModsCase {
    /// None.
    #[default]
    None,
    /// A sliding window: `n/4` keys back (at least 1), 2 ahead.
    Window,
    /// A window to the left only: 4 keys back, none ahead (`--window 4,0`).
    WindowLeft,
    /// Soft-capping at 2.
    Softcap,
    /// ALiBi with the standard slopes of the case's heads.
    Alibi,
    /// Documents: each sequence cut into documents at random positions (about one in 12).
    Documents,
    /// Prefix-LM: the first `n/3` positions attend bidirectionally.
    PrefixLm,
    /// Soft-capping, ALiBi, a window and documents at once.
    All,
}

impl ModsCase {
    /// The name `verify` prints.
    fn name(self) -> &'static str {
        match self {
            ModsCase::None => "none",
            ModsCase::Window => "window",
            ModsCase::WindowLeft => "window-left",
            ModsCase::Softcap => "softcap",
            ModsCase::Alibi => "alibi",
            ModsCase::Documents => "documents",
            ModsCase::PrefixLm => "prefix-lm",
            ModsCase::All => "all",
        }
    }
}

/// Which mask a [`Case`] has (see [`crate::mask`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MaskCase {
    /// None.
    #[default]
    None,
    /// Key lengths, one per sequence, from 0 (a sequence that sees nothing) to n.
    Lengths,
    /// A boolean `(batch, heads, n, n)` mask, about 70% true.
    Bool,
    /// A float `(n, n)` mask: biases in [-3, 3], about 10% `-inf`.
    Float,
}

impl Case {
    /// A plain single-head case with projections.
    pub const fn new(n: usize, d: usize, d_k: usize, d_v: usize) -> Self {
        Case {
            batch: None,
            n,
            d,
            d_k,
            d_v,
            heads: 1,
            causal: false,
            weights: true,
            bias: false,
            scale: None,
            magnitude: 1.0,
            out_proj: None,
            kernels: Kernels::Auto,
            fused: false,
            mask: MaskCase::None,
            dtype: Dtype::F32,
            sdpa: None,
            mods: ModsCase::None,
            flash: None,
            matmul: None,
        }
    }

    /// Per-head widths of Q/K and V.
    pub fn head_widths(&self) -> (usize, usize) {
        let (dk, dv) = match self.weights || self.sdpa.is_some() {
            true => (self.d_k, self.d_v),
            false => (self.d, self.d),
        };
        (dk / self.heads.max(1), dv / self.heads.max(1))
    }

    /// The same case on kernel family `kernels`, fused (no weights) or not.
    pub fn on(self, kernels: Kernels, fused: bool) -> Self {
        Case {
            kernels,
            fused,
            ..self
        }
    }

    /// The op this case configures.
    pub fn op(&self) -> Attention {
        let mut op = Attention::new()
            .heads(self.heads)
            .causal(self.causal)
            .options(
                crate::Options::default()
                    .kernels(self.kernels)
                    .nan_fill(true)
                    .flash_variant(self.flash)
                    .matmul_variant(self.matmul),
            );
        if let Some(s) = self.scale {
            op = op.scale(s);
        }
        op.return_weights(!self.fused).dtype(self.dtype)
    }

    /// Draws the case's arrays from `seed`.
    pub fn data(&self, seed: u64) -> CaseData {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut normal = |shape: &[usize], s: f32| {
            let len = shape.iter().product();
            let v: Vec<f32> = (0..len)
                .map(|_| s * rng.sample::<f32, _>(StandardNormal))
                .collect();
            ArrayD::from_shape_vec(IxDyn(shape), v).expect("shape and length agree")
        };
        let x_shape: Vec<usize> = match self.batch {
            Some(b) => vec![b, self.n, self.d],
            None => vec![self.n, self.d],
        };
        let x = normal(&x_shape, self.magnitude);
        let ws = 1.0 / (self.d as f32).sqrt();
        let two = |a: ArrayD<f32>| a.into_dimensionality::<ndarray::Ix2>().expect("2-D");
        let one = |a: ArrayD<f32>| a.into_dimensionality::<ndarray::Ix1>().expect("1-D");
        let weights = self.weights.then(|| {
            (
                two(normal(&[self.d, self.d_k], ws)),
                two(normal(&[self.d, self.d_k], ws)),
                two(normal(&[self.d, self.d_v], ws)),
            )
        });
        let biases = (self.weights && self.bias).then(|| {
            (
                one(normal(&[self.d_k], 0.5)),
                one(normal(&[self.d_k], 0.5)),
                one(normal(&[self.d_v], 0.5)),
            )
        });
        let output = match (self.weights, self.out_proj) {
            (true, Some(d_out)) => Some((
                two(normal(&[self.d_v, d_out], 1.0 / (self.d_v as f32).sqrt())),
                self.bias.then(|| one(normal(&[d_out], 0.5))),
            )),
            _ => None,
        };
        let batch = self.batch.unwrap_or(1);
        let n = self.n;
        let (n_kv, qkv) = match self.sdpa {
            None => (n, None),
            Some((s, kv_heads)) => {
                let h = self.heads;
                let four = |a: ArrayD<f32>| a.into_dimensionality::<ndarray::Ix4>().expect("4-D");
                let m = self.magnitude;
                let q = four(normal(&[batch, h, n, self.d_k / h], m));
                let k = four(normal(&[batch, kv_heads, s, self.d_k / h], m));
                let v = four(normal(&[batch, kv_heads, s, self.d_v / h], 1.0));
                (s, Some([q, k, v]))
            }
        };
        let mask = match self.mask {
            MaskCase::None => MaskData::None,
            MaskCase::Lengths => {
                MaskData::Lengths((0..batch).map(|_| rng.random_range(0..=n_kv)).collect())
            }
            MaskCase::Bool => {
                let shape = [batch, self.heads, n, n_kv];
                MaskData::Bool(ArrayD::from_shape_fn(IxDyn(&shape), |_| {
                    rng.random_bool(0.7)
                }))
            }
            MaskCase::Float => MaskData::Float(ArrayD::from_shape_fn(IxDyn(&[n, n_kv]), |_| {
                if rng.random_bool(0.1) {
                    f32::NEG_INFINITY
                } else {
                    rng.random_range(-3.0..3.0)
                }
            })),
        };
        let mods = self.modifiers(&mut rng, (batch, n, n_kv));
        CaseData {
            x,
            weights,
            biases,
            output,
            mask,
            qkv,
            mods,
        }
    }

    /// The case's modifiers for `batch` sequences of `n` queries and `n_kv` keys, documents
    /// drawn from `rng`.
    fn modifiers(
        &self,
        rng: &mut ChaCha8Rng,
        (batch, n, n_kv): (usize, usize, usize),
    ) -> Modifiers {
        let window = || Preset::Window {
            left: (n / 4).max(1) as u32,
            right: 2,
        };
        let softcap = || Preset::Softcap(2.0);
        let alibi = || Preset::Alibi(Preset::alibi_slopes(self.heads));
        let mut documents = || {
            let len = n.max(n_kv);
            let mut ids = Vec::with_capacity(batch * len);
            for _ in 0..batch {
                let mut id = 0;
                for _ in 0..len {
                    id += i32::from(rng.random_bool(1.0 / 12.0));
                    ids.push(id);
                }
            }
            Preset::Documents { ids, n: len as u32 }
        };
        let presets = match self.mods {
            ModsCase::None => vec![],
            ModsCase::Window => vec![window()],
            ModsCase::WindowLeft => vec![Preset::Window { left: 4, right: 0 }],
            ModsCase::Softcap => vec![softcap()],
            ModsCase::Alibi => vec![alibi()],
            ModsCase::Documents => vec![documents()],
            ModsCase::PrefixLm => vec![Preset::PrefixLm((n / 3) as u32)],
            ModsCase::All => vec![softcap(), alibi(), window(), documents()],
        };
        presets
            .into_iter()
            .fold(Modifiers::new(), Modifiers::preset)
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shape = match (self.sdpa, self.batch) {
            (Some((s, _)), b) => format!("{}x{}x{s}", b.unwrap_or(1), self.n),
            (None, Some(b)) => format!("{b}x{}x{}", self.n, self.d),
            (None, None) => format!("{}x{}", self.n, self.d),
        };
        write!(f, "{shape:<12}")?;
        let mut opts = Vec::new();
        // An sdpa case has Q, K, V of its own: no projections.
        let projected = self.weights && self.sdpa.is_none();
        if self.weights || self.sdpa.is_some() {
            opts.push(format!("dk={} dv={}", self.d_k, self.d_v));
        } else {
            opts.push("QKV=X".to_string());
        }
        if self.heads > 1 {
            opts.push(format!("H={}", self.heads));
        }
        if self.causal {
            opts.push("causal".into());
        }
        if self.bias && projected {
            opts.push("bias".into());
        }
        if let (true, Some(d_out)) = (projected, self.out_proj) {
            opts.push(format!("W_O->{d_out}"));
        }
        if let Some(s) = self.scale {
            opts.push(format!("scale={s:.3}"));
        }
        if self.magnitude != 1.0 {
            opts.push(format!("|X|x{}", self.magnitude));
        }
        if self.kernels != Kernels::Auto {
            opts.push(format!("[{}]", self.kernels));
        }
        if let Some(v) = self.flash {
            opts.push(format!("<{v}>"));
        }
        if let Some(v) = self.matmul {
            opts.push(format!("<{v}>"));
        }
        match self.mask {
            MaskCase::None => {}
            MaskCase::Lengths => opts.push("kv-lengths".into()),
            MaskCase::Bool => opts.push("mask=bool".into()),
            MaskCase::Float => opts.push("mask=float".into()),
        }
        if let Some((_, kv_heads)) = self.sdpa {
            opts.push(format!("sdpa Hkv={kv_heads}"));
        }
        if self.mods != ModsCase::None {
            opts.push(format!("mods={}", self.mods.name()));
        }
        if self.dtype != Dtype::F32 {
            opts.push(self.dtype.to_string());
        }
        if self.fused {
            opts.push("fused".into());
        }
        write!(f, "{}", opts.join(" "))
    }
}

/// A case's arrays.
#[derive(Debug, Clone)]
pub struct CaseData {
    /// X.
    pub x: ArrayD<f32>,
    /// `W_Q, W_K, W_V`.
    pub weights: Option<(Array2<f32>, Array2<f32>, Array2<f32>)>,
    /// `b_Q, b_K, b_V`.
    pub biases: Option<(Array1<f32>, Array1<f32>, Array1<f32>)>,
    /// `W_O` and `b_O`.
    pub output: Option<(Array2<f32>, Option<Array1<f32>>)>,
    /// The mask's arrays.
    pub mask: MaskData,
    /// Q, K, V of a case run on them ([`Case::sdpa`]: [`Attention::run`] with
    /// `Inputs::qkv`).
    pub qkv: Option<[ndarray::Array4<f32>; 3]>,
    /// The score and mask modifiers (empty without).
    pub mods: Modifiers,
}

/// A case's mask arrays.
#[derive(Debug, Clone)]
pub enum MaskData {
    /// No mask.
    None,
    /// Key lengths.
    Lengths(Vec<usize>),
    /// A boolean mask.
    Bool(ArrayD<bool>),
    /// A float mask.
    Float(ArrayD<f32>),
}

impl CaseData {
    /// The mask over these arrays, with the modifiers.
    pub fn mask(&self) -> Mask<'_> {
        let mask = match &self.mask {
            MaskData::None => Mask::none(),
            MaskData::Lengths(l) => Mask::none().with_kv_lengths(l),
            MaskData::Bool(m) => Mask::boolean(m.view()),
            MaskData::Float(m) => Mask::additive(m.view()),
        };
        mask.with_modifiers(&self.mods)
    }

    /// How far the score modifiers can move a logit: ALiBi's largest slope times the
    /// longest distance (the others do not enlarge it). Added to the logit bound of the
    /// tolerance.
    pub fn mods_bound(&self) -> f64 {
        let len = self
            .qkv
            .as_ref()
            .map_or(self.x.shape()[self.x.ndim() - 2], |[q, k, _]| {
                q.dim().2.max(k.dim().2)
            });
        self.mods
            .presets()
            .iter()
            .map(|p| match p {
                Preset::Alibi(slopes) => {
                    let max = slopes.iter().fold(0.0f32, |m, s| m.max(s.abs()));
                    f64::from(max) * len as f64
                }
                _ => 0.0,
            })
            .sum()
    }

    /// The projections as views.
    pub fn projections(&self) -> Option<Projections<'_>> {
        self.weights
            .as_ref()
            .map(|w| Projections::of(w, self.biases.as_ref(), self.output.as_ref()))
    }
}
