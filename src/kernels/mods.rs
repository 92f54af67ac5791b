//! Score and mask modifiers in the kernels: a kernel that applies them calls
//! `wa_keep(b, h, q, kv) -> bool` and `wa_score_log2(x, b, h, q, kv) -> f32` (scores in the
//! log2 domain, as the fused kernels and the subgroup matmul's weights epilogues keep them;
//! `wa_score_ln` for natural-log scores, as `softmax.wgsl` keeps them) where it applies
//! causal and the mask (the backward kernels also `wa_score_grad(s, b, h, q, kv) -> f32`, the
//! score modifiers' derivative at the natural-log scaled score `s`, by which dS is
//! multiplied), and `wa_block(b, h, row0, j0) -> u32` per key tile: 0 when the mask
//! modifiers leave the tile empty (the kernel skips it), 1 when they leave all of it visible
//! (no `wa_keep` there), 2 otherwise; and `wa_span(b, h, row0)`, the keys `[lo, hi)` its loop
//! need visit (block sparsity, from a [`BlockMap`]). Without modifiers the host appends
//! identity stubs, so such a kernel's results are bit for bit what they were; with them, the
//! caller's checked code ([`crate::modifiers::Modifiers::wgsl`], its buffers at `@group(1)`,
//! then a uniform with the origin of a split call's part (added to the kernel's batch, head
//! and row indices), then the block map's two bindings when there is a mask modifier), under
//! a pipeline key of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::kernels::block_map::{BlockMap, MapShape};
use crate::modifiers::{BufferData, Modifiers};

/// What a kernel that applies modifiers appends without any.
const STUBS: &str = "fn wa_keep(b: u32, h: u32, q: u32, kv: u32) -> bool {
    return true;
}
fn wa_score_log2(x: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {
    return x;
}
fn wa_score_ln(x: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {
    return x;
}
fn wa_score_grad(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {
    return 1.0;
}
fn wa_table_grad(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {
    return 1.0;
}
fn wa_block(b: u32, h: u32, row0: u32, j0: u32) -> u32 {
    return 2u;
}
fn wa_span(b: u32, h: u32, row0: u32) -> vec2<u32> {
    return vec2<u32>(0u, 0xffffffffu);
}
";

/// With modifiers but no mask modifier: every tile full, every key in the span.
const FULL: &str = "fn wa_block(b: u32, h: u32, row0: u32, j0: u32) -> u32 {
    return 1u;
}
fn wa_span(b: u32, h: u32, row0: u32) -> vec2<u32> {
    return vec2<u32>(0u, 0xffffffffu);
}
";

/// With a mask modifier: the block map's readers (see shaders/block_map.wgsl for its
/// layout and [`BlockMap`] for `wa_map`); where the map is off, every tile is partial.
const MAP_READERS: &str = "fn wa_row_block(b: u32, h: u32, row0: u32) -> u32 {
    return (b * wa_map[0].x + h * wa_map[0].y) * wa_map[0].z + row0 / wa_map[1].x;
}
fn wa_block(b: u32, h: u32, row0: u32, j0: u32) -> u32 {
    if wa_map[1].w == 0u {
        return 2u;
    }
    return wa_blocks[wa_row_block(b, h, row0) * wa_map[0].w + j0 / wa_map[1].y];
}
fn wa_span(b: u32, h: u32, row0: u32) -> vec2<u32> {
    if wa_map[1].w == 0u {
        return vec2<u32>(0u, 0xffffffffu);
    }
    let at = wa_map[1].z + 2u * wa_row_block(b, h, row0);
    return vec2<u32>(wa_blocks[at], wa_blocks[at + 1u]);
}
";

/// The modifiers' code of every call of the process, keyed by its full text: each distinct
/// text gets an id (from 1) that the pipeline key holds, so two texts never share a
/// pipeline, and a pipeline built later from the key finds its text here.
#[derive(Default)]
struct Registry {
    ids: HashMap<Arc<str>, u64>,
    texts: Vec<Arc<str>>,
}

fn registry() -> &'static Mutex<Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// The id of `code` in the registry (registered now if new), never 0.
fn register(code: String) -> u64 {
    let mut r = registry().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&id) = r.ids.get(code.as_str()) {
        return id;
    }
    let text: Arc<str> = Arc::from(code);
    r.texts.push(text.clone());
    let id = r.texts.len() as u64;
    r.ids.insert(text, id);
    id
}

/// A kernel source `composed` (from the file `file`) with what its modifier calls need: the
/// stubs (`mods == 0`) or the code registered under id `mods`. Kernels that call no modifier
/// are left as they are.
///
/// # Panics
/// When `mods` is no registered id: a pipeline key's code is registered before the key
/// exists ([`ModsUpload::new`]).
pub(crate) fn with_modifiers(composed: String, file: &str, mods: u64) -> String {
    if !file.contains("wa_keep(") {
        return composed;
    }
    let code = match mods {
        0 => Arc::from(STUBS),
        id => {
            let r = registry().lock().unwrap_or_else(|e| e.into_inner());
            let at = usize::try_from(id - 1).ok();
            at.and_then(|i| r.texts.get(i))
                .cloned()
                .expect("a pipeline key's modifier code is registered before the key exists")
        }
    };
    format!("{composed}\n{code}")
}

/// A call's modifiers on the device: their code's id (registered for the pipeline cache),
/// their buffers in binding order, and the block maps made for them so far.
#[derive(Debug)]
pub(crate) struct ModsUpload {
    /// The code's id in the registry, by its full text; never 0.
    pub code_id: u64,
    /// The buffers, at `@group(1)`, bindings 0, 1, ….
    pub buffers: Vec<wgpu::Buffer>,
    /// The uniform after them: where a part of a split call starts in the whole call,
    /// `(batch, head, query row, 0)`, which the kernels add to their own indices.
    origin: wgpu::Buffer,
    /// With a mask modifier: which of (batch, head) it reads (a map is shared along the
    /// others). `None`: no mask modifier, every tile full, no map.
    axes: Option<[bool; 2]>,
    maps: Mutex<HashMap<MapShape, Arc<BlockMap>>>,
    /// What was uploaded (the presets' block maps are made from it on the host).
    pub source: Modifiers,
}

/// What a dispatch binds at `@group(1)`: the modifiers' buffers, their origin, then (for a
/// kernel that calls `wa_block`, with a mask modifier) its block map.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ModsBind<'a> {
    pub upload: &'a ModsUpload,
    pub map: Option<&'a BlockMap>,
}

