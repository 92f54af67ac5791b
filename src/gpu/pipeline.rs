//! Compiled compute pipelines, created on first use and cached per [`Context`] under a
//! typed [`PipelineKey`]: the kernel and the compile-time constants it was built with.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::context::Context;
use crate::error::Result;

/// Every kernel the crate has: one WGSL file under `shaders/` each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelId {
    /// `shaders/matmul.wgsl`: batched strided matmul with optional bias.
    Matmul,
    /// `shaders/softmax.wgsl`: row-wise scaled softmax with causal mask.
    Softmax,
    /// `shaders/weighted_sum.wgsl`: attention weights times values.
    WeightedSum,
    /// `shaders/flash_tiled.wgsl`: fused attention from storage buffers, workgroup tiles.
    FlashTiled,
    /// `shaders/flash_subgroup.wgsl`: fused attention from textures, subgroup shuffles.
    FlashSubgroup,
    /// `shaders/matmul_subgroup.wgsl`: batched matmul from textures, subgroup shuffles,
    /// with bias or softmax epilogue.
    MatmulSubgroup,
    /// `shaders/row_stats.wgsl`: per-tile softmax statistics into each row's max and sum.
    RowStats,
    /// `shaders/fma_peak.wgsl`: the arithmetic ceiling, for `bench`.
    FmaPeak,
    /// `shaders/pack.wgsl`: per-head rows of a storage buffer into an `rgba32float` texture.
    Pack,
}

impl KernelId {
    /// All kernels, for tests that validate every shader.
    pub const ALL: [KernelId; 9] = [
        KernelId::Matmul,
        KernelId::Softmax,
        KernelId::WeightedSum,
        KernelId::FlashTiled,
        KernelId::FlashSubgroup,
        KernelId::MatmulSubgroup,
        KernelId::RowStats,
        KernelId::FmaPeak,
        KernelId::Pack,
    ];

    /// The WGSL file name (also the pipeline's label).
    pub fn file_name(self) -> &'static str {
        match self {
            KernelId::Matmul => "matmul.wgsl",
            KernelId::Softmax => "softmax.wgsl",
            KernelId::WeightedSum => "weighted_sum.wgsl",
            KernelId::FlashTiled => "flash_tiled.wgsl",
            KernelId::FlashSubgroup => "flash_subgroup.wgsl",
            KernelId::MatmulSubgroup => "matmul_subgroup.wgsl",
            KernelId::RowStats => "row_stats.wgsl",
            KernelId::FmaPeak => "fma_peak.wgsl",
            KernelId::Pack => "pack.wgsl",
        }
    }

    /// The WGSL source as stored, without the constants the host prepends.
    pub fn source(self) -> &'static str {
        match self {
            KernelId::Matmul => include_str!("../../shaders/matmul.wgsl"),
            KernelId::Softmax => include_str!("../../shaders/softmax.wgsl"),
            KernelId::WeightedSum => include_str!("../../shaders/weighted_sum.wgsl"),
            KernelId::FlashTiled => include_str!("../../shaders/flash_tiled.wgsl"),
            KernelId::FlashSubgroup => include_str!("../../shaders/flash_subgroup.wgsl"),
            KernelId::MatmulSubgroup => include_str!("../../shaders/matmul_subgroup.wgsl"),
            KernelId::RowStats => include_str!("../../shaders/row_stats.wgsl"),
            KernelId::FmaPeak => include_str!("../../shaders/fma_peak.wgsl"),
            KernelId::Pack => include_str!("../../shaders/pack.wgsl"),
        }
    }

    /// Names of the `u32` constants the host prepends to the source, in [`PipelineKey`]
    /// order. They size private arrays and unroll loops, which WGSL `override`s cannot.
    pub fn constants(self) -> &'static [&'static str] {
        match self {
            KernelId::Softmax => &["MASK"],
            KernelId::FlashTiled => &["BK", "DK4", "DV4", "MASK"],
            KernelId::FlashSubgroup => &["SG", "R", "DK4", "DV4", "MASK", "SKIP_ZERO"],
            KernelId::MatmulSubgroup => &["SG", "T", "MASK"],
            _ => &[],
        }
    }

    /// Names of the element-type aliases the host prepends (`alias A_T = f32;` or `f16`), in
    /// [`PipelineKey::f16`] bit order: which storage buffers may hold f16.
    pub fn element_types(self) -> &'static [&'static str] {
        match self {
            KernelId::Matmul => &["A_T", "B_T", "C_T"],
            KernelId::MatmulSubgroup => &["B_T", "C_T"],
            KernelId::Pack => &["SRC_T"],
            KernelId::FlashTiled => &["Q_T", "KV_T"],
            KernelId::FlashSubgroup => &["Q_T"],
            KernelId::WeightedSum => &["V_T"],
            _ => &[],
        }
    }

    /// Whether the kernel uses subgroup operations (needs `Features::SUBGROUP`).
    pub fn needs_subgroups(self) -> bool {
        matches!(self, KernelId::FlashSubgroup | KernelId::MatmulSubgroup)
    }

    /// The full WGSL text for `consts` (one value per name in [`KernelId::constants`]) and
    /// `f16` (bit `i` set: [`KernelId::element_types`]`[i]` is f16, else f32): the constants
    /// and type aliases prepended (with `enable f16;` when any is f16), and every loop marked
    /// `// unroll` unrolled (see [`unroll`]).
    pub fn source_with(self, consts: &[u32], f16: u8) -> String {
        let named: Vec<(&str, u32)> = self
            .constants()
            .iter()
            .copied()
            .zip(consts.iter().copied())
            .collect();
        let mut text = String::new();
        if f16 != 0 {
            text.push_str("enable f16;\n");
        }
        for (i, name) in self.element_types().iter().enumerate() {
            let ty = if f16 & (1 << i) != 0 { "f16" } else { "f32" };
            text.push_str(&format!("alias {name} = {ty};\n"));
        }
        for (name, value) in &named {
            text.push_str(&format!("const {name}: u32 = {value}u;\n"));
        }
        text.push_str(&unroll(self.source(), &named));
        text
    }

    /// The entry point every kernel uses.
    pub const ENTRY: &'static str = "main";
}

