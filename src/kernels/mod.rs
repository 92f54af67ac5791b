//! The kernels: one WGSL file under `shaders/` and one Rust file here per kernel, with the
//! same name (the fused forward kernels' in [`flash`], a family behind one trait),
//! registered once in `registry!` below.
//!
//! A kernel's Rust file implements [`Kernel`]: the entry point, the workgroup size, the
//! resources bound after its uniform block, its named specialisation constants (a
//! [`constants!`](wgsl::constants) struct), its uniform (a [`uniform!`](wgsl::uniform) struct
//! whose WGSL `struct Params` is generated), and which storage element types may be f16. It
//! also says how to dispatch it: a function that fills the uniform and calls [`record`].
//! The pipeline cache key ([`PipelineKey`]) is derived from that description, and a unit test
//! checks every description against what naga reads in the WGSL.

pub(crate) mod loops;
pub(crate) mod wgsl;

pub(crate) mod adam;
pub(crate) mod add;
pub(crate) mod bias_grad;
pub(crate) mod bias_grad_reduce;
pub(crate) mod block_map;
pub(crate) mod coop_matmul;
pub(crate) mod decode_combine;
pub(crate) mod decode_partial;
pub(crate) mod decode_partial_gpu;
pub(crate) mod flash;
pub(crate) mod flash_backward_dot;
pub(crate) mod flash_backward_kv;
pub(crate) mod flash_backward_kv_subgroup;
pub(crate) mod flash_backward_q;
pub(crate) mod flash_backward_q_subgroup;
pub(crate) mod fma_peak;
pub(crate) mod matmul;
pub(crate) mod matmul_blocked;
pub(crate) mod matmul_subgroup;
pub(crate) mod mods;
pub(crate) mod mse;
pub(crate) mod pack;
mod record;
pub(crate) mod row_stats;
pub(crate) mod softmax;
pub(crate) mod swap_heads;
pub(crate) mod weighted_sum;
pub(crate) use record::{capture, collect_keys, collecting, record, record_with, Captured};

// The fused forward kernels live in `flash/`, behind one trait; their modules keep their
// kernels' names here, as the registry below and the other kernels name them.
pub(crate) use flash::{flash_blocked, flash_combine, flash_coop, flash_subgroup, flash_tiled};

#[cfg(test)]
mod tests;

use crate::error::{Error, Limit, Result};
use crate::gpu::pipeline::{PipelineHash, PipelineRecipe, PipelineSource};
use crate::gpu::timing;
use crate::gpu::Gpu;
use wgsl::{Constants, Uniform};

/// What a kernel's Rust file states about its WGSL file.
pub(crate) trait Kernel {
    /// Its name in the registry.
    const ID: KernelId;
    /// The entry point.
    const ENTRY: &'static str = "main";
    /// `@workgroup_size`, each dimension a number or the name of one of the constants.
    const WORKGROUP: [Dim; 3];
    /// The resources at bindings 1, 2, … (binding 0 is the uniform `p: Params`).
    const BINDINGS: &'static [Slot];
    /// How many of [`Kernel::BINDINGS`] are storage buffers (read or read-write): what a
    /// stage's `max_storage_buffers_per_shader_stage` counts of the kernel's own.
    fn storage_bindings() -> usize {
        Self::BINDINGS
            .iter()
            .filter(|s| matches!(s, Slot::Read(_) | Slot::ReadWrite(_)))
            .count()
    }
    /// The element-type aliases (`alias Q_T = f32;` or `f16`) the host prepends: bit `i` of a
    /// dispatch's `f16` mask makes `DTYPES[i]` f16.
    const DTYPES: &'static [&'static str] = &[];
    /// Whether it uses subgroup operations (needs `Features::SUBGROUP`).
    const SUBGROUPS: bool = false;
    /// The constant that, when not 0, makes it use subgroup operations (its lines marked
    /// `// if NAME` are dropped otherwise, see [`wgsl::drop_disabled`]); the host then checks
    /// `Features::SUBGROUP` itself.
    const SUBGROUPS_IF: Option<&'static str> = None;
    /// Whether every index it computes is proven in bounds (the proof in its WGSL header,
    /// which says `// runtime checks: off` in its first five lines): its module is then
    /// created with naga's runtime checks off, so inner loops carry no clamps, unless the
    /// context asks for them ([`crate::Context::with_runtime_checks`]).
    const TRUSTED: bool = false;
    /// Whether it uses cooperative matrices (needs `Features::EXPERIMENTAL_COOPERATIVE_MATRIX`
    /// and subgroups): its source then gets [`coop_matmul::coop_header`], sized by its
    /// constant `S`.
    const COOP: bool = false;
    /// The element type (an index into `DTYPES`) its storage textures' texels follow: in a
    /// build where that type is f16, every `texture_storage_2d<rgba32float, …>` of its file
    /// is `rgba16float` (half the memory and bandwidth, and exact for f16 values).
    const TEXEL_DTYPE: Option<usize> = None;
    /// Its specialisation constants.
    type Consts: Constants;
    /// Its uniform block.
    type Params: Uniform;

    /// An upper bound on the loop iterations its busiest invocation runs over all its loops,
    /// for a dispatch with `consts` and `params` in `build` (see [`loops`]: lavapipe stops
    /// an invocation's loops past 65,535 and the dispatch is refused before that). The
    /// default, 0, is for kernels without loops: a kernel with any loop counts it, and under
    /// the WGSL sanitizer a dispatch that runs more than this is an error.
    fn loops(_consts: &Self::Consts, _params: &Self::Params, _build: loops::Build) -> u64 {
        0
    }
}

