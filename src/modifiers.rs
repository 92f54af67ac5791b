//! Score and mask modifiers (issue 24, programmable attention): a caller's WGSL functions
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
//! The kernels call two generated functions, `wa_score(score, b, h, q, kv) -> f32` (every
//! score modifier in order, the caller's first) and `wa_mask(b, h, q, kv) -> bool` (every
//! mask modifier, and-ed), from [`Modifiers::wgsl`].

use std::fmt::Write as _;

use crate::error::{Error, Result};

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

/// A preset, generated as WGSL under its own `wa_` function name.
#[derive(Debug, Clone, PartialEq)]
pub enum Preset {
    /// Query `i` sees key `j` when `i − left ≤ j ≤ i + right` (top-left aligned).
    Window {
        /// Keys before the query it sees.
        left: u32,
        /// Keys after the query it sees.
        right: u32,
    },
    /// `score ← cap · tanh(score / cap)` on the scaled score (Gemma 2).
    Softcap(f32),
    /// `score ← score + slope_h · (j − i)`, one slope per query head (BLOOM, MPT).
    Alibi(Vec<f32>),
    /// A query sees only keys of its own document: one id per position, `(batch, n)` row-major.
    Documents {
        /// The ids, `batch · n` of them.
        ids: Vec<i32>,
        /// Positions per sequence.
        n: u32,
    },
    /// The first `p` positions attend bidirectionally among themselves, the rest causally.
    PrefixLm(u32),
}

impl Preset {
    /// ALiBi's standard geometric slopes for `heads` heads (Press et al.; for a head count
    /// that is not a power of two, the next power's odd-indexed slopes fill the rest).
    pub fn alibi_slopes(heads: usize) -> Vec<f32> {
        fn powers(n: usize) -> Vec<f64> {
            let start = 2f64.powf(-8.0 / n as f64);
            (1..=n).map(|i| start.powi(i as i32)).collect()
        }
        let p = heads.next_power_of_two();
        if p == heads {
            return powers(heads).into_iter().map(|s| s as f32).collect();
        }
        let lower = p / 2;
        let mut out = powers(lower);
        out.extend(powers(2 * lower).into_iter().step_by(2).take(heads - lower));
        out.into_iter().map(|s| s as f32).collect()
    }

    fn role(&self) -> Role {
        match self {
            Preset::Softcap(_) | Preset::Alibi(_) => Role::Score,
            _ => Role::Mask,
        }
    }

    /// Its function (named `name`) and the buffer it reads, if any.
    fn wgsl(&self, name: &str) -> (String, Option<ModBuffer>) {
        match self {
            Preset::Window { left, right } => (
                format!(
                    "fn {name}(b: u32, h: u32, q: u32, kv: u32) -> bool {{\n    \
                     let d = i32(kv) - i32(q);\n    return d >= -{left}i && d <= {right}i;\n}}\n"
                ),
                None,
            ),
            Preset::Softcap(cap) => (
                format!(
                    "fn {name}(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {{\n    \
                     return {cap:?} * tanh(score / {cap:?});\n}}\n"
                ),
                None,
            ),
            Preset::Alibi(slopes) => {
                let buf = format!("{name}_slopes");
                (
                    format!(
                        "fn {name}(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {{\n    \
                         return score + {buf}[h] * (f32(kv) - f32(q));\n}}\n"
                    ),
                    Some(ModBuffer {
                        name: buf,
                        data: BufferData::F32(slopes.clone()),
                    }),
                )
            }
            Preset::Documents { ids, n } => {
                let buf = format!("{name}_ids");
                (
                    format!(
                        "fn {name}(b: u32, h: u32, q: u32, kv: u32) -> bool {{\n    \
                         return {buf}[b * {n}u + q] == {buf}[b * {n}u + kv];\n}}\n"
                    ),
                    Some(ModBuffer {
                        name: buf,
                        data: BufferData::I32(ids.clone()),
                    }),
                )
            }
            Preset::PrefixLm(p) => (
                format!(
                    "fn {name}(b: u32, h: u32, q: u32, kv: u32) -> bool {{\n    \
                     return kv < {p}u || kv <= q;\n}}\n"
                ),
                None,
            ),
        }
    }

