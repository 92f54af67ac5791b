//! Score and mask modifiers in the kernels (issue 24): a kernel that applies them calls
//! `wa_keep(b, h, q, kv) -> bool` and `wa_score_log2(x, b, h, q, kv) -> f32` (scores in the
//! log2 domain, as the fused kernels keep them) where it applies causal and the mask. Without
//! modifiers the host appends identity stubs, so such a kernel's results are bit for bit what
//! they were; with them, the caller's checked code ([`crate::modifiers::Modifiers::wgsl`],
//! its buffers at `@group(1)`), under a pipeline key of its own.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::gpu::Device;
use crate::modifiers::{BufferData, Modifiers};

/// What a kernel that applies modifiers appends without any.
const STUBS: &str = "fn wa_keep(b: u32, h: u32, q: u32, kv: u32) -> bool {
    return true;
}
fn wa_score_log2(x: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {
    return x;
}
";

/// The modifiers' code by its hash (the pipeline key holds the hash), for every call of the
/// process: a pipeline built later from the key finds its code here.
fn sources() -> &'static Mutex<HashMap<u64, Arc<str>>> {
    static SOURCES: OnceLock<Mutex<HashMap<u64, Arc<str>>>> = OnceLock::new();
    SOURCES.get_or_init(Default::default)
}

/// A kernel source `composed` (from the file `file`) with what its modifier calls need: the
/// stubs (`mods == 0`) or the code registered under `mods`. Kernels that call no modifier
/// are left as they are.
pub(crate) fn with_modifiers(composed: String, file: &str, mods: u64) -> String {
    if !file.contains("wa_keep(") {
        return composed;
    }
    let code = match mods {
        0 => Arc::from(STUBS),
        h => sources()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&h)
            .cloned()
            .unwrap_or_else(|| Arc::from(STUBS)),
    };
    format!("{composed}\n{code}")
}

/// A call's modifiers on the device: their code's hash (registered for the pipeline cache)
/// and their buffers, in binding order.
#[derive(Debug)]
pub(crate) struct ModsUpload {
    /// The code's hash, never 0.
    pub hash: u64,
    /// The buffers, at `@group(1)`, bindings 0, 1, ….
    pub buffers: Vec<wgpu::Buffer>,
}

impl ModsUpload {
    /// Checks `mods` ([`Modifiers::check`]), registers its code and uploads its buffers.
    ///
    /// # Errors
    /// The caller's code does not check; GPU errors.
    pub(crate) fn new(dev: &Device, mods: &Modifiers) -> Result<Self> {
        mods.check()?;
        let buffers = mods.all_buffers();
        let mut code = mods.wgsl(1, 0);
        // Every buffer referenced, so the pipeline's automatic layout keeps them all.
        code.push_str("fn wa_keep(b: u32, h: u32, q: u32, kv: u32) -> bool {\n");
        for b in &buffers {
            code.push_str(&format!("    _ = arrayLength(&{});\n", b.name));
        }
        code.push_str("    return wa_mask(b, h, q, kv);\n}\n");
        code.push_str(
            "fn wa_score_log2(x: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    \
             return wa_score(x / LOG2E, b, h, q, kv) * LOG2E;\n}\n",
        );
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        code.hash(&mut hasher);
        let hash = hasher.finish().max(1);
        sources()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(hash)
            .or_insert_with(|| Arc::from(code));
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
        Ok(ModsUpload { hash, buffers })
    }
}

/// The error for a path that does not apply modifiers yet (it must never ignore them).
pub(crate) fn unsupported(dev: &Device, what: &str) -> Error {
    Error::Unsupported {
        feature: format!("score/mask modifiers on {what} (so far: the fused forward, flash-tiled, flash-blocked and flash-subgroup)"),
        adapter: dev.adapter.get_info().name,
        hint: "run the fused forward (return_weights(false)) with Kernels::Storage or \
               Kernels::Subgroup"
            .into(),
    }
}