/// The marker that asks for a loop to be unrolled, at the end of its `for` line.
const UNROLL: &str = "// unroll";

/// Unrolls every loop written `for (var i = 0u; i < N; i++) { // unroll` whose bound `N`
/// is a literal (`4u`) or one of `consts`, into `N` copies of its body, each in a block that
/// starts with `const i = <k>u;`.
///
/// Shader compilers that keep private arrays in registers only when every index is constant
/// (llvmpipe's, for one) need this; others see the same program. The source stays valid WGSL
/// with the markers ignored, so tools that never unroll still read it. Markers whose loop does
/// not have that exact form are left alone.
pub fn unroll(source: &str, consts: &[(&str, u32)]) -> String {
    let mut text = source.to_string();
    // The last marker never encloses another one, so expanding from the end handles nesting.
    let mut search_end = text.len();
    while let Some(mark) = text[..search_end].rfind(UNROLL) {
        search_end = mark;
        let line_start = text[..mark].rfind('\n').map_or(0, |i| i + 1);
        let Some((var, count)) = parse_for(&text[line_start..mark], consts) else {
            continue;
        };
        let body_start = mark + UNROLL.len();
        let Some(body_end) = matching_brace(&text[body_start..]).map(|i| body_start + i) else {
            continue;
        };
        let body = &text[body_start..body_end];
        let indent: String = text[line_start..]
            .chars()
            .take_while(|c| *c == ' ')
            .collect();
        let mut out = String::new();
        for k in 0..count {
            out.push_str(&format!(
                "{{\n{indent}    const {var} = {k}u;{body}}}\n{indent}"
            ));
        }
        let out = out.trim_end().to_string();
        text.replace_range(line_start + indent.len()..body_end + 1, &out);
    }
    text
}

/// `(var, count)` from `for (var i = 0u; i < N; i++) {`.
fn parse_for(line: &str, consts: &[(&str, u32)]) -> Option<(String, u32)> {
    let rest = line.trim().strip_prefix("for (var ")?;
    let (var, rest) = rest.split_once(" = 0u; ")?;
    let rest = rest.strip_prefix(var)?.strip_prefix(" < ")?;
    let (bound, rest) = rest.split_once("; ")?;
    if rest.trim() != format!("{var}++) {{") {
        return None;
    }
    let count = match bound.strip_suffix('u').and_then(|b| b.parse().ok()) {
        Some(n) => n,
        None => consts.iter().find(|(name, _)| *name == bound)?.1,
    };
    Some((var.to_string(), count))
}

/// Byte offset of the `}` closing a block whose `{` was just before `text`.
fn matching_brace(text: &str) -> Option<usize> {
    let mut depth = 1usize;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// What a cached pipeline is built from: a kernel and its prepended constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PipelineKey {
    /// The kernel.
    pub kernel: KernelId,
    /// Its constants, in [`KernelId::constants`] order (unused slots 0).
    pub consts: [u32; 6],
    /// Which of its [`KernelId::element_types`] are f16 (bit `i` for type `i`).
    pub f16: u8,
}

impl From<KernelId> for PipelineKey {
    fn from(kernel: KernelId) -> Self {
        PipelineKey {
            kernel,
            consts: [0; 6],
            f16: 0,
        }
    }
}

/// The cache: one pipeline per key, built once per context.
#[derive(Default)]
pub struct PipelineCache {
    pipelines: Mutex<HashMap<PipelineKey, Arc<wgpu::ComputePipeline>>>,
}

impl PipelineCache {
    /// The pipeline for `key`, compiling it on first use (inside the caller's error scope).
    pub fn get(&self, ctx: &Context, key: PipelineKey) -> Result<Arc<wgpu::ComputePipeline>> {
        let mut map = self
            .pipelines
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(p) = map.get(&key) {
            return Ok(Arc::clone(p));
        }
        let id = key.kernel;
        let source = id.source_with(&key.consts[..id.constants().len()], key.f16);
        let module = ctx
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(id.file_name()),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            });
        let pipeline = ctx
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(id.file_name()),
                layout: None,
                module: &module,
                entry_point: Some(KernelId::ENTRY),
                compilation_options: Default::default(),
                cache: None,
            });
        let pipeline = Arc::new(pipeline);
        map.insert(key, Arc::clone(&pipeline));
        Ok(pipeline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unroll_expands_marked_loops_with_nesting() {
        let src = "fn f() {\n    for (var r = 0u; r < R; r++) { // unroll\n        for (var e = 0u; e < 2u; e++) { // unroll\n            x[r][e] = 1.0;\n        }\n    }\n    for (var j = 0u; j < n; j++) { // unroll\n    }\n}\n";
        let out = unroll(src, &[("R", 2)]);
        assert!(
            !out.contains("for (var r") && !out.contains("for (var e"),
            "{out}"
        );
        assert_eq!(out.matches("x[r][e] = 1.0;").count(), 4, "{out}");
        assert_eq!(out.matches("const r = 1u;").count(), 1, "{out}");
        assert_eq!(out.matches("const e = 1u;").count(), 2, "{out}");
        // A bound that is neither a literal nor a known constant stays a loop.
        assert!(out.contains("for (var j = 0u; j < n; j++)"), "{out}");
    }
}
