//! Compiled compute pipelines, created on first use and cached per [`Context`] under the
//! typed [`PipelineKey`] a kernel's description derives (see [`crate::kernels`]); and, where
//! the device has `Features::PIPELINE_CACHE`, the driver's compiled code kept on disk beside
//! the tuning results (wgpu's `PipelineCache`), so a new process need not compile again.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::context::Context;
use crate::error::Result;
use crate::kernels::PipelineKey;
use crate::phases::Phase;

/// The cache: one pipeline per key, built once per context.
#[derive(Default)]
pub(crate) struct PipelineCache {
    pipelines: Mutex<HashMap<PipelineKey, Arc<wgpu::ComputePipeline>>>,
    disk: Mutex<Option<Option<Disk>>>,
}

/// The driver's pipeline cache and the file it is kept in.
struct Disk {
    cache: wgpu::PipelineCache,
    path: PathBuf,
}

impl Disk {
    /// The cache in the tuning cache's directory, named for the adapter and driver (wgpu's
    /// key), loaded if it exists; `None` without the feature, a key or a directory.
    fn open(ctx: &Context) -> Option<Self> {
        if !ctx
            .device
            .features()
            .contains(wgpu::Features::PIPELINE_CACHE)
        {
            return None;
        }
        let info = ctx.adapter.get_info();
        let key = wgpu::util::pipeline_cache_key(&info)?;
        let dir = ctx.tune_cache().dir()?;
        let path = dir.join(format!("{key}.bin"));
        let data = std::fs::read(&path).ok();
        // SAFETY: the data was written by `PipelineCache::get_data` for this key (an adapter
        // and driver), or is absent; `fallback: true` makes the driver start empty when it
        // rejects the data (a new driver version, a truncated file).
        let cache = unsafe {
            ctx.device
                .create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                    label: Some("wgpu-attention pipelines"),
                    data: data.as_deref(),
                    fallback: true,
                })
        };
        log::info!(
            "pipeline cache {} ({})",
            path.display(),
            match &data {
                Some(d) => format!("{} bytes", d.len()),
                None => "new".to_string(),
            }
        );
        Some(Disk { cache, path })
    }

    /// Writes what the driver holds now; best effort (a read-only directory only costs a
    /// compile next time).
    fn save(&self) {
        let Some(data) = self.cache.get_data() else {
            return;
        };
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let tmp = self.path.with_extension("bin.tmp");
        if std::fs::write(&tmp, &data).is_ok() {
            let _ = std::fs::rename(&tmp, &self.path);
        }
    }
}

impl PipelineCache {
    /// The pipeline for `key`, compiling it on first use (inside the caller's error scope).
    pub(crate) fn get(
        &self,
        ctx: &Context,
        key: PipelineKey,
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        let mut map = self
            .pipelines
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(p) = map.get(&key) {
            return Ok(Arc::clone(p));
        }
        let mut disk = self
            .disk
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let disk = disk.get_or_insert_with(|| Disk::open(ctx));
        let _compile = ctx.phases.enter(Phase::Compile);
        ctx.phases.count_pipeline();
        let info = key.kernel.info();
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(info.file),
            source: wgpu::ShaderSource::Wgsl(key.source().into()),
        };
        let module = if info.trusted && !ctx.runtime_checks() {
            // SAFETY: a trusted kernel's every index is proven in bounds (its WGSL header
            // gives the proof, from invariants its Rust description enforces) and its loops
            // are bounded; `tests/flash_blocked.rs` checks it against its checked twin.
            unsafe {
                ctx.device
                    .create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
            }
        } else {
            ctx.device.create_shader_module(desc)
        };
        let pipeline = ctx
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(info.file),
                layout: None,
                module: &module,
                entry_point: Some(info.entry),
                compilation_options: Default::default(),
                cache: disk.as_ref().map(|d| &d.cache),
            });
        if let Some(d) = disk {
            d.save();
        }
        let pipeline = Arc::new(pipeline);
        map.insert(key, Arc::clone(&pipeline));
        Ok(pipeline)
    }
}

#[cfg(test)]
mod tests {
    use crate::{Attention, Context, TuneCache};

    #[test]
    fn compiled_pipelines_are_kept_beside_the_tuning_cache() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = Context::new()
            .unwrap()
            .with_tuning(false)
            .with_tune_cache(TuneCache::at(Some(dir.path().join("tune.json"))));
        let x = ndarray::Array2::from_shape_fn((5, 4), |(i, j)| (i + j) as f32 * 0.1);
        Attention::new()
            .forward(&ctx, x.view().into_dyn(), None)
            .unwrap();
        let info = ctx.adapter_info();
        let supported = ctx
            .device()
            .features()
            .contains(wgpu::Features::PIPELINE_CACHE);
        match wgpu::util::pipeline_cache_key(&info).filter(|_| supported) {
            Some(key) => {
                let file = dir.path().join(format!("{key}.bin"));
                assert!(file.exists(), "no {}", file.display());
            }
            None => eprintln!("{}: no pipeline cache on this adapter", info.name),
        }
    }
}