/// One dimension of a workgroup size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dim {
    /// A literal.
    Fixed(u32),
    /// One of the kernel's constants.
    Const(&'static str),
}

/// A resource a kernel binds, named as its WGSL variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// `var<storage, read>`.
    Read(&'static str),
    /// `var<storage, read_write>`.
    ReadWrite(&'static str),
    /// `texture_2d<f32>`, read with `textureLoad`.
    Texture(&'static str),
    /// `texture_storage_2d<rgba32float, write>` (`rgba16float` when the kernel's texel
    /// element type is f16: [`Kernel::TEXEL_DTYPE`]).
    StorageTexture(&'static str),
}

/// Everything the pipeline cache and the tests need about one kernel, read from its
/// [`Kernel`] implementation and its file (the tests check the layout fields against naga).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) struct KernelInfo {
    /// The WGSL file's name (also the label of its pipelines and passes).
    pub file: &'static str,
    /// The WGSL file as stored (without what the host prepends).
    pub source: &'static str,
    pub entry: &'static str,
    pub workgroup: [Dim; 3],
    pub bindings: &'static [Slot],
    pub dtypes: &'static [&'static str],
    pub constants: &'static [&'static str],
    pub subgroups: bool,
    /// [`Kernel::SUBGROUPS_IF`].
    pub subgroups_if: Option<&'static str>,
    /// [`Kernel::TRUSTED`].
    pub trusted: bool,
    /// [`Kernel::COOP`].
    pub coop: bool,
    /// [`Kernel::TEXEL_DTYPE`].
    pub texel_dtype: Option<usize>,
    /// The generated `struct Params`.
    pub params: fn() -> String,
    /// `(name, WGSL type, offset)` of the uniform's fields.
    pub fields: &'static [(&'static str, &'static str, usize)],
    pub params_size: usize,
}

impl KernelInfo {
    fn of<K: Kernel>(file: &'static str, source: &'static str) -> Self {
        KernelInfo {
            file,
            source,
            entry: K::ENTRY,
            workgroup: K::WORKGROUP,
            bindings: K::BINDINGS,
            dtypes: K::DTYPES,
            constants: K::Consts::NAMES,
            subgroups: K::SUBGROUPS,
            subgroups_if: K::SUBGROUPS_IF,
            trusted: K::TRUSTED,
            coop: K::COOP,
            texel_dtype: K::TEXEL_DTYPE,
            params: K::Params::wgsl,
            fields: K::Params::FIELDS,
            params_size: std::mem::size_of::<K::Params>(),
        }
    }

    /// The full WGSL text for constant `values` (in [`KernelInfo::constants`] order) and
    /// element types `f16`.
    #[cfg(test)]
    pub fn source_with(&self, values: &[u32], f16: u8) -> String {
        self.source_built(values, f16, 0, true)
    }