    /// The same modifier in f64 on the CPU, for the reference: `Some(score)` or `None`
    /// (masked out) from the scaled score `s` at `(b, h, q, kv)`.
    pub fn apply(&self, s: f64, b: usize, h: usize, q: usize, kv: usize) -> Option<f64> {
        match self {
            Preset::Window { left, right } => {
                let d = kv as i64 - q as i64;
                (d >= -(*left as i64) && d <= *right as i64).then_some(s)
            }
            Preset::Softcap(cap) => {
                let c = *cap as f64;
                Some(c * (s / c).tanh())
            }
            Preset::Alibi(slopes) => Some(s + slopes[h] as f64 * (kv as f64 - q as f64)),
            Preset::Documents { ids, n } => {
                let n = *n as usize;
                (ids[b * n + q] == ids[b * n + kv]).then_some(s)
            }
            Preset::PrefixLm(p) => (kv < *p as usize || kv <= q).then_some(s),
        }
    }
}

/// The modifiers of one op: a caller's WGSL (`score_mod`, `mask_mod`, `score_mod_grad`), the
/// buffers it reads, and presets. Empty by default (plain attention).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Modifiers {
    score_mod: Option<Source>,
    score_mod_grad: Option<Source>,
    mask_mod: Option<Source>,
    buffers: Vec<ModBuffer>,
    presets: Vec<Preset>,
}

impl Modifiers {
    /// No modifier.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether there is no modifier at all.
    pub fn is_empty(&self) -> bool {
        self.score_mod.is_none() && self.mask_mod.is_none() && self.presets.is_empty()
    }

    /// A score modifier ([`SCORE_MOD_SIGNATURE`]), `origin` naming it in messages (its file).
    pub fn score_mod(mut self, origin: impl Into<String>, wgsl: impl Into<String>) -> Self {
        self.score_mod = Some(Source {
            origin: origin.into(),
            text: wgsl.into(),
        });
        self
    }

    /// The score modifier's derivative by the score ([`SCORE_MOD_GRAD_SIGNATURE`]): without
    /// it, gradients through a caller's `score_mod` are an `Unsupported` error.
    pub fn score_mod_grad(mut self, origin: impl Into<String>, wgsl: impl Into<String>) -> Self {
        self.score_mod_grad = Some(Source {
            origin: origin.into(),
            text: wgsl.into(),
        });
        self
    }

    /// A mask modifier ([`MASK_MOD_SIGNATURE`]).
    pub fn mask_mod(mut self, origin: impl Into<String>, wgsl: impl Into<String>) -> Self {
        self.mask_mod = Some(Source {
            origin: origin.into(),
            text: wgsl.into(),
        });
        self
    }

    /// A read-only buffer the caller's modifiers index by `name`.
    pub fn buffer(mut self, name: impl Into<String>, data: BufferData) -> Self {
        self.buffers.push(ModBuffer {
            name: name.into(),
            data,
        });
        self
    }

    /// Adds a preset (applied after the caller's own modifier, in the order added).
    pub fn preset(mut self, preset: Preset) -> Self {
        self.presets.push(preset);
        self
    }

    /// The presets, in order.
    pub fn presets(&self) -> &[Preset] {
        &self.presets
    }

    /// Whether a caller's own (WGSL-only) score modifier is present.
    pub fn has_own_score_mod(&self) -> bool {
        self.score_mod.is_some()
    }

    /// Whether a caller's own (WGSL-only) mask modifier is present.
    pub fn has_own_mask_mod(&self) -> bool {
        self.mask_mod.is_some()
    }

