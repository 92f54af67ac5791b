//! Score and mask modifiers (programmable attention, as FlexAttention): a caller's WGSL functions
//! that change the scaled scores (`score_mod`) or which keys a query sees (`mask_mod`), with
//! named read-only buffers they may index, and the presets written with the same mechanism
//! (sliding window, soft-capping, ALiBi, document masking, prefix-LM).
//!
//! A stranger's code is checked before any pipeline exists ([`Modifiers::check`]): parsed and
//! validated by naga; a mistake is one error naming the caller's file, line and column. A
//! modifier may not declare bindings, workgroup or private memory, entry points, atomics,
//! barriers or subgroup operations, and its functions must have the signatures
//! [`SCORE_MOD_SIGNATURE`], [`MASK_MOD_SIGNATURE`] and [`SCORE_MOD_GRAD_SIGNATURE`].
//!
//! The kernels call generated functions, `wa_score(score, b, h, q, kv) -> f32` (every
//! score modifier in order, the caller's first), `wa_mask(b, h, q, kv) -> bool` (every
//! mask modifier, and-ed) and, in the backward, `wa_score_grad(score, b, h, q, kv) -> f32`
//! (`d wa_score / d score`: the product of each score modifier's derivative at its input,
//! the caller's `score_mod_grad` for its `score_mod`), from [`Modifiers::wgsl`].
//!
//! The f64 reference (`reference::run`, `reference::backward`) cannot run WGSL: a caller
//! gives the same modifiers as Rust closures too ([`Modifiers::score_mod_cpu`],
//! [`Modifiers::mask_mod_cpu`], [`Modifiers::score_mod_grad_cpu`]), which the reference
//! applies where the kernels apply the WGSL. The kernels never see them.

mod blocks;
mod check;
mod preset;
mod spec;
#[cfg(test)]
mod tests;

use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};

pub(crate) use blocks::Grid;
pub use preset::Preset;
pub use spec::{BufferSpec, ModifierSpec, PresetSpec, RelativeBiasSpec, SourceSpec};

/// What a caller's score modifier must be: applied to the scaled score, before masking.
pub const SCORE_MOD_SIGNATURE: &str =
    "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32";
/// What a caller's mask modifier must be: `true` = attend.
pub const MASK_MOD_SIGNATURE: &str = "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool";
/// The derivative of a caller's score modifier by its score, for the backward.
pub const SCORE_MOD_GRAD_SIGNATURE: &str =
    "fn score_mod_grad(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32";

/// The prefix of every name the generated code uses; a caller's names may not start with it.
const RESERVED_PREFIX: &str = "wa_";

/// The elements of a modifier buffer.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum BufferData {
    /// An `array<f32>` (per-head slopes, a bias table).
    F32(Vec<f32>),
    /// An `array<i32>` (document ids).
    I32(Vec<i32>),
}

impl BufferData {
    fn wgsl_type(&self) -> &'static str {
        match self {
            BufferData::F32(_) => "array<f32>",
            BufferData::I32(_) => "array<i32>",
        }
    }

    fn len(&self) -> usize {
        match self {
            BufferData::F32(v) => v.len(),
            BufferData::I32(v) => v.len(),
        }
    }
}

/// A named read-only buffer the modifiers index, e.g. `slope[h]`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ModBuffer {
    /// Its name in WGSL.
    pub name: String,
    /// Its elements.
    pub data: BufferData,
}

/// A piece of WGSL and where it came from (a file name, or what made it), for messages.
#[derive(Debug, Clone, PartialEq)]
struct Source {
    origin: String,
    text: String,
}

/// Which role a source plays, and the function it must define.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Score,
    ScoreGrad,
    Mask,
}

impl Role {
    fn function(self) -> &'static str {
        match self {
            Role::Score => "score_mod",
            Role::ScoreGrad => "score_mod_grad",
            Role::Mask => "mask_mod",
        }
    }

    fn signature(self) -> &'static str {
        match self {
            Role::Score => SCORE_MOD_SIGNATURE,
            Role::ScoreGrad => SCORE_MOD_GRAD_SIGNATURE,
            Role::Mask => MASK_MOD_SIGNATURE,
        }
    }
}