    /// The full WGSL text with the modifiers registered under `mods` (0: none, the identity
    /// stubs for a kernel that calls them; see [`mods`]), its `// unroll` loops unrolled or
    /// not.
    fn source_built(&self, values: &[u32], f16: u8, mods: u64, unrolled: bool) -> String {
        let named: Vec<(&str, u32)> = self
            .constants
            .iter()
            .copied()
            .zip(values.iter().copied())
            .collect();
        let params = (self.params)();
        let source = wgsl::compose(self.source, self.dtypes, f16, &named, &params, unrolled);
        let source = self.with_coop(source, &named);
        let source = mods::with_modifiers(source, self.source, mods);
        let source = match self.texel_dtype.is_some_and(|i| f16 & (1 << i) != 0) {
            true => source.replace(
                "texture_storage_2d<rgba32float,",
                "texture_storage_2d<rgba16float,",
            ),
            false => source,
        };
        // The marker first, so a tool reading the composed file (CI's compiler check) knows.
        match self.trusted {
            true => format!("{TRUSTED_MARKER}\n{source}"),
            false => source,
        }
    }
}

impl KernelInfo {
    /// `source` with the cooperative-matrix header when the kernel is a coop kernel.
    pub fn with_coop(&self, source: String, named: &[(&str, u32)]) -> String {
        if !self.coop {
            return source;
        }
        let size = named.iter().find(|(n, _)| *n == "S").map_or(16, |c| c.1);
        coop_matmul::coop_header(source, size)
    }
}

/// What a trusted kernel's WGSL says in its first five lines, and what its composed source
/// starts with.
pub(crate) const TRUSTED_MARKER: &str = "// runtime checks: off";

/// The WGSL files under `shaders/` that are no kernel of their own: the prelude every kernel
/// gets, and code the registry appends to the kernels that share it.
#[cfg(test)]
pub(crate) const SHARED_WGSL: &[&str] = &["prelude.wgsl", "flash_backward_io.wgsl"];

/// The registry: every kernel, its module (`src/kernels/<name>.rs`) and its WGSL file
/// (`shaders/<name>.wgsl`), which share the name; `+ shared` appends `shaders/<shared>.wgsl`
/// (code two kernels share, one of `SHARED_WGSL`) to the kernel's source.
macro_rules! registry {
    ($($id:ident => $module:ident $(+ $shared:ident)?),* $(,)?) => {
        /// Every kernel the crate has.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub(crate) enum KernelId {
            $(
                #[doc = concat!("`shaders/", stringify!($module), ".wgsl`")]
                $id
            ),*
        }

        impl KernelId {
            /// All kernels.
            #[cfg_attr(not(test), allow(dead_code))]
            pub(crate) const ALL: &'static [KernelId] = &[$(KernelId::$id),*];

            /// Its WGSL file's name, the label of its pipelines and passes.
            pub(crate) fn file(self) -> &'static str {
                match self {
                    $(KernelId::$id => concat!(stringify!($module), ".wgsl")),*
                }
            }

            /// What its Rust file states, and its WGSL source.
            pub(crate) fn info(self) -> KernelInfo {
                match self {
                    $(KernelId::$id => KernelInfo::of::<$module::Shader>(
                        self.file(),
                        concat!(
                            include_str!(concat!("../../shaders/", stringify!($module), ".wgsl")),
                            $("\n", include_str!(concat!("../../shaders/", stringify!($shared), ".wgsl")),)?
                        ),
                    )),*
                }
            }
        }
    };
}

registry! {
    Matmul => matmul,
    MatmulBlocked => matmul_blocked,
    MatmulSubgroup => matmul_subgroup,
    Pack => pack,
    RowStats => row_stats,
    Softmax => softmax,
    WeightedSum => weighted_sum,
    FlashTiled => flash_tiled,
    FlashBlocked => flash_blocked,
    FlashCombine => flash_combine,
    FlashSubgroup => flash_subgroup,
    FlashBackwardDot => flash_backward_dot,
    FlashBackwardKv => flash_backward_kv + flash_backward_io,
    FlashBackwardQ => flash_backward_q + flash_backward_io,
    FlashBackwardKvSubgroup => flash_backward_kv_subgroup,
    FlashBackwardQSubgroup => flash_backward_q_subgroup,
    FmaPeak => fma_peak,
    CoopMatmul => coop_matmul,
    FlashCoop => flash_coop,
    DecodePartial => decode_partial,
    DecodePartialGpu => decode_partial_gpu,
    DecodeCombine => decode_combine,
    SwapHeads => swap_heads,
    Add => add,
    Adam => adam,
    Mse => mse,
    BlockMap => block_map,
    BiasGrad => bias_grad,
    BiasGradReduce => bias_grad_reduce,
}

