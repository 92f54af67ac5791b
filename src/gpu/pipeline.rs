//! Compiled compute pipelines, created on first use and cached per device under an opaque
//! [`PipelineHash`] the layer above computes from its own key (the kernels' typed
//! `PipelineKey`, in the `kernels` module), which also says how to build one
//! ([`PipelineRecipe`]); and, where the device has `Features::PIPELINE_CACHE`, the driver's
//! compiled code kept on disk beside the tuning results (wgpu's `PipelineCache`), so a new
//! process need not compile again.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::Gpu;
use crate::error::Result;
use crate::phases::Phase;

/// A pipeline's identity in the cache: equal for pipelines built the same way. Computed by
/// the layer above from its own key; 128 bits, so distinct keys do not meet in practice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PipelineHash(pub u128);

/// What a compute pipeline is built from.
pub(crate) struct PipelineSource {
    /// The label of the pipeline and its module.
    pub label: &'static str,
    /// The entry point.
    pub entry: &'static str,
    /// The full WGSL text.
    pub wgsl: String,
    /// Whether every index the shader computes is proven in bounds, so its module may be
    /// created without naga's runtime checks (unless the device keeps them).
    pub trusted: bool,
}

/// A key the cache can hold: its hash, and how to build its pipeline (asked only on a miss).
pub(crate) trait PipelineRecipe {
    /// The key's identity in the cache.
    fn pipeline_hash(&self) -> PipelineHash;
    /// What to compile.
    fn describe(&self) -> PipelineSource;
}

/// The cache: one pipeline per key, built once per device.
#[derive(Default)]
pub(crate) struct PipelineCache {
    pipelines: Mutex<HashMap<PipelineHash, Arc<wgpu::ComputePipeline>>>,
    disk: Mutex<Option<Option<Disk>>>,
    /// The directory the driver's cache is kept in (the tuning cache's, see
    /// [`PipelineCache::keep_in`]); `None`: not kept.
    dir: Option<PathBuf>,
    /// The signatures of calls whose pipelines were compiled ahead ([`PipelineCache::prepare`]).
    prepared: Mutex<HashSet<String>>,
    /// Pipelines compiled while recording, not ahead (tests: the dry run missed them).
    late: std::sync::atomic::AtomicUsize,
}

/// The driver's pipeline cache and the file it is kept in.
struct Disk {
    cache: wgpu::PipelineCache,
    path: PathBuf,
}

impl Disk {
    /// The cache in `dir`, named for the adapter and driver (wgpu's key), loaded if it
    /// exists; `None` without the feature, a key or a directory.
    fn open(ctx: &Gpu, dir: Option<&Path>) -> Option<Self> {
        if !ctx
            .device
            .features()
            .contains(wgpu::Features::PIPELINE_CACHE)
        {
            return None;
        }
        let info = ctx.adapter.get_info();
        let key = wgpu::util::pipeline_cache_key(&info)?;
        let dir = dir?;
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
        // This process's own temporary file: two processes may save at once.
        let tmp = self
            .path
            .with_extension(format!("bin.{}.tmp", std::process::id()));
        if std::fs::write(&tmp, &data).is_ok() {
            let _ = std::fs::rename(&tmp, &self.path);
        }
    }
}

impl PipelineCache {
    /// Keeps the driver's compiled code in `dir` (the tuning cache's directory; `None`: not
    /// kept). Set before the first compile.
    pub(crate) fn keep_in(&mut self, dir: Option<&Path>) {
        self.dir = dir.map(Path::to_path_buf);
    }

    /// The pipeline for `key`, compiling it on first use (inside the caller's error scope).
    pub(crate) fn get(
        &self,
        ctx: &Gpu,
        key: &impl PipelineRecipe,
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        let hash = key.pipeline_hash();
        if let Some(p) = self.lock().get(&hash) {
            return Ok(Arc::clone(p));
        }
        let _compile = ctx.phases.enter(Phase::Compile);
        self.late.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let disk = self.disk(ctx);
        let pipeline = build(ctx, key, disk.as_ref().and_then(|d| d.as_ref()));
        if let Some(Some(d)) = disk.as_ref() {
            d.save();
        }
        Ok(self.insert(hash, pipeline))
    }