    /// Whether gradients can flow through the score modifiers: every preset has one, a
    /// caller's `score_mod` only with its `score_mod_grad`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming what is missing.
    pub fn check_differentiable(&self) -> Result<()> {
        if self.score_mod.is_some() && self.score_mod_grad.is_none() {
            return Err(Error::Unsupported {
                feature: "gradients through a caller's score_mod without its score_mod_grad".into(),
                adapter: "any".into(),
                hint: format!(
                    "give its derivative by the score as well: {SCORE_MOD_GRAD_SIGNATURE}"
                ),
            });
        }
        Ok(())
    }

    /// Checks the presets against the problem `(batch, heads, n_q, n_kv)`: one ALiBi slope
    /// per query head, document ids for every position a query or key has.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] naming the preset and what it needed.
    pub fn check_problem(&self, [batch, heads, n_q, n_kv]: [usize; 4]) -> Result<()> {
        for p in &self.presets {
            match p {
                Preset::Alibi(slopes) if slopes.len() != heads => {
                    return Err(Error::shape(format!(
                        "ALiBi has {} slopes, one per query head is {heads}",
                        slopes.len()
                    )))
                }
                Preset::Documents { ids, n } => {
                    let n = *n as usize;
                    if ids.len() != batch * n || n < n_q.max(n_kv) {
                        return Err(Error::shape(format!(
                            "document ids of {} values in rows of {n}: (batch, n) = ({batch}, \
                             at least {}) is needed",
                            ids.len(),
                            n_q.max(n_kv)
                        )));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Every buffer the generated code reads: the caller's, then the presets'.
    pub(crate) fn all_buffers(&self) -> Vec<ModBuffer> {
        let mut out = self.buffers.clone();
        for (i, p) in self.presets.iter().enumerate() {
            if let (_, Some(b)) = p.wgsl(&preset_name(i)) {
                out.push(b);
            }
        }
        out
    }

    /// The WGSL the kernels include: the buffers as `var<storage, read>` at `@group(group)`,
    /// bindings from `first_binding` on, the caller's sources, the presets, and the two
    /// functions the kernels call, `wa_score` and `wa_mask`.
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
        for (i, p) in self.presets.iter().enumerate() {
            let name = preset_name(i);
            text.push_str(&p.wgsl(&name).0);
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

    /// Checks the caller's WGSL before any pipeline is made: it parses and validates, defines
    /// each function it was given for with the expected signature, declares no global
    /// (bindings, workgroup or private memory), no entry point, uses no atomic, barrier or
    /// subgroup operation, and names nothing `wa_…`; buffer names are identifiers, unique,
    /// non-empty.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`], one line naming the source (file), line and column.
    pub fn check(&self) -> Result<()> {
        let mut seen = std::collections::HashSet::new();
        for b in &self.buffers {
            let ok = b
                .name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && b.name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ok || b.name.starts_with(RESERVED_PREFIX) {
                return Err(invalid(format!(
                    "modifier buffer name {:?} is not an identifier of letters, digits and _ \
                     (not starting with {RESERVED_PREFIX})",
                    b.name
                )));
            }
            if !seen.insert(b.name.clone()) {
                return Err(invalid(format!("modifier buffer {:?} given twice", b.name)));
            }
            if b.data.len() == 0 {
                return Err(invalid(format!("modifier buffer {:?} is empty", b.name)));
            }
        }
        // The caller's code alone first (with the buffers it reads), so each message points
        // into it; then everything the kernels include, which must check too.
        let (text, segments) = self.assemble(0, 0, false);
        let module = parse_and_validate(&text, &segments)?;
        let ours = self.all_buffers().len();
        if let Some((_, g)) = module.global_variables.iter().nth(ours) {
            return Err(invalid(format!(
                "a modifier may not declare `var {}` (a binding, workgroup or private memory); \
                 pass data as a modifier buffer",
                g.name.as_deref().unwrap_or("?")
            )));
        }
        if let Some(ep) = module.entry_points.first() {
            return Err(invalid(format!(
                "a modifier may not declare an entry point (`{}`)",
                ep.name
            )));
        }
        for (_, f) in module.functions.iter() {
            let name = f.name.as_deref().unwrap_or("?");
            if name.starts_with(RESERVED_PREFIX) {
                return Err(invalid(format!(
                    "modifier function `{name}`: names starting with {RESERVED_PREFIX} are reserved"
                )));
            }
            if let Some(what) = forbidden(&f.body) {
                return Err(invalid(format!(
                    "modifier function `{name}` uses {what}, which a modifier may not"
                )));
            }
        }
        for (role, given) in [
            (Role::Score, self.score_mod.is_some()),
            (Role::ScoreGrad, self.score_mod_grad.is_some()),
            (Role::Mask, self.mask_mod.is_some()),
        ] {
            if given {
                check_signature(&module, role)?;
            }
        }
        let (all, _) = self.assemble(0, 0, true);
        parse_and_validate(&all, &[("generated modifier code".into(), 1)])?;
        Ok(())
    }
}

/// `text` parsed and validated by naga; an error names the source (of `segments`: origin,
/// first line) and the line and column in it.
fn parse_and_validate(text: &str, segments: &[(String, u32)]) -> Result<naga::Module> {
    let locate = |loc: Option<naga::SourceLocation>| -> String {
        let Some(loc) = loc else {
            return "modifier".into();
        };
        let (origin, first) = segments
            .iter()
            .rev()
            .find(|(_, first)| *first <= loc.line_number)
            .map(|(o, f)| (o.as_str(), *f))
            .unwrap_or(("modifier buffers", 1));
        format!(
            "{origin}:{}:{}",
            loc.line_number - first + 1,
            loc.line_position
        )
    };
    let module = naga::front::wgsl::parse_str(text)
        .map_err(|e| invalid(format!("{}: {}", locate(e.location(text)), e.message())))?;
    let mut validator = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    );
    validator.validate(&module).map_err(|e| {
        // The innermost span is the most precise; the message chain says what and where.
        let loc = e.spans().last().map(|(span, _)| span.location(text));
        let mut msg = e.as_inner().to_string();
        let mut cause = std::error::Error::source(e.as_inner());
        while let Some(c) = cause {
            msg.push_str(": ");
            msg.push_str(&c.to_string());
            cause = c.source();
        }
        invalid(format!("{}: {}", locate(loc), one_line(&msg)))
    })?;
    Ok(module)
}

fn preset_name(i: usize) -> String {
    format!("wa_p{i}")
}

fn invalid(msg: String) -> Error {
    Error::invalid("modifier", msg)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The first statement a modifier may not use, described.
fn forbidden(block: &naga::Block) -> Option<&'static str> {
    use naga::Statement as S;
    for st in block.iter() {
        let found = match st {
            S::ControlBarrier(_) | S::MemoryBarrier(_) => Some("a barrier"),
            S::WorkGroupUniformLoad { .. } => Some("workgroupUniformLoad (a barrier)"),
            S::Atomic { .. } | S::ImageAtomic { .. } => Some("an atomic operation"),
            S::SubgroupBallot { .. }
            | S::SubgroupGather { .. }
            | S::SubgroupCollectiveOperation { .. } => Some("a subgroup operation"),
            S::Store { .. } | S::ImageStore { .. } => None,
            S::Block(b) => forbidden(b),
            S::If { accept, reject, .. } => forbidden(accept).or_else(|| forbidden(reject)),
            S::Switch { cases, .. } => cases.iter().find_map(|c| forbidden(&c.body)),
            S::Loop {
                body, continuing, ..
            } => forbidden(body).or_else(|| forbidden(continuing)),
            _ => None,
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

/// `Err` unless `module` defines `role`'s function with its signature.
fn check_signature(module: &naga::Module, role: Role) -> Result<()> {
    use naga::{Scalar, TypeInner};
    let name = role.function();
    let Some((_, f)) = module
        .functions
        .iter()
        .find(|(_, f)| f.name.as_deref() == Some(name))
    else {
        return Err(invalid(format!(
            "the {name} source defines no `{name}`; expected `{}`",
            role.signature()
        )));
    };
    let scalar = |ty: naga::Handle<naga::Type>| match module.types[ty].inner {
        TypeInner::Scalar(s) => Some(s),
        _ => None,
    };
    let args: Vec<_> = f.arguments.iter().map(|a| scalar(a.ty)).collect();
    let want_args: &[Scalar] = match role {
        Role::Mask => &[Scalar::U32; 4],
        _ => &[
            Scalar::F32,
            Scalar::U32,
            Scalar::U32,
            Scalar::U32,
            Scalar::U32,
        ],
    };
    let want_result = match role {
        Role::Mask => Scalar::BOOL,
        _ => Scalar::F32,
    };
    let result = f.result.as_ref().and_then(|r| scalar(r.ty));
    let args_ok = args.len() == want_args.len()
        && args
            .iter()
            .zip(want_args)
            .all(|(a, w)| a.as_ref() == Some(w));
    if !args_ok || result != Some(want_result) {
        return Err(invalid(format!(
            "`{name}` has the wrong signature; expected `{}`",
            role.signature()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(m: &Modifiers) -> String {
        m.check().unwrap_err().to_string()
    }

    #[test]
    fn a_good_modifier_with_a_buffer_and_presets_checks() {
        let m = Modifiers::new()
            .score_mod(
                "slope.wgsl",
                "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    \
                 return score + slope[h] * f32(kv);\n}\n",
            )
            .mask_mod(
                "docs.wgsl",
                "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool { return kv <= q + 3u; }",
            )
            .buffer("slope", BufferData::F32(vec![0.5, 0.25]))
            .preset(Preset::Window { left: 3, right: 0 })
            .preset(Preset::Softcap(30.0))
            .preset(Preset::Alibi(Preset::alibi_slopes(2)))
            .preset(Preset::Documents {
                ids: vec![0, 0, 1, 1],
                n: 4,
            })
            .preset(Preset::PrefixLm(2));
        m.check().unwrap();
        let wgsl = m.wgsl(1, 7);
        assert!(wgsl.contains("@group(1) @binding(7) var<storage, read> slope: array<f32>;"));
        assert!(wgsl.contains("fn wa_score(") && wgsl.contains("fn wa_mask("));
        assert_eq!(m.all_buffers().len(), 3);
    }

    #[test]
    fn a_syntax_error_names_the_callers_file_line_and_column() {
        let m = Modifiers::new()
            .buffer("slope", BufferData::F32(vec![1.0]))
            .score_mod(
                "mine.wgsl",
                "// a comment\nfn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    \
                 return score +;\n}\n",
            );
        let e = err(&m);
        assert!(e.contains("mine.wgsl:3:"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn a_type_error_is_located_too() {
        // naga locates a validation error at the expression's span (here the argument `q`
        // the return reads) and says what is wrong.
        let m = Modifiers::new().mask_mod(
            "m.wgsl",
            "\nfn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {\n    return q;\n}\n",
        );
        let e = err(&m);
        assert!(e.contains("m.wgsl:2:"), "{e}");
        assert!(e.contains("does not match the declared return type"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn bindings_workgroup_memory_barriers_and_atomics_are_refused() {
        let sig = "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool";
        for (src, what) in [
            (
                format!("@group(0) @binding(0) var<storage, read> x: array<f32>;\n{sig} {{ return x[0] > 0.0; }}"),
                "may not declare `var x`",
            ),
            (
                format!("var<workgroup> w: array<f32, 4>;\n{sig} {{ return w[0] > 0.0; }}"),
                "may not declare `var w`",
            ),
            (
                format!("var<private> p: f32;\n{sig} {{ return p > 0.0; }}"),
                "may not declare `var p`",
            ),
            (
                format!("{sig} {{ workgroupBarrier(); return true; }}"),
                "a barrier",
            ),
            (
                format!("{sig} {{ storageBarrier(); return true; }}"),
                "a barrier",
            ),
        ] {
            let e = err(&Modifiers::new().mask_mod("m.wgsl", src.clone()));
            assert!(e.contains(what), "{src}\n→ {e}");
        }
    }

    #[test]
    fn a_wrong_signature_is_refused_with_the_expected_one() {
        for src in [
            "fn mask_mod(b: u32, h: u32, q: u32) -> bool { return true; }",
            "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> f32 { return 1.0; }",
            "fn mask_mod(b: i32, h: u32, q: u32, kv: u32) -> bool { return true; }",
            "fn other(b: u32) -> bool { return true; }",
        ] {
            let e = err(&Modifiers::new().mask_mod("m.wgsl", src));
            assert!(e.contains(MASK_MOD_SIGNATURE), "{src}\n→ {e}");
        }
        let e = err(&Modifiers::new().score_mod(
            "s.wgsl",
            "fn score_mod(score: f32, b: u32, h: u32, q: u32) -> f32 { return score; }",
        ));
        assert!(e.contains(SCORE_MOD_SIGNATURE), "{e}");
    }

    #[test]
    fn buffer_names_must_be_identifiers_and_unique() {
        let good = "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool { return true; }";
        for (m, what) in [
            (
                Modifiers::new().buffer("1x", BufferData::F32(vec![1.0])),
                "identifier",
            ),
            (
                Modifiers::new().buffer("wa_x", BufferData::F32(vec![1.0])),
                "identifier",
            ),
            (
                Modifiers::new()
                    .buffer("a", BufferData::F32(vec![1.0]))
                    .buffer("a", BufferData::I32(vec![1])),
                "twice",
            ),
            (
                Modifiers::new().buffer("a", BufferData::F32(vec![])),
                "empty",
            ),
        ] {
            let e = err(&m.mask_mod("m.wgsl", good));
            assert!(e.contains(what), "{e}");
        }
    }

    #[test]
    fn a_callers_score_mod_needs_its_derivative_for_gradients() {
        let s = "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 { return 2.0 * score; }";
        let m = Modifiers::new().score_mod("s.wgsl", s);
        assert!(matches!(
            m.check_differentiable(),
            Err(Error::Unsupported { .. })
        ));
        let g =
            "fn score_mod_grad(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 { return 2.0; }";
        let m = m.score_mod_grad("g.wgsl", g);
        m.check().unwrap();
        m.check_differentiable().unwrap();
        Modifiers::new()
            .preset(Preset::Softcap(5.0))
            .check_differentiable()
            .unwrap();
    }

    #[test]
    fn presets_on_the_cpu_do_what_their_wgsl_says() {
        let w = Preset::Window { left: 2, right: 1 };
        assert_eq!(w.apply(1.0, 0, 0, 5, 3), Some(1.0));
        assert_eq!(w.apply(1.0, 0, 0, 5, 2), None);
        assert_eq!(w.apply(1.0, 0, 0, 5, 6), Some(1.0));
        assert_eq!(w.apply(1.0, 0, 0, 5, 7), None);
        let c = Preset::Softcap(2.0).apply(100.0, 0, 0, 0, 0).unwrap();
        assert!((c - 2.0).abs() < 1e-9);
        let d = Preset::Documents {
            ids: vec![0, 0, 1, 1, 5, 5, 5, 6],
            n: 4,
        };
        assert_eq!(d.apply(1.0, 0, 0, 1, 0), Some(1.0));
        assert_eq!(d.apply(1.0, 0, 0, 2, 1), None);
        assert_eq!(d.apply(1.0, 1, 0, 3, 2), None);
        let p = Preset::PrefixLm(3);
        assert_eq!(p.apply(1.0, 0, 0, 0, 2), Some(1.0));
        assert_eq!(p.apply(1.0, 0, 0, 4, 5), None);
        assert_eq!(Preset::alibi_slopes(8)[0], 0.5);
        assert_eq!(Preset::alibi_slopes(8)[7], 1.0 / 256.0);
        assert_eq!(Preset::alibi_slopes(12).len(), 12);
    }
}