/// The CPU form of a caller's score modifier, or of its derivative:
/// `(score, b, h, q, kv) -> f64`, as [`SCORE_MOD_SIGNATURE`] in f64 with `usize` indices.
pub type ScoreModCpu = dyn Fn(f64, usize, usize, usize, usize) -> f64 + Send + Sync;
/// The CPU form of a caller's mask modifier: `(b, h, q, kv) -> bool` (`true` = attend), as
/// [`MASK_MOD_SIGNATURE`] with `usize` indices.
pub type MaskModCpu = dyn Fn(usize, usize, usize, usize) -> bool + Send + Sync;

/// A closure shared by the clones of its [`Modifiers`]: printed as `<closure>`, equal only to
/// itself (the same `Arc`).
struct Closure<F: ?Sized>(Arc<F>);

impl<F: ?Sized> Clone for Closure<F> {
    fn clone(&self) -> Self {
        Closure(Arc::clone(&self.0))
    }
}

impl<F: ?Sized> std::fmt::Debug for Closure<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<closure>")
    }
}

impl<F: ?Sized> PartialEq for Closure<F> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// What the kernels see of a [`Modifiers`], made once per value ([`Modifiers::kernel_code`]).
#[derive(Debug)]
pub(crate) struct KernelCode {
    /// [`Modifiers::wgsl`] at `@group(1)` from binding 0.
    pub wgsl: String,
    /// [`Modifiers::all_buffers`].
    pub buffers: Vec<ModBuffer>,
    /// A hash of both: where a lookup starts ([`Modifiers::kernel_key`]); equality decides
    /// ([`Modifiers::same_kernels`]).
    hash: u64,
}

impl KernelCode {
    /// Whether both hold the same text and buffers (values compared bit for bit, so a NaN
    /// in a buffer equals itself).
    fn same(&self, other: &KernelCode) -> bool {
        let bits = |d: &BufferData| -> Vec<u32> {
            match d {
                BufferData::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
                BufferData::I32(v) => v.iter().map(|&x| x as u32).collect(),
            }
        };
        let same_buffer = |(a, b): (&ModBuffer, &ModBuffer)| {
            a.name == b.name
                && std::mem::discriminant(&a.data) == std::mem::discriminant(&b.data)
                && bits(&a.data) == bits(&b.data)
        };
        self.hash == other.hash
            && self.wgsl == other.wgsl
            && self.buffers.len() == other.buffers.len()
            && self.buffers.iter().zip(&other.buffers).all(same_buffer)
    }
}

/// A [`Modifiers`]' [`KernelCode`] once made: shared by its clones, no part of its equality
/// (equal sources make equal code) or its `Debug`; every builder that changes what it is
/// made from starts it afresh.
#[derive(Clone, Default)]
struct Built(OnceLock<Arc<KernelCode>>);

impl PartialEq for Built {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for Built {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "made"
        } else {
            "not yet"
        })
    }
}

/// The modifiers of one op: a caller's WGSL (`score_mod`, `mask_mod`, `score_mod_grad`), the
/// buffers it reads, presets, and the CPU form of the caller's WGSL for the reference.
/// Empty by default (plain attention).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Modifiers {
    score_mod: Option<Source>,
    score_mod_grad: Option<Source>,
    mask_mod: Option<Source>,
    score_mod_cpu: Option<Closure<ScoreModCpu>>,
    score_mod_grad_cpu: Option<Closure<ScoreModCpu>>,
    mask_mod_cpu: Option<Closure<MaskModCpu>>,
    buffers: Vec<ModBuffer>,
    presets: Vec<Preset>,
    /// Where a part of a split call starts in the whole call, `(batch, head, query row)`:
    /// what the kernels add to their own indices before calling the modifiers.
    origin: [u32; 3],
    /// The kernels' code, made on first use.
    built: Built,
}

impl Modifiers {
    /// No modifier.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether there is no modifier for the kernels (the CPU forms alone count for nothing).
    pub fn is_empty(&self) -> bool {
        self.score_mod.is_none() && self.mask_mod.is_none() && self.presets.is_empty()
    }

    /// A score modifier ([`SCORE_MOD_SIGNATURE`]), `origin` naming it in messages (its file).
    pub fn score_mod(mut self, origin: impl Into<String>, wgsl: impl Into<String>) -> Self {
        self.score_mod = Some(Source {
            origin: origin.into(),
            text: wgsl.into(),
        });
        self.built = Built::default();
        self
    }

