//! Which kernels compute a call: the two kernel families ([`Kernels`]), the variants of the
//! fused kernel ([`FlashVariant`]) and of the matmul ([`MatmulVariant`]), and recording a
//! chosen variant. The tuner picks among these; the attention plan names them.

use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::coop_matmul;
pub(crate) use crate::kernels::flash::FlashVariant;
use crate::kernels::flash::{self, FusedIo};
pub(crate) use crate::kernels::flash_combine::KeySplit;
use crate::kernels::flash_tiled::{Flash, FlashOut};
use crate::kernels::matmul::Matmul;
use crate::kernels::matmul_blocked;
use crate::kernels::matmul_subgroup::{self, Epilogue, Operands};
use crate::kernels::MaskArg;

/// Which kernel family computes the attention.
///
/// The storage-buffer kernels run on every adapter; the subgroup kernels read K and V from
/// textures and share them through subgroup shuffles, which is what is fast on lavapipe (where
/// storage and workgroup memory are slow), and need `Features::SUBGROUP` with a fixed
/// subgroup size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Kernels {
    /// Pick for the adapter by measuring (the autotuner); a problem too large for the
    /// subgroup family's textures runs on the storage kernels.
    #[default]
    Auto,
    /// Storage buffers and workgroup-memory tiles (any adapter).
    Storage,
    /// Textures and subgroup shuffles (adapters with a fixed subgroup size).
    Subgroup,
    /// Cooperative matrices (tensor cores: `Features::EXPERIMENTAL_COOPERATIVE_MATRIX`, see
    /// [`Context::coop_shape`]): `flash_coop` for the fused pass, `coop_matmul` for the
    /// projections and the scores, the storage family's softmax and weighted sum for the
    /// weights. Forcing it elsewhere is [`Error::Unsupported`].
    Coop,
}

impl Kernels {
    /// The families `ctx` can run: storage always, subgroup where the adapter has a fixed
    /// subgroup size.
    pub fn available(ctx: &Context) -> Vec<Kernels> {
        let mut families = vec![Kernels::Storage];
        if ctx.subgroup_size().is_some() {
            families.push(Kernels::Subgroup);
        }
        families
    }
}

impl std::str::FromStr for Kernels {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Kernels::Auto),
            "storage" => Ok(Kernels::Storage),
            "subgroup" => Ok(Kernels::Subgroup),
            "coop" => Ok(Kernels::Coop),
            _ => Err(Error::invalid(
                "kernels",
                format!(
                    "unknown kernel family {s:?}; expected auto, storage or subgroup (or coop: \
                     tensor cores)"
                ),
            )),
        }
    }
}

impl std::fmt::Display for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kernels::Auto => "auto",
            Kernels::Storage => "storage",
            Kernels::Subgroup => "subgroup",
            Kernels::Coop => "coop",
        })
    }
}

impl FlashVariant {
    /// The family the variant belongs to: [`Kernels::Storage`] (`flash_tiled`,
    /// `flash_blocked`), [`Kernels::Subgroup`] or [`Kernels::Coop`]; never [`Kernels::Auto`].
    ///
    /// ```
    /// use wgpu_attention::internals::FlashVariant;
    /// use wgpu_attention::Kernels;
    /// assert_eq!(FlashVariant::Blocked { rows: 64, keys: 32 }.family(), Kernels::Storage);
    /// assert_eq!(FlashVariant::Tiled { keys: 32 }.family(), Kernels::Storage);
    /// assert_eq!(FlashVariant::Subgroup { rows_per_lane: 2 }.family(), Kernels::Subgroup);
    /// assert_eq!(FlashVariant::Coop.family(), Kernels::Coop);
    /// ```
    pub fn family(self) -> Kernels {
        match self {
            FlashVariant::Subgroup { .. } => Kernels::Subgroup,
            FlashVariant::Tiled { .. } | FlashVariant::Blocked { .. } => Kernels::Storage,
            FlashVariant::Coop => Kernels::Coop,
        }
    }
}

/// Which kernel computes a matmul.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum MatmulVariant {
    /// `matmul.wgsl`: storage buffers, 64 × 64 workgroup tiles in workgroup memory.
    Tiled,
    /// `matmul_blocked.wgsl`, for GPUs: `per_thread × per_thread` outputs per thread (4 or
    /// 8) in registers, `vec4` loads, double-buffered workgroup tiles. Operands it cannot read
    /// as aligned vec4s are computed by [`MatmulVariant::Tiled`].
    Blocked {
        /// Outputs per thread along each side: 4 or 8.
        per_thread: u32,
    },
    /// `matmul_subgroup.wgsl`: textures and subgroup shuffles, `(subgroup size ·
    /// rows_per_lane) × (4 · subgroup size)` tiles.
    Subgroup {
        /// Tile rows per lane.
        rows_per_lane: u32,
    },
    /// `coop_matmul.wgsl`: cooperative matrices (tensor cores), 64 × 64 workgroup tiles;
    /// only where [`Context::coop_shape`] is `Some`.
    Coop,
}

