//! Device creation, limits and error capture (adapter choice: `adapter.rs`): everything a forward pass
//! needs from wgpu, created once and shared.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::gpu::pipeline::PipelineCache;
use crate::phases::{Phase, PhaseTimes, Phases};
use crate::timing::{KernelTime, Profiling, Timing};
use crate::tune::TuneCache;

mod adapter;
mod backend;
pub(crate) mod coop;
use adapter::select_async;
pub use adapter::{list_adapters, AdapterSummary, ContextOptions, NO_ADAPTER_HINT};
pub use backend::Backend;
pub use coop::CoopShape;

/// An open device: the adapter, its device and queue, and the compiled kernels.
///
/// Create one and reuse it; every call on it ([`crate::Attention::run`],
/// [`crate::Layer::run`], …) shares the pipeline cache.
pub struct Context {
    pub(crate) adapter: wgpu::Adapter,
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) limits: wgpu::Limits,
    pub(crate) pipelines: PipelineCache,
    pub(crate) pool: crate::gpu::pool::Pool,
    runtime_checks: bool,
    blocked: crate::kernels::flash_blocked::BlockedOptions,
    stand_in: std::sync::OnceLock<wgpu::Buffer>,
    unused_out: std::sync::OnceLock<[wgpu::Buffer; 2]>,
    one: std::sync::OnceLock<wgpu::Buffer>,
    subgroup_size: Option<u32>,
    lost: Arc<Mutex<Option<String>>>,
    pub(crate) timing: Timing,
    pub(crate) phases: Phases,
    tune: TuneCache,
    tuning: bool,
    /// Unique in the process: what a resource made on this context is checked against.
    id: u64,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("adapter", &self.adapter.get_info().name)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// Opens the best adapter with default options (honouring `WGPU_BACKEND` and
    /// `WGPU_ADAPTER_NAME`).
    ///
    /// # Errors
    /// [`Error::NoAdapter`] when none is found, with a hint naming the fix;
    /// [`Error::RequestDevice`] when the adapter refuses a device;
    /// [`Error::InvalidArgument`] when `WGPU_BACKEND` names an unknown backend.
    pub fn new() -> Result<Self> {
        Self::with_options(&ContextOptions::default())
    }

    /// [`Context::new`] without blocking: what the browser (wasm32, WebGPU) calls.
    ///
    /// # Errors
    /// As [`Context::new`].
    pub async fn new_async() -> Result<Self> {
        Self::with_options_async(&ContextOptions::default()).await
    }

    /// Opens the best adapter matching `options`.
    ///
    /// # Errors
    /// As [`Context::new`].
    pub fn with_options(options: &ContextOptions) -> Result<Self> {
        crate::gpu::oneshot::block_on(Self::with_options_async(options))
    }

    /// [`Context::with_options`] without blocking.
    ///
    /// # Errors
    /// As [`Context::new`].
    pub async fn with_options_async(options: &ContextOptions) -> Result<Self> {
        let start = crate::phases::Instant::now();
        let adapter = select_async(options)
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| Error::NoAdapter {
                wanted: options.describe(),
                hint: NO_ADAPTER_HINT.to_string(),
            })?;
        let enumerated = start.elapsed();
        let ctx = Self::from_adapter_async(adapter).await?;
        ctx.phases.add(Phase::Adapter, enumerated);
        Ok(ctx)
    }

    /// Opens a device on an adapter the caller chose, with the adapter's full limits and
    /// the optional features the kernels use where it has them (subgroups, timestamp queries).
    ///
    /// # Errors
    /// [`Error::RequestDevice`] when the adapter refuses.
    pub fn from_adapter(adapter: wgpu::Adapter) -> Result<Self> {
        crate::gpu::oneshot::block_on(Self::from_adapter_async(adapter))
    }

    /// [`Context::from_adapter`] without blocking.
    ///
    /// # Errors
    /// As [`Context::from_adapter`].
    pub async fn from_adapter_async(adapter: wgpu::Adapter) -> Result<Self> {
        let start = crate::phases::Instant::now();
        let limits = adapter.limits();
        let wanted = wgpu::Features::SUBGROUP
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::SHADER_F16
            | wgpu::Features::PIPELINE_CACHE;
        let (coop, experimental_features) = coop::request(&adapter);
        let desc = wgpu::DeviceDescriptor {
            label: Some("wgpu-attention"),
            required_features: (adapter.features() & wanted) | coop,
            required_limits: limits.clone(),
            experimental_features,
            ..Default::default()
        };
        let (device, queue) =
            adapter
                .request_device(&desc)
                .await
                .map_err(|e| Error::RequestDevice {
                    adapter: adapter.get_info().name,
                    message: e.to_string(),
                })?;
        let ctx = Self::from_parts(adapter, device, queue);
        ctx.phases.add(Phase::Adapter, start.elapsed());
        Ok(ctx)
    }

    /// Wraps a device the caller already owns (its limits are taken from the device).
    pub fn from_parts(adapter: wgpu::Adapter, device: wgpu::Device, queue: wgpu::Queue) -> Self {
        let lost = Arc::new(Mutex::new(None));
        let lost_cb = Arc::clone(&lost);
        device.set_device_lost_callback(move |reason, message| {
            if let Ok(mut l) = lost_cb.lock() {
                *l = Some(format!("{reason:?}: {message}"));
            }
        });
        // Errors outside our error scopes must not panic the caller's process; each forward
        // pass runs inside scopes, so anything landing here is reported on the next call.
        device.on_uncaptured_error(Arc::new(|_e: wgpu::Error| {}));
        let limits = device.limits();
        // Subgroup kernels are compiled for one size, so they need it fixed and known.
        let info = adapter.get_info();
        let subgroup_size = (device.features().contains(wgpu::Features::SUBGROUP)
            && info.subgroup_min_size == info.subgroup_max_size)
            .then_some(info.subgroup_min_size);
        log::info!(
            "adapter: {} ({:?}, {:?}, driver {} {}); subgroup size {}; features {:?}",
            info.name,
            info.backend,
            info.device_type,
            info.driver,
            info.driver_info,
            subgroup_size.map_or("not fixed/none".to_string(), |s| s.to_string()),
            device.features()
        );
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Self {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            adapter,
            device,
            queue,
            limits,
            pipelines: PipelineCache::default(),
            pool: crate::gpu::pool::Pool::default(),
            runtime_checks: false,
            blocked: Default::default(),
            stand_in: std::sync::OnceLock::new(),
            unused_out: std::sync::OnceLock::new(),
            one: std::sync::OnceLock::new(),
            subgroup_size,
            lost,
            timing: Timing::default(),
            phases: Phases::default(),
            tune: TuneCache::from_env(),
            // The tuner times runs by blocking on the device, which the browser cannot do:
            // there every kernel is its family's default.
            tuning: crate::tune::enabled() && cfg!(not(target_arch = "wasm32")),
        }
    }

    /// The adapter's name, backend, device type and driver.
    pub fn adapter_info(&self) -> wgpu::AdapterInfo {
        self.adapter.get_info()
    }

    /// The adapter's name for messages; the browser gives none, so there it is its backend.
    fn adapter_name(&self) -> String {
        let info = self.adapter.get_info();
        if info.name.is_empty() {
            format!("{:?} adapter", info.backend)
        } else {
            info.name
        }
    }

    /// The device's limits (the adapter's full limits unless the caller made the device).
    pub fn limits(&self) -> &wgpu::Limits {
        &self.limits
    }

    /// The subgroup size kernels can be compiled for: `Some` when the device has
    /// `Features::SUBGROUP` and the adapter reports one fixed size (8 on lavapipe, 32 on
    /// NVIDIA), `None` otherwise (the subgroup kernels are then unavailable).
    pub fn subgroup_size(&self) -> Option<u32> {
        self.subgroup_size
    }

    /// Turns per-kernel timing on or off. While on, each forward pass leaves its kernels'
    /// times in [`Context::kernel_times`]: from timestamp queries on GPUs that have
    /// `Features::TIMESTAMP_QUERY`, else (and on CPU adapters such as lavapipe, whose
    /// timestamps do not bracket the work of a pass) by submitting each kernel on its own and
    /// timing it with the wall clock. Meant for benchmarks: it serializes the passes, and with
    /// several threads sharing the context, the times of one call may be another's.
    pub fn set_profiling(&self, on: bool) -> Profiling {
        let timestamps = self
            .device
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY)
            && self.adapter.get_info().device_type != wgpu::DeviceType::Cpu;
        self.timing.set(on, timestamps)
    }

    /// Replaces the autotuner's cache (by default the one [`TuneCache::from_env`] names).
    pub fn with_tune_cache(mut self, cache: TuneCache) -> Self {
        self.tune = cache;
        self
    }

    /// A small zeroed storage buffer (one vec4) bound wherever a kernel's binding has nothing
    /// to read: a matmul without a bias, a row statistic that is not used. Made once per
    /// context; kernels only read it.
    pub(crate) fn stand_in(&self) -> &wgpu::Buffer {
        self.stand_in.get_or_init(|| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("stand-in"),
                size: 16,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            })
        })
    }

    /// A small storage buffer bound to a writable binding a kernel leaves untouched in this
    /// dispatch (a fused kernel's row statistics when they are not saved). It is its own
    /// buffer, never bound to anything else: WebGPU rejects a writable binding that aliases
    /// another binding of the same dispatch, even one never written.
    pub(crate) fn unused_out(&self) -> &wgpu::Buffer {
        self.unused_outs().0
    }

    /// Two such buffers, for a dispatch that leaves two writable bindings untouched (a
    /// split-output matmul that does not split). Made once per context.
    pub(crate) fn unused_outs(&self) -> (&wgpu::Buffer, &wgpu::Buffer) {
        let [a, b] = self.unused_out.get_or_init(|| {
            [0, 1].map(|_| {
                self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("unused output"),
                    size: 16,
                    usage: wgpu::BufferUsages::STORAGE,
                    mapped_at_creation: false,
                })
            })
        });
        (a, b)
    }

    /// A storage buffer holding the single f32 1.0, made once: a row of ones for any length
    /// when read through zero strides (column sums as a matmul).
    ///
    /// # Errors
    /// GPU errors on its first use.
    pub(crate) fn one(&self) -> Result<&wgpu::Buffer> {
        if let Some(b) = self.one.get() {
            return Ok(b);
        }
        let b = crate::gpu::buffer::upload(self, "one", &[1.0])?;
        Ok(self.one.get_or_init(|| b))
    }

    /// Whether the device can run the f16 kernels (`Features::SHADER_F16`), or the error
    /// saying it cannot.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the adapter, the missing feature and the alternative.
    pub fn require_f16(&self) -> Result<()> {
        if self.device.features().contains(wgpu::Features::SHADER_F16) {
            return Ok(());
        }
        Err(Error::Unsupported {
            feature: "f16 operands (wgpu::Features::SHADER_F16)".into(),
            adapter: self.adapter_name(),
            hint: "use Dtype::F32 (CLI --dtype f32), or an adapter that has shader-f16 \
                   (`wgpu-attention devices` lists features); a device made by the caller \
                   must request SHADER_F16"
                .into(),
        })
    }

    /// The subgroup size, or the error saying the subgroup kernels cannot run here.
    ///
    /// # Errors
    /// [`Error::Unsupported`] without `Features::SUBGROUP` and a fixed subgroup size.
    pub(crate) fn require_subgroups(&self) -> Result<u32> {
        self.subgroup_size.ok_or_else(|| Error::Unsupported {
            feature: "the subgroup kernels (wgpu::Features::SUBGROUP with one fixed subgroup \
                      size)"
                .into(),
            adapter: self.adapter_name(),
            hint: "use Kernels::Storage or Kernels::Auto (CLI --kernels storage or auto)".into(),
        })
    }

    /// Turns the autotuner's measuring on or off for this context (default: on unless
    /// `WGPU_ATTENTION_TUNE=off`). Off, remembered choices are still used and everything else
    /// takes its family's default variant.
    pub fn with_tuning(mut self, on: bool) -> Self {
        self.tuning = on;
        self
    }

    /// Whether the autotuner may measure.
    pub fn tuning(&self) -> bool {
        self.tuning
    }

    /// The autotuner's remembered choices (see [`TuneCache`]).
    pub fn tune_cache(&self) -> &TuneCache {
        &self.tune
    }

    /// Where this context's wall time went since it was opened (or since
    /// [`Context::reset_phase_times`]): opening the adapter, compiling pipelines, tuning,
    /// uploading weights, recording, the device's work and the readback. Each call also logs
    /// its own split at `info` level (`timings: …`).
    pub fn phase_times(&self) -> PhaseTimes {
        self.phases.totals()
    }

    /// Sets [`Context::phase_times`] back to zero.
    pub fn reset_phase_times(&self) {
        self.phases.reset();
    }

    /// The current timing mode.
    pub fn profiling(&self) -> Profiling {
        self.timing.mode()
    }

    /// The GPU time of each compute pass of the last forward pass while profiling, in order.
    pub fn kernel_times(&self) -> Vec<KernelTime> {
        self.timing.times()
    }

    /// This context's id, unique in the process.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The wgpu device, for callers who record their own work beside ours.
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// The wgpu queue.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    /// Creates every kernel with naga's runtime bounds checks on, including the kernels whose
    /// indices are proven in bounds and that otherwise run without them (those that say
    /// `runtime checks: off`): for testing them against their checked twins. Set it before
    /// the first call (compiled kernels are kept per context).
    pub fn with_runtime_checks(mut self, on: bool) -> Self {
        self.runtime_checks = on;
        self
    }

    /// This context with the GPU family's fused kernel (`FlashVariant::Blocked`) running its
    /// inner loop as `options` say (double buffer, subgroup reductions, f16 arithmetic; each
    /// `None` is the adapter's default).
    pub fn with_blocked_options(mut self, options: crate::BlockedOptions) -> Self {
        self.blocked = options;
        self
    }

    /// The fused GPU kernel's inner-loop options ([`Context::with_blocked_options`]).
    pub fn blocked_options(&self) -> crate::BlockedOptions {
        self.blocked
    }

    /// Whether every kernel keeps naga's runtime checks ([`Context::with_runtime_checks`]).
    pub fn runtime_checks(&self) -> bool {
        self.runtime_checks
    }

    /// Waits until everything submitted to the device so far has run (as
    /// `torch.cuda.synchronize()`): for timing work whose results stay on the device.
    ///
    /// # Errors
    /// [`Error::Poll`] when the wait fails or times out, [`Error::DeviceLost`].
    pub fn synchronize(&self) -> Result<()> {
        crate::gpu::readback::wait_all(self)
    }

    /// What the buffer pool holds: intermediates and readback staging are reused across
    /// calls by size class, so a loop of calls of one shape allocates nothing after its first.
    pub fn memory(&self) -> crate::gpu::pool::MemoryStats {
        self.pool.stats()
    }

    /// Frees the pool's idle buffers (those in use, by a [`crate::Tensor`] say, stay).
    pub fn release_memory(&self) {
        self.pool.release();
    }

    /// `Err(DeviceLost)` once the device has been lost; a lost context stays unusable.
    ///
    /// # Errors
    /// [`Error::DeviceLost`] with the driver's reason.
    pub fn check_alive(&self) -> Result<()> {
        // Let a pending device-lost callback run (it fires from poll), without waiting.
        let _ = self.device.poll(wgpu::PollType::Poll);
        match self.lost.lock().ok().and_then(|l| l.clone()) {
            Some(msg) => Err(Error::DeviceLost(msg)),
            None => Ok(()),
        }
    }

    /// Runs `f` inside validation and out-of-memory error scopes and turns anything they
    /// capture into `Err`.
    pub(crate) fn scoped<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        crate::gpu::oneshot::block_on(self.scoped_async(async { f() }))
    }

    /// [`Context::scoped`] around a future (the async core's calls).
    pub(crate) async fn scoped_async<T>(&self, f: impl Future<Output = Result<T>>) -> Result<T> {
        self.check_alive()?;
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let out = f.await;
        let v = validation.pop().await;
        let o = oom.pop().await;
        if let Some(e) = o.or(v) {
            return Err(e.into());
        }
        self.check_alive()?;
        out
    }
}

/// One context on the default adapter for the crate's unit tests that need a GPU, with the
/// tuner's measuring off (tests force the variants they check) and its cache in memory only,
/// so nothing is written outside the tests' temporary directories.
#[cfg(test)]
pub(crate) fn test_context() -> &'static Context {
    static CTX: std::sync::OnceLock<Context> = std::sync::OnceLock::new();
    CTX.get_or_init(|| match Context::new() {
        Ok(c) => c.with_tuning(false).with_tune_cache(TuneCache::at(None)),
        Err(e) => panic!("GPU tests need an adapter and none could be opened: {e}"),
    })
}