    /// The score modifier's derivative by the score ([`SCORE_MOD_GRAD_SIGNATURE`]): without
    /// it, gradients through a caller's `score_mod` are an `Unsupported` error.
    pub fn score_mod_grad(mut self, origin: impl Into<String>, wgsl: impl Into<String>) -> Self {
        self.score_mod_grad = Some(Source {
            origin: origin.into(),
            text: wgsl.into(),
        });
        self.built = Built::default();
        self
    }

    /// A mask modifier ([`MASK_MOD_SIGNATURE`]).
    pub fn mask_mod(mut self, origin: impl Into<String>, wgsl: impl Into<String>) -> Self {
        self.mask_mod = Some(Source {
            origin: origin.into(),
            text: wgsl.into(),
        });
        self.built = Built::default();
        self
    }

    /// The CPU form of the caller's `score_mod` ([`Modifiers::score_mod`]), for the f64
    /// reference: `f(score, b, h, q, kv)`, what the WGSL computes, in f64. The reference
    /// applies it where the kernels apply the WGSL: to the scaled score (causal having hidden
    /// the future first), before the presets' score modifiers, then the mask's bias, then the
    /// mask modifiers. The indices are the whole call's (`h` the query head; a call split
    /// past the device's limits and a decode step see the same ones). A closure reads its
    /// buffers' data by capturing it; the kernels never see it: neither the generated WGSL nor
    /// what equal modifiers share on a device depends on it. Clones share it; two
    /// [`Modifiers`] are equal only with the same closure.
    ///
    /// ```
    /// use wgpu_attention::modifiers::Modifiers;
    /// let twice = "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {
    ///     return 2.0 * score;
    /// }";
    /// let two = "fn score_mod_grad(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {
    ///     return 2.0;
    /// }";
    /// let mods = Modifiers::new()
    ///     .score_mod("twice.wgsl", twice)
    ///     .score_mod_cpu(|score, _b, _h, _q, _kv| 2.0 * score)
    ///     .score_mod_grad("two.wgsl", two)
    ///     .score_mod_grad_cpu(|_score, _b, _h, _q, _kv| 2.0);
    /// assert!(format!("{mods:?}").contains("score_mod_cpu: Some(<closure>)"));
    /// assert_eq!(mods.clone(), mods);
    /// ```
    pub fn score_mod_cpu(
        mut self,
        f: impl Fn(f64, usize, usize, usize, usize) -> f64 + Send + Sync + 'static,
    ) -> Self {
        self.score_mod_cpu = Some(Closure(Arc::new(f)));
        self
    }

    /// The CPU form of the caller's `score_mod_grad` ([`Modifiers::score_mod_grad`]):
    /// `f(score, b, h, q, kv)`, the derivative of [`Modifiers::score_mod_cpu`] by the score
    /// at the score it was given. The reference backward multiplies by it first in the chain
    /// through the score modifiers; without it, its gradients through a caller's
    /// `score_mod` are an `Unsupported` error (as [`Modifiers::check_differentiable`]).
    pub fn score_mod_grad_cpu(
        mut self,
        f: impl Fn(f64, usize, usize, usize, usize) -> f64 + Send + Sync + 'static,
    ) -> Self {
        self.score_mod_grad_cpu = Some(Closure(Arc::new(f)));
        self
    }

    /// The CPU form of the caller's `mask_mod` ([`Modifiers::mask_mod`]): `f(b, h, q, kv)`,
    /// `true` = attend, and-ed with the mask presets after the bias, at the whole call's
    /// indices (as [`Modifiers::score_mod_cpu`]).
    pub fn mask_mod_cpu(
        mut self,
        f: impl Fn(usize, usize, usize, usize) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.mask_mod_cpu = Some(Closure(Arc::new(f)));
        self
    }

    /// A read-only buffer the caller's modifiers index by `name`.
    pub fn buffer(mut self, name: impl Into<String>, data: BufferData) -> Self {
        self.buffers.push(ModBuffer {
            name: name.into(),
            data,
        });
        self.built = Built::default();
        self
    }

    /// Adds a preset (applied after the caller's own modifier, in the order added).
    pub fn preset(mut self, preset: Preset) -> Self {
        self.presets.push(preset);
        self.built = Built::default();
        self
    }

    /// The presets, in order.
    pub fn presets(&self) -> &[Preset] {
        &self.presets
    }