    /// Compiles every pipeline of `keys` not made yet, on as many threads as the host has
    /// cores (up to one per pipeline), each inside its own error scopes: a driver that
    /// compiles when a pipeline is created (most GPU drivers) then compiles a call's kernels
    /// side by side instead of one after the other. In the browser, one after the other.
    ///
    /// # Errors
    /// The first compile error (validation, out of memory, a lost device).
    pub(crate) fn prepare<K: PipelineRecipe + Sync>(&self, ctx: &Gpu, keys: &[K]) -> Result<()> {
        let mut missing: Vec<(PipelineHash, &K)> = Vec::new();
        {
            let map = self.lock();
            for k in keys {
                let hash = k.pipeline_hash();
                if !map.contains_key(&hash) && !missing.iter().any(|(h, _)| *h == hash) {
                    missing.push((hash, k));
                }
            }
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        if missing.is_empty() {
            return Ok(());
        }
        let _compile = ctx.phases.enter(Phase::Compile);
        let disk = self.disk(ctx);
        let disk = disk.as_ref().and_then(|d| d.as_ref());
        let built = if missing.len() < 2 || threads < 2 || cfg!(target_arch = "wasm32") {
            // One after the other, each in its own error scopes (the caller has none here).
            let built = missing
                .iter()
                .map(|&(hash, key)| (hash, ctx.scoped(|| Ok(build(ctx, key, disk)))))
                .collect();
            if let Some(d) = disk {
                d.save();
            }
            built
        } else {
            build_parallel(ctx, &missing, threads, disk)
        };
        let mut first_error = None;
        for (hash, result) in built {
            match result {
                Ok(p) => drop(self.insert(hash, p)),
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Whether `signature` (a call's plan and shape, see [`crate::Attention`]'s first calls)
    /// is seen for the first time; it is remembered.
    pub(crate) fn first_time(&self, signature: String) -> bool {
        self.prepared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(signature)
    }

    /// Whether `signature` was seen by [`PipelineCache::first_time`] (not remembering it).
    pub(crate) fn seen(&self, signature: &str) -> bool {
        self.prepared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(signature)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PipelineHash, Arc<wgpu::ComputePipeline>>> {
        self.pipelines
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Caches `pipeline` under `hash`, unless another thread did first (then that one).
    fn insert(
        &self,
        hash: PipelineHash,
        pipeline: wgpu::ComputePipeline,
    ) -> Arc<wgpu::ComputePipeline> {
        let mut map = self.lock();
        Arc::clone(map.entry(hash).or_insert_with(|| Arc::new(pipeline)))
    }

    /// The disk cache, opened on first use.
    fn disk(&self, ctx: &Gpu) -> std::sync::MutexGuard<'_, Option<Option<Disk>>> {
        let mut disk = self
            .disk
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        disk.get_or_insert_with(|| Disk::open(ctx, self.dir.as_deref()));
        disk
    }
}

/// Compiles the pipelines of `keys` on up to `threads` threads, each inside its own error
/// scopes; saves the disk cache once at the end.
#[cfg(not(target_arch = "wasm32"))]
fn build_parallel<K: PipelineRecipe + Sync>(
    ctx: &Gpu,
    keys: &[(PipelineHash, &K)],
    threads: usize,
    disk: Option<&Disk>,
) -> Vec<(PipelineHash, Result<wgpu::ComputePipeline>)> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let built = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads.min(keys.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(hash, key)) = keys.get(i) else {
                    break;
                };
                let result = ctx.scoped(|| Ok(build(ctx, key, disk)));
                let mut built = built.lock().unwrap_or_else(|p| p.into_inner());
                built.push((hash, result));
            });
        }
    });
    if let Some(d) = disk {
        d.save();
    }
    built.into_inner().unwrap_or_else(|p| p.into_inner())
}