impl ModsBind<'_> {
    /// The buffers, bindings 0, 1, … (every one read-only to the kernels).
    pub(crate) fn buffers(&self) -> Vec<&wgpu::Buffer> {
        let mut out: Vec<_> = self.upload.buffers.iter().collect();
        out.push(&self.upload.origin);
        if let Some(m) = self.map {
            out.push(&m.blocks);
            out.push(&m.uniform);
        }
        out
    }

    /// The bind group entries, bindings 0, 1, ….
    pub(crate) fn entries(&self) -> Vec<wgpu::BindGroupEntry<'_>> {
        self.buffers()
            .into_iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect()
    }
}

impl ModsUpload {
    /// The storage bindings a kernel takes for these modifiers at the most: their buffers,
    /// and a block map's where a mask modifier has one (as [`super::record`] counts them).
    pub(crate) fn storage_bindings(&self) -> usize {
        self.buffers.len() + usize::from(self.axes.is_some())
    }

    /// The upload of `mods` on `dev`: the one made for modifiers the kernels see the same of
    /// ([`Modifiers::same_kernels`]), or a new one ([`ModsUpload::new`]), kept for the next.
    ///
    /// # Errors
    /// As [`ModsUpload::new`].
    pub(crate) fn shared(dev: &Gpu, mods: &Modifiers) -> Result<Arc<Self>> {
        Self::shared_under(dev, mods, mods.kernel_key())
    }

    /// [`ModsUpload::shared`] looked up under `key` (the tests' seam: two modifiers under
    /// one key, as a hash collision would put them).
    fn shared_under(dev: &Gpu, mods: &Modifiers, key: u64) -> Result<Arc<Self>> {
        let same = |u: &ModsUpload| u.source.same_kernels(mods);
        dev.memo(key, same, || ModsUpload::new(dev, mods))
    }

