//! Compiled compute pipelines, created on first use and cached per [`Context`] under the
//! typed [`PipelineKey`] a kernel's description derives (see [`crate::kernels`]); and, where
//! the device has `Features::PIPELINE_CACHE`, the driver's compiled code kept on disk beside
//! the tuning results (wgpu's `PipelineCache`), so a new process need not compile again.

use std::collections::{HashMap, HashSet};
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
        if let Some(p) = self.lock().get(&key) {
            return Ok(Arc::clone(p));
        }
        let _compile = ctx.phases.enter(Phase::Compile);
        self.late.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let disk = self.disk(ctx);
        let pipeline = build(ctx, key, disk.as_ref().and_then(|d| d.as_ref()));
        if let Some(Some(d)) = disk.as_ref() {
            d.save();
        }
        Ok(self.insert(key, pipeline))
    }

    /// Compiles every pipeline of `keys` not made yet, on as many threads as the host has
    /// cores (up to one per pipeline), each inside its own error scopes: a driver that
    /// compiles when a pipeline is created (most GPU drivers) then compiles a call's kernels
    /// side by side instead of one after the other. In the browser, one after the other.
    ///
    /// # Errors
    /// The first compile error (validation, out of memory, a lost device).
    pub(crate) fn prepare(&self, ctx: &Context, keys: &[PipelineKey]) -> Result<()> {
        let mut missing: Vec<PipelineKey> = Vec::new();
        {
            let map = self.lock();
            for k in keys {
                if !map.contains_key(k) && !missing.contains(k) {
                    missing.push(*k);
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
                .map(|&key| (key, ctx.scoped(|| Ok(build(ctx, key, disk)))))
                .collect();
            if let Some(d) = disk {
                d.save();
            }
            built
        } else {
            build_parallel(ctx, &missing, threads, disk)
        };
        let mut first_error = None;
        for (key, result) in built {
            match result {
                Ok(p) => drop(self.insert(key, p)),
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PipelineKey, Arc<wgpu::ComputePipeline>>> {
        self.pipelines
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Caches `pipeline` under `key`, unless another thread did first (then that one).
    fn insert(
        &self,
        key: PipelineKey,
        pipeline: wgpu::ComputePipeline,
    ) -> Arc<wgpu::ComputePipeline> {
        let mut map = self.lock();
        Arc::clone(map.entry(key).or_insert_with(|| Arc::new(pipeline)))
    }

    /// The disk cache, opened on first use.
    fn disk(&self, ctx: &Context) -> std::sync::MutexGuard<'_, Option<Option<Disk>>> {
        let mut disk = self
            .disk
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        disk.get_or_insert_with(|| Disk::open(ctx));
        disk
    }
}

/// Compiles the pipelines of `keys` on up to `threads` threads, each inside its own error
/// scopes; saves the disk cache once at the end.
#[cfg(not(target_arch = "wasm32"))]
fn build_parallel(
    ctx: &Context,
    keys: &[PipelineKey],
    threads: usize,
    disk: Option<&Disk>,
) -> Vec<(PipelineKey, Result<wgpu::ComputePipeline>)> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let built = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads.min(keys.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&key) = keys.get(i) else {
                    break;
                };
                let result = ctx.scoped(|| Ok(build(ctx, key, disk)));
                let mut built = built.lock().unwrap_or_else(|p| p.into_inner());
                built.push((key, result));
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
fn build_parallel(
    ctx: &Context,
    keys: &[PipelineKey],
    _threads: usize,
    disk: Option<&Disk>,
) -> Vec<(PipelineKey, Result<wgpu::ComputePipeline>)> {
    keys.iter()
        .map(|&key| (key, ctx.scoped(|| Ok(build(ctx, key, disk)))))
        .collect()
}

/// Compiles the pipeline of `key` (counted in the context's phase clock).
fn build(ctx: &Context, key: PipelineKey, disk: Option<&Disk>) -> wgpu::ComputePipeline {
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
    ctx.device
        .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(info.file),
            layout: None,
            module: &module,
            entry_point: Some(info.entry),
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