    /// Whether a caller's own score modifier (its WGSL) is present.
    pub fn has_own_score_mod(&self) -> bool {
        self.score_mod.is_some()
    }

    /// Whether a caller's own mask modifier (its WGSL) is present.
    pub fn has_own_mask_mod(&self) -> bool {
        self.mask_mod.is_some()
    }

    /// The CPU form of the caller's `score_mod`, if given.
    pub(crate) fn score_mod_cpu_fn(&self) -> Option<&ScoreModCpu> {
        self.score_mod_cpu.as_ref().map(|c| &*c.0)
    }

    /// The CPU form of the caller's `score_mod_grad`, if given.
    pub(crate) fn score_mod_grad_cpu_fn(&self) -> Option<&ScoreModCpu> {
        self.score_mod_grad_cpu.as_ref().map(|c| &*c.0)
    }

    /// The CPU form of the caller's `mask_mod`, if given.
    pub(crate) fn mask_mod_cpu_fn(&self) -> Option<&MaskModCpu> {
        self.mask_mod_cpu.as_ref().map(|c| &*c.0)
    }

    /// What the kernels see of these modifiers (the generated code, every buffer), made on
    /// first use and kept: a call that reuses its modifiers does not generate them again.
    pub(crate) fn kernel_code(&self) -> &Arc<KernelCode> {
        self.built.0.get_or_init(|| {
            use std::hash::{Hash, Hasher};
            let (wgsl, buffers) = (self.wgsl(1, 0), self.all_buffers());
            let mut h = std::collections::hash_map::DefaultHasher::new();
            wgsl.hash(&mut h);
            for b in &buffers {
                b.name.hash(&mut h);
                match &b.data {
                    BufferData::F32(v) => v.iter().for_each(|x| x.to_bits().hash(&mut h)),
                    BufferData::I32(v) => v.hash(&mut h),
                }
            }
            Arc::new(KernelCode {
                wgsl,
                buffers,
                hash: h.finish(),
            })
        })
    }