/// The most constants one kernel may have: the slots of a [`PipelineKey`]. A
/// [`constants!`](wgsl::constants) table with more does not compile.
pub(crate) const MAX_CONSTS: usize = 20;

/// What a cached pipeline is built from, derived from a kernel's description: the kernel,
/// its constants' values (in its [`Constants::NAMES`] order), and which element types are f16.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PipelineKey {
    pub kernel: KernelId,
    pub consts: [u32; MAX_CONSTS],
    pub f16: u8,
    /// The modifiers' code (see [`mods`]), 0 for none.
    pub mods: u64,
    /// What the device emulates (the GPU stand-in's subgroups and cooperative matrices).
    pub emulate: crate::gpu::hardware::Emulation,
}

impl PipelineKey {
    /// The key of kernel `K` built with `consts` and element types `f16`.
    pub fn of<K: Kernel>(consts: &K::Consts, f16: u8) -> Self {
        // Any `Constants`, not only the `constants!` tables: too many is a compile error.
        const { assert!(<K::Consts as Constants>::NAMES.len() <= MAX_CONSTS) };
        let mut values = [0; MAX_CONSTS];
        for (slot, v) in values.iter_mut().zip(consts.values()) {
            *slot = v;
        }
        PipelineKey {
            kernel: K::ID,
            consts: values,
            f16,
            mods: 0,
            emulate: Default::default(),
        }
    }

    /// The full WGSL text this key builds.
    pub fn source(&self) -> String {
        let info = self.kernel.info();
        // Emulated subgroups: loops kept (see `wgsl::compose`).
        let unrolled = self.emulate.subgroup == 0;
        let consts = &self.consts[..info.constants.len()];
        let mut source = info.source_built(consts, self.f16, self.mods, unrolled);
        if info.coop && self.emulate.coop != 0 {
            let size = self.constant("S").unwrap_or(16);
            let wide = self.emulate.subgroup != 0;
            source = crate::gpu::coop::emulate::rewrite(&source, size, wide);
        }
        if self.emulate.subgroup != 0 {
            source = crate::gpu::subgroups::emulate(&source, self.emulate.subgroup);
        }
        source
    }

    /// The value of the kernel's constant `name` (its WGSL name) in this key, if it has one.
    pub fn constant(&self, name: &str) -> Option<u32> {
        let info = self.kernel.info();
        let i = info.constants.iter().position(|&n| n == name)?;
        Some(self.consts[i])
    }
}

/// The device layer caches pipelines under a hash of the key and builds them from the
/// kernel's description; it knows nothing of kernels.
impl PipelineRecipe for PipelineKey {
    fn pipeline_hash(&self) -> PipelineHash {
        use std::hash::{Hash, Hasher};
        // Two 64-bit SipHashes of the key, each behind its own prefix: 128 bits.
        let half = |salt: u8| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            salt.hash(&mut h);
            self.hash(&mut h);
            h.finish()
        };
        PipelineHash(u128::from(half(0)) << 64 | u128::from(half(1)))
    }

    fn describe(&self) -> PipelineSource {
        let info = self.kernel.info();
        PipelineSource {
            label: info.file,
            entry: info.entry,
            wgsl: self.source(),
            // A caller's code is never compiled with runtime checks off.
            trusted: info.trusted && self.mods == 0,
        }
    }
}

/// Splits `count` workgroups into an `(x, y)` grid under the per-dimension limit; kernels
/// recover the linear id as `x + y · num_workgroups.x` and drop ids past `count`.
///
/// # Errors
/// [`Error::LimitExceeded`] when even a square grid cannot hold `count`.
pub(crate) fn grid(count: u64, max_per_dim: u32) -> Result<(u32, u32)> {
    let max = u64::from(max_per_dim.max(1));
    if count == 0 {
        return Ok((0, 0));
    }
    let x = count.min(max);
    let y = count.div_ceil(x);
    if y > max {
        return Err(Error::LimitExceeded {
            what: "dispatch".into(),
            needed: format!("{count} workgroups"),
            limit: format!("{} workgroups", max * max),
            limit_name: Limit::MaxComputeWorkgroupsPerDimension,
        });
    }
    Ok((x as u32, y as u32))
}