/// In the browser there are no threads: never called there ([`PipelineCache::prepare`]
/// compiles one after the other), but the same in order.
#[cfg(target_arch = "wasm32")]
fn build_parallel<K: PipelineRecipe + Sync>(
    ctx: &Gpu,
    keys: &[(PipelineHash, &K)],
    _threads: usize,
    disk: Option<&Disk>,
) -> Vec<(PipelineHash, Result<wgpu::ComputePipeline>)> {
    keys.iter()
        .map(|&(hash, key)| (hash, ctx.scoped(|| Ok(build(ctx, key, disk)))))
        .collect()
}

/// Compiles the pipeline of `key` (counted in the device's phase clock).
fn build(ctx: &Gpu, key: &impl PipelineRecipe, disk: Option<&Disk>) -> wgpu::ComputePipeline {
    ctx.phases.count_pipeline();
    let source = key.describe();
    let desc = wgpu::ShaderModuleDescriptor {
        label: Some(source.label),
        source: wgpu::ShaderSource::Wgsl(source.wgsl.into()),
    };
    let module = if source.trusted && !ctx.runtime_checks() {
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
    ctx.device
        .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(source.label),
            layout: None,
            module: &module,
            entry_point: Some(source.entry),
            compilation_options: Default::default(),
            cache: disk.map(|d| &d.cache),
        })
}

#[cfg(test)]
mod tests {
    use crate::{Attention, Context, Dtype, Kernels, Projections, TuneCache};
    use std::sync::atomic::Ordering;

    #[test]
    fn a_first_call_compiles_every_pipeline_it_needs_ahead() {
        // A context of its own, so no other test's calls compile into it meanwhile.
        let ctx = Context::new()
            .unwrap()
            .with_tuning(false)
            .with_tune_cache(TuneCache::at(None));
        let x = ndarray::Array3::from_shape_fn((2, 70, 8), |(b, i, j)| {
            ((b * 5 + i * 3 + j) as f32 * 0.1).sin()
        });
        let w = ndarray::Array2::from_shape_fn((8, 8), |(i, j)| ((i * 8 + j) as f32).cos());
        let p = Projections::new(w.view(), w.view(), w.view()).with_output(w.view(), None);
        let tiny = x.slice(ndarray::s![.., ..3, ..]).to_owned();
        let base = Attention::new().heads(2);
        let mut calls = vec![
            ("fused", base.return_weights(false), &x, None),
            ("weights", base.causal(true), &x, Some(&p)),
            ("tiny", base, &tiny, Some(&p)),
            (
                "storage",
                base.kernels(Kernels::Storage).return_weights(false),
                &x,
                Some(&p),
            ),
        ];
        if ctx.require_f16().is_ok() {
            calls.push((
                "f16",
                base.dtype(Dtype::F16).return_weights(false),
                &x,
                Some(&p),
            ));
        }
        for (what, op, x, p) in calls {
            let late = ctx.pipelines.late.load(Ordering::Relaxed);
            op.run(&ctx, crate::Inputs::x(x).projections(p)).unwrap();
            let now = ctx.pipelines.late.load(Ordering::Relaxed);
            assert_eq!(
                now,
                late,
                "{what}: {} pipelines compiled while recording",
                now - late
            );
        }
        assert!(ctx.phase_times().pipelines >= 4);
    }

    #[test]
    fn compiled_pipelines_are_kept_beside_the_tuning_cache() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = Context::new()
            .unwrap()
            .with_tuning(false)
            .with_tune_cache(TuneCache::at(Some(dir.path().join("tune.json"))));
        let x = ndarray::Array2::from_shape_fn((5, 4), |(i, j)| (i + j) as f32 * 0.1);
        Attention::new().run(&ctx, crate::Inputs::x(&x)).unwrap();
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