    /// Checks `mods` ([`Modifiers::check`]), registers its code and uploads its buffers.
    ///
    /// # Errors
    /// The caller's code does not check; GPU errors.
    pub(crate) fn new(dev: &Gpu, mods: &Modifiers) -> Result<Self> {
        mods.check()?;
        check_names(mods)?;
        let made = mods.kernel_code();
        let (buffers, mut code) = (&made.buffers, made.wgsl.clone());
        // Where a part of a split call starts in the whole call (zeros for a whole call): a
        // uniform, so that every part shares one pipeline.
        let n = buffers.len();
        code.push_str(&format!(
            "@group(1) @binding({n}) var<uniform> wa_origin: vec4<u32>;\n"
        ));
        // Every buffer referenced, so the pipeline's automatic layout keeps them all.
        code.push_str("fn wa_keep(b: u32, h: u32, q: u32, kv: u32) -> bool {\n");
        for b in buffers {
            code.push_str(&format!("    _ = arrayLength(&{});\n", b.name));
        }
        let at = "b + wa_origin.x, h + wa_origin.y, q + wa_origin.z, kv";
        code.push_str(&format!("    return wa_mask({at});\n}}\n"));
        code.push_str(&format!(
            "fn wa_score_log2(x: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {{\n    \
             return wa_score(x / LOG2E, {at}) * LOG2E;\n}}\n\
             fn wa_score_ln(x: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {{\n    \
             return wa_score(x, {at});\n}}\n"
        ));
        // The block map: read where it is on, every tile partial where it is off; without a
        // mask modifier every tile is full.
        let axes = if mods.has_mask() {
            code.push_str(&format!(
                "@group(1) @binding({}) var<storage, read> wa_blocks: array<u32>;\n\
                 @group(1) @binding({}) var<uniform> wa_map: array<vec4<u32>, 2>;\n",
                n + 1,
                n + 2
            ));
            code.push_str(MAP_READERS);
            Some(mods.mask_axes()?)
        } else {
            code.push_str(FULL);
            None
        };
        let code_id = register(code);
        let buffers = buffers
            .iter()
            .map(|b| match &b.data {
                BufferData::F32(v) => crate::gpu::buffer::upload(dev, "modifier buffer", v),
                // The same bytes: the kernel reads them as `array<i32>`.
                BufferData::I32(v) => {
                    crate::gpu::buffer::upload(dev, "modifier buffer", bytemuck::cast_slice(v))
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let [b0, h0, q0] = mods.origin();
        let origin = crate::gpu::buffer::uniform(dev, "modifiers' origin", &[b0, h0, q0, 0])?;
        Ok(ModsUpload {
            code_id,
            buffers,
            origin,
            axes,
            maps: Mutex::default(),
            source: mods.clone(),
        })
    }

    /// The block map a kernel of block shape (`shape.rows`, `shape.keys`) binds with these
    /// modifiers: with a mask modifier, that of `shape`, computed (in a submission of its
    /// own) the first time; `None` without one.
    ///
    /// # Errors
    /// As [`BlockMap::compute`].
    pub(crate) fn bind(&self, ctx: &Gpu, shape: MapShape) -> Result<Option<Arc<BlockMap>>> {
        let Some(axes) = self.axes else {
            return Ok(None);
        };
        if crate::kernels::collecting() {
            // A dry run: the map's pipeline noted, nothing computed, so nothing kept.
            return BlockMap::compute(ctx, self, axes, shape).map(|m| Some(Arc::new(m)));
        }
        let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = maps.get(&shape) {
            return Ok(Some(m.clone()));
        }
        let map = Arc::new(BlockMap::compute(ctx, self, axes, shape)?);
        maps.insert(shape, map.clone());
        Ok(Some(map))
    }
}

/// The names a kernel that calls the modifiers declares at module scope (its bindings,
/// functions, constants, types, the host's constants and element types, the prelude's), by
/// kernel file: a caller's name among them would be a redefinition where the two are
/// compiled together. Read from the sources once: a declaration there starts its line.
fn kernel_names() -> &'static HashMap<String, &'static str> {
    static NAMES: OnceLock<HashMap<String, &'static str>> = OnceLock::new();
    NAMES.get_or_init(|| {
        let mut names = HashMap::new();
        let helpers = crate::gpu::subgroups::declarations();
        for id in super::KernelId::ALL {
            let info = id.info();
            if !info.source.contains("wa_keep(") {
                continue;
            }
            let params = (info.params)();
            let texts = [
                info.source,
                super::wgsl::PRELUDE,
                params.as_str(),
                helpers.as_str(),
            ];
            let host = info
                .constants
                .iter()
                .chain(info.dtypes)
                .map(|s| s.to_string());
            for name in texts.iter().flat_map(|t| declared(t)).chain(host) {
                names.entry(name).or_insert(info.file);
            }
        }
        names
    })
}

/// The names WGSL `text` declares at module scope (lines that start unindented with a
/// declaration, after any attributes).
fn declared(text: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with(char::is_whitespace)) {
        let mut rest = line.trim();
        while let Some(attr) = rest.strip_prefix('@') {
            // `@name` or `@name(...)`, then the next token.
            let end = match attr.find(')') {
                Some(close) if attr.find(' ').is_none_or(|sp| close < sp) => close + 1,
                _ => attr.find(' ').unwrap_or(attr.len()),
            };
            rest = attr[end..].trim_start();
        }
        let name = if let Some(r) = rest.strip_prefix("var<") {
            r.split_once('>').map(|(_, r)| ident(r))
        } else {
            ["fn ", "const ", "var ", "alias ", "struct ", "override "]
                .iter()
                .find_map(|kw| rest.strip_prefix(kw).map(ident))
        };
        out.extend(name.filter(|n| !n.is_empty()));
    }
    out
}

/// `Err` when a name the caller's code declares is one a kernel declares too.
fn check_names(mods: &Modifiers) -> Result<()> {
    let taken = kernel_names();
    for name in mods.declared_names()? {
        if let Some(file) = taken.get(&name) {
            return Err(Error::invalid(
                "modifiers",
                format!(
                    "`{name}` is a name the kernels use ({file} declares it): give the \
                     modifier's buffer or function another name"
                ),
            ));
        }
    }
    Ok(())
}

/// The error for a path that does not apply modifiers yet (it must never ignore them).
pub(crate) fn unsupported(dev: &Gpu, what: &str) -> Error {
    Error::Unsupported {
        feature: format!("score/mask modifiers on {what} (so far: the forward on arrays, fused or with the weights, and the fused backward of a saved forward on Q, K, V)"),
        adapter: dev.adapter.get_info().name,
        hint: "run the forward on arrays (Inputs::qkv or Inputs::x), without saving it for \
               the backward"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modifiers::Preset;

    #[test]
    fn the_registry_keys_code_by_its_full_text() {
        let a = register("fn wa_test_a() {}\n".into());
        let b = register("fn wa_test_b() {}\n".into());
        assert!(a != 0 && b != 0 && a != b);
        assert_eq!(register("fn wa_test_a() {}\n".into()), a);
        let file = "fn main() { wa_keep(0u, 0u, 0u, 0u); }";
        let built = with_modifiers("// kernel".into(), file, b);
        assert!(built.ends_with("fn wa_test_b() {}\n"), "{built}");
    }

    #[test]
    fn modifiers_under_one_key_with_other_code_get_their_own_kernels() {
        let dev = crate::context::test_context();
        let (two, three) = (
            Modifiers::new().preset(Preset::Softcap(2.0)),
            Modifiers::new().preset(Preset::Softcap(3.0)),
        );
        assert!(!two.same_kernels(&three));
        // Under one key, as a 64-bit hash collision would put them: each its own upload,
        // code and pipelines.
        let key = 0x5eed;
        let a = ModsUpload::shared_under(dev, &two, key).unwrap();
        let b = ModsUpload::shared_under(dev, &three, key).unwrap();
        assert!(!Arc::ptr_eq(&a, &b));
        assert_ne!(a.code_id, b.code_id);
        let file = "fn main() { wa_keep(0u, 0u, 0u, 0u); }";
        let text = |id| with_modifiers(String::new(), file, id);
        assert!(text(a.code_id).contains("2.0 * tanh(score / 2.0)"));
        assert!(text(b.code_id).contains("3.0 * tanh(score / 3.0)"));
        // Equal modifiers (a clone, or the same made again) share the first.
        let again = Modifiers::new().preset(Preset::Softcap(2.0));
        assert!(Arc::ptr_eq(
            &a,
            &ModsUpload::shared_under(dev, &again, key).unwrap()
        ));
        // Under its own key: an upload of its own, the same code (the same pipelines).
        assert_eq!(ModsUpload::shared(dev, &two).unwrap().code_id, a.code_id);
    }

    #[test]
    fn the_kernels_code_is_made_once_and_afresh_after_a_change() {
        let m = Modifiers::new().preset(Preset::Softcap(2.0));
        let first = Arc::clone(m.kernel_code());
        assert!(Arc::ptr_eq(&first, m.kernel_code()));
        // A clone shares it; a builder after it makes it again.
        assert!(Arc::ptr_eq(&first, m.clone().kernel_code()));
        let more = m.clone().preset(Preset::PrefixLm(2));
        assert!(!Arc::ptr_eq(&first, more.kernel_code()));
        assert!(more.kernel_code().wgsl.contains("kv < 2u"));
        assert!(!first.wgsl.contains("kv < 2u"));
    }
}