    /// Where to look for what equal modifiers share on a device (their upload and block
    /// maps): a hash of [`Modifiers::kernel_code`] and the origin. Only a start: modifiers
    /// share an upload when [`Modifiers::same_kernels`] says so.
    pub(crate) fn kernel_key(&self) -> u64 {
        let [b, h, q] = self.origin.map(u64::from);
        self.kernel_code().hash ^ (b << 42 | h << 21 | q).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    /// Whether the kernels see the same of both: the same generated code, buffers (bit for
    /// bit) and origin; the CPU forms play no part.
    pub(crate) fn same_kernels(&self, other: &Modifiers) -> bool {
        let (a, b) = (self.kernel_code(), other.kernel_code());
        self.origin == other.origin && (Arc::ptr_eq(a, b) || a.same(b))
    }

    /// These modifiers for a part of a call that starts at `(batch, head, query row)` =
    /// `at` within the part this one is for (see [`Modifiers::origin`]).
    pub(crate) fn shifted(&self, at: [usize; 3]) -> Self {
        let mut out = self.clone();
        for (o, a) in out.origin.iter_mut().zip(at) {
            *o += a as u32;
        }
        out
    }

    /// Where the part of a split call these modifiers are for starts in the whole call,
    /// `(batch, head, query row)`; zeros for a whole call.
    pub(crate) fn origin(&self) -> [u32; 3] {
        self.origin
    }

    /// The presets' functions, and their data packed into one buffer (each preset's from
    /// the offset its function reads at).
    fn preset_code(&self) -> (Vec<String>, Vec<i32>) {
        let (mut code, mut packed) = (Vec::new(), Vec::new());
        for (i, p) in self.presets.iter().enumerate() {
            let (text, data) = p.wgsl(&preset_name(i), packed.len() as u32);
            code.push(text);
            packed.extend(data);
        }
        (code, packed)
    }

    /// Every buffer the generated code reads: the caller's, then the presets' data packed
    /// into one, `wa_presets`, when they have any.
    pub(crate) fn all_buffers(&self) -> Vec<ModBuffer> {
        let mut out = self.buffers.clone();
        let (_, packed) = self.preset_code();
        if !packed.is_empty() {
            out.push(ModBuffer {
                name: "wa_presets".into(),
                data: BufferData::I32(packed),
            });
        }
        out
    }

    /// The WGSL the kernels include: the buffers as `var<storage, read>` at `@group(group)`,
    /// bindings from `first_binding` on, the caller's sources, the presets, and the
    /// functions the kernels call, `wa_score`, `wa_mask` and (when
    /// [`Modifiers::check_differentiable`] passes) `wa_score_grad`.
    pub fn wgsl(&self, group: u32, first_binding: u32) -> String {
        self.assemble(group, first_binding, true).0
    }

    /// [`Modifiers::wgsl`] (without the presets and the generated functions unless
    /// `generated`) and, per caller source, its origin and first line there.
    fn assemble(
        &self,
        group: u32,
        first_binding: u32,
        generated: bool,
    ) -> (String, Vec<(String, u32)>) {
        let mut text = String::new();
        let mut segments = Vec::new();
        for (i, b) in self.all_buffers().iter().enumerate() {
            let _ = writeln!(
                text,
                "@group({group}) @binding({}) var<storage, read> {}: {};",
                first_binding + i as u32,
                b.name,
                b.data.wgsl_type()
            );
        }
        for s in [&self.score_mod, &self.score_mod_grad, &self.mask_mod]
            .into_iter()
            .flatten()
        {
            segments.push((s.origin.clone(), text.lines().count() as u32 + 1));
            text.push_str(&s.text);
            if !s.text.ends_with('\n') {
                text.push('\n');
            }
        }
        if !generated {
            return (text, segments);
        }
        let mut scores = Vec::new();
        let mut masks = Vec::new();
        if self.score_mod.is_some() {
            scores.push("score_mod".to_string());
        }
        if self.mask_mod.is_some() {
            masks.push("mask_mod".to_string());
        }
        let (preset_code, _) = self.preset_code();
        // The first relative bias: the one whose table's gradient the backward computes.
        let mut table = None;
        for ((i, p), code) in self.presets.iter().enumerate().zip(preset_code) {
            let name = preset_name(i);
            text.push_str(&code);
            if let Some(grad) = p.wgsl_grad(&name) {
                text.push_str(&grad);
            }
            if table.is_none() && matches!(p, Preset::RelativeBias { .. }) {
                table = Some(name.clone());
            }
            match p.role() {
                Role::Mask => masks.push(name),
                _ => scores.push(name),
            }
        }
        text.push_str("fn wa_score(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n");
        text.push_str("    var s = score;\n");
        for f in &scores {
            let _ = writeln!(text, "    s = {f}(s, b, h, q, kv);");
        }
        text.push_str("    return s;\n}\n");
        // The chain rule through the score modifiers: each one's derivative at its input.
        // Only when every one has a derivative (a caller's score_mod without score_mod_grad
        // has none: check_differentiable refuses its backward, which alone calls this).
        if self.check_differentiable().is_ok() {
            text.push_str(
                "fn wa_score_grad(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n",
            );
            text.push_str("    var s = score;\n    var g = 1.0;\n");
            for f in &scores {
                let grad = if f == "score_mod" {
                    "score_mod_grad".to_string()
                } else {
                    format!("{f}_grad")
                };
                let _ = writeln!(text, "    g *= {grad}(s, b, h, q, kv);");
                let _ = writeln!(text, "    s = {f}(s, b, h, q, kv);");
            }
            text.push_str("    return g;\n}\n");
            // The same chain from a relative bias's output on (its table's gradient is the
            // incoming gradient there): the derivatives of the score modifiers after it.
            text.push_str(
                "fn wa_table_grad(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n",
            );
            text.push_str("    var s = score;\n    var g = 1.0;\n");
            let mut after = false;
            for f in &scores {
                if after {
                    let _ = writeln!(text, "    g *= {f}_grad(s, b, h, q, kv);");
                }
                let _ = writeln!(text, "    s = {f}(s, b, h, q, kv);");
                after |= table.as_deref() == Some(f.as_str());
            }
            text.push_str("    return g;\n}\n");
        }
        text.push_str("fn wa_mask(b: u32, h: u32, q: u32, kv: u32) -> bool {\n");
        let cond = if masks.is_empty() {
            "true".to_string()
        } else {
            masks
                .iter()
                .map(|f| format!("{f}(b, h, q, kv)"))
                .collect::<Vec<_>>()
                .join(" && ")
        };
        let _ = writeln!(text, "    return {cond};\n}}");
        (text, segments)
    }
}

fn preset_name(i: usize) -> String {
    format!("wa_p{i}")
}