impl std::fmt::Display for MatmulVariant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MatmulVariant::Tiled => write!(f, "matmul-tiled(64x64)"),
            MatmulVariant::Blocked { per_thread } => {
                write!(f, "matmul-blocked({per_thread}x{per_thread})")
            }
            MatmulVariant::Coop => write!(f, "matmul-coop(64x64)"),
            MatmulVariant::Subgroup { rows_per_lane } => {
                write!(f, "matmul-subgroup(t={rows_per_lane})")
            }
        }
    }
}

/// The matmul variant that runs for `variant` on these operands: `variant`, except the
/// register-blocked kernel on operands it cannot take (not contiguous in whole aligned vec4s:
/// [`matmul_blocked::eligible`]), where the scalar kernel runs; with that kernel's constants.
pub(crate) fn matmul_runs_as(
    mm: &Matmul,
    variant: MatmulVariant,
    a: &wgpu::Buffer,
    b: &wgpu::Buffer,
) -> (MatmulVariant, Option<matmul_blocked::MatmulBlockedConsts>) {
    match variant {
        MatmulVariant::Blocked { per_thread } => {
            match matmul_blocked::eligible(mm, per_thread / 4, a, b) {
                Some(consts) => (variant, Some(consts)),
                None => (MatmulVariant::Tiled, None),
            }
        }
        v => (v, None),
    }
}

/// Records `c ← a·b (+ bias)` with `variant`; `bias` is read only when `mm` has a bias (any
/// buffer may stand in otherwise). Returns the variant recorded: `variant`, or the scalar
/// kernel where the register-blocked one cannot take the operands ([`matmul_runs_as`]), with
/// a warning naming why (once per shape and variant in a process).
///
/// # Errors
/// Size limits, the subgroup variant on an adapter without a fixed subgroup size, and the
/// coop variant without cooperative matrices ([`Error::Unsupported`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn record_matmul(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    mm: &Matmul,
    variant: MatmulVariant,
    a: &wgpu::Buffer,
    b: &wgpu::Buffer,
    bias: &wgpu::Buffer,
    c: &wgpu::Buffer,
) -> Result<MatmulVariant> {
    let (ran, blocked) = matmul_runs_as(mm, variant, a, b);
    if ran != variant {
        warn_fallback(mm, variant, ran);
    }
    match ran {
        MatmulVariant::Tiled => mm.dispatch(ctx, encoder, a, b, bias, c)?,
        MatmulVariant::Blocked { .. } => {
            let consts = blocked.expect("matmul_runs_as gives the blocked kernel its constants");
            matmul_blocked::dispatch(ctx, encoder, mm, consts, (a, b, bias), (c, c, c), None)?
        }
        MatmulVariant::Coop => coop_matmul::dispatch(ctx, encoder, mm, (a, b, bias, c))?,
        MatmulVariant::Subgroup { rows_per_lane } => {
            let ops = Operands::pack(ctx, encoder, mm, a, b)?;
            matmul_subgroup::dispatch(
                ctx,
                encoder,
                mm,
                rows_per_lane,
                &ops,
                bias,
                Epilogue::Plain,
                None,
                c,
            )?
        }
    }
    Ok(ran)
}

/// The warning of a matmul that runs as another variant, once per shape and pair in a
/// process (a call repeated would repeat it).
fn warn_fallback(mm: &Matmul, variant: MatmulVariant, ran: MatmulVariant) {
    static SAID: std::sync::Mutex<Vec<(usize, usize, usize, MatmulVariant)>> =
        std::sync::Mutex::new(Vec::new());
    let key = (mm.m, mm.n, mm.k, variant);
    let mut said = SAID
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !said.contains(&key) {
        said.push(key);
        log::warn!(
            "{variant} does not run on a {} × {} × {} matmul whose operands are not contiguous \
             in whole aligned vec4s; {ran} runs instead",
            mm.m,
            mm.k,
            mm.n
        );
    }
}

/// Records the fused pass `out ← softmax(scale·Q·Kᵀ + mask)·V` with `variant` (and each
/// row's log-sum-exp, when `out` asks for it) through its kernel in the fused family
/// ([`crate::kernels::flash`]), `flash_blocked` with the context's inner-loop options;
/// `host`, the contents of K = V when they are one host array, lets the subgroup variant
/// pack them on the CPU. Returns the variant recorded: `variant`, or the one that runs in
/// its place (with a warning naming why: see [`flash::resolve`]).
///
/// # Errors
/// As the variant's kernel: size limits, no fixed subgroup size for the subgroup variant.
#[allow(clippy::too_many_arguments)]
pub(crate) fn record_flash<'a>(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    op: &Flash,
    variant: FlashVariant,
    (q, k, v): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
    out: impl Into<FlashOut<'a>>,
    mask: Option<MaskArg<'_>>,
    host: Option<&[f32]>,
) -> Result<FlashVariant> {
    let io = FusedIo {
        q,
        k,
        v,
        out: out.into(),
        mask,
        host,
    };
    flash::record(ctx, encoder, op, variant, ctx.blocked_options(), io)
}