/// A resource bound to a kernel after its uniform block.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Binding<'a> {
    /// A storage buffer.
    Buffer(&'a wgpu::Buffer),
    /// A sampled or storage texture.
    Texture(&'a wgpu::TextureView),
}

impl<'a> From<&'a wgpu::Buffer> for Binding<'a> {
    fn from(b: &'a wgpu::Buffer) -> Self {
        Binding::Buffer(b)
    }
}

impl<'a> From<&'a crate::gpu::pool::Buf> for Binding<'a> {
    fn from(b: &'a crate::gpu::pool::Buf) -> Self {
        Binding::Buffer(b)
    }
}

impl<'a> From<&'a wgpu::TextureView> for Binding<'a> {
    fn from(t: &'a wgpu::TextureView) -> Self {
        Binding::Texture(t)
    }
}

/// A mask as the kernels read it: the bias buffer (see [`crate::mask::gpu_layout`]) and its
/// element strides over `(batch, head, query, key)`, 0 along broadcast axes; and the
/// caller's score and mask modifiers ([`mods::ModsUpload`]), if any.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MaskArg<'a> {
    /// The bias, `f32::MIN` where masked out; `None` with modifiers only.
    pub buffer: Option<&'a wgpu::Buffer>,
    /// Element strides over `(batch, head, query, key)`.
    pub strides: [u32; 4],
    /// The modifiers.
    pub mods: Option<&'a mods::ModsUpload>,
}

impl<'a> MaskArg<'a> {
    /// What a kernel that does not take modifiers binds and is built with for `mask`: the
    /// buffer (the context's stand-in when there is none), the strides, and the `MASK`
    /// constant.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the mask carries modifiers: this kernel would ignore them.
    pub fn parts(
        ctx: &'a Gpu,
        mask: Option<MaskArg<'a>>,
    ) -> Result<(&'a wgpu::Buffer, [u32; 4], u32)> {
        if mask.is_some_and(|m| m.mods.is_some()) {
            return Err(mods::unsupported(ctx, "this path"));
        }
        Ok(Self::bias_parts(ctx, mask))
    }

    /// [`MaskArg::parts`] for a kernel that applies the modifiers too.
    pub fn bias_parts(
        ctx: &'a Gpu,
        mask: Option<MaskArg<'a>>,
    ) -> (&'a wgpu::Buffer, [u32; 4], u32) {
        match mask.and_then(|m| m.buffer.map(|b| (b, m.strides))) {
            Some((b, strides)) => (b, strides, 1),
            None => (ctx.stand_in(), [0; 4], 0),
        }
    }

    /// The modifiers of `mask`, if any.
    pub fn mods(mask: Option<MaskArg<'a>>) -> Option<&'a mods::ModsUpload> {
        mask.and_then(|m| m.mods)
    }
}

/// Converts a size to the u32 the kernels index with.
pub(crate) fn u32_of(what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::LimitExceeded {
        what: what.to_string(),
        needed: v.to_string(),
        limit: u32::MAX.to_string(),
        limit_name: Limit::U32Indexing,
    })
}

/// Where an operand's element `(g, row, col)` lives:
/// `off + batch·(g / heads) + head·(g % heads) + row·row_stride + col·col_stride`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Strides {
    /// First element.
    pub off: u32,
    /// Per batch index.
    pub batch: u32,
    /// Per head.
    pub head: u32,
    /// Per row.
    pub row: u32,
    /// Per column.
    pub col: u32,
}

impl Strides {
    /// A row-major `rows × cols` matrix inside rows of `width` elements, starting at column
    /// `head·cols` for head `head` and at `batch` elements per batch index.
    pub fn row_major(width: u32, head_cols: u32, batch: u32) -> Self {
        Strides {
            off: 0,
            batch,
            head: head_cols,
            row: width,
            col: 1,
        }
    }

    /// The same matrix read transposed.
    pub fn transposed(self) -> Self {
        Strides {
            row: self.col,
            col: self.row,
            ..self
        }
    }
}
