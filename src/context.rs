//! The user's entry point: a [`Context`] is an open device (the device layer,
//! `gpu::Gpu`: wgpu's device, queue and limits, error scopes, the buffer pool and
//! the pipeline cache) and the settings every call on it reads (the fused kernel's
//! inner-loop options, the tuner's cache and switch). Adapter choice: `adapter.rs`.

use std::fmt;

use crate::error::{Error, Result};
use crate::gpu::timing::{KernelTime, Profiling};
use crate::gpu::Gpu;
use crate::kernels::flash_blocked::BlockedOptions;
use crate::phases::{Phase, PhaseTimes};
use crate::settings::{Settings, TuneCache};

mod adapter;
mod backend;
pub(crate) use crate::gpu::coop::CoopShape;
pub(crate) use crate::gpu::hardware::StandIn;
pub(crate) use crate::gpu::sanitizer::{Sanitize, SanitizerSummary};
use adapter::select_async;
pub use adapter::{
    default_adapter, list_adapters, AdapterSummary, ContextOptions, NO_ADAPTER_HINT,
};
pub use backend::Backend;

/// An open device: the adapter, its device and queue, and the compiled kernels.
///
/// Create one and reuse it; every call on it ([`crate::Attention::run`],
/// [`crate::Layer::run`], …) shares the pipeline cache.
pub struct Context {
    /// The device layer: every kernel and buffer goes through it (see the `Deref` below).
    dev: Gpu,
    settings: Settings,
}

/// A context is its device to the rest of the crate: `ctx.device`, `ctx.pool`,
/// `ctx.scoped(…)` and the kernels' `&Gpu` arguments reach it through this.
#[doc(hidden)]
impl std::ops::Deref for Context {
    type Target = Gpu;
    fn deref(&self) -> &Gpu {
        &self.dev
    }
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
        // A misspelt switch is an error here (a device made from the caller's parts only
        // logs it).
        let stand_in = match options.stand_in {
            Some(s) => s,
            None => StandIn::from_env()?,
        };
        let sanitize = match options.sanitize {
            Some(s) => s,
            None => Sanitize::from_env()?,
        };
        let ctx = Self::from_adapter_async(adapter)
            .await?
            .with_stand_in(stand_in)
            .with_sanitizer(sanitize);
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
        Ok(Self::compose(Gpu::from_adapter_async(adapter).await?))
    }

    /// Wraps a device the caller already owns (its limits are taken from the device).
    pub fn from_parts(adapter: wgpu::Adapter, device: wgpu::Device, queue: wgpu::Queue) -> Self {
        Self::compose(Gpu::from_parts(adapter, device, queue))
    }

    /// `dev` with the default settings (see [`Settings::from_env`]); compiled pipelines are
    /// kept beside the tuning cache.
    fn compose(mut dev: Gpu) -> Self {
        let settings = Settings::from_env();
        dev.pipelines.keep_in(settings.tune.dir());
        Context { dev, settings }
    }

    /// This context with the GPU stand-in on or off ([`StandIn`]; the default is
    /// `WGPU_ATTENTION_STAND_IN`): under [`StandIn::Gpu`] a CPU adapter takes every decision
    /// a discrete GPU takes, emulating the subgroup width and cooperative matrices it lacks.
    /// For tests: slow, and its timings mean nothing. Call it before the first call.
    #[must_use]
    pub fn with_stand_in(mut self, stand_in: StandIn) -> Self {
        self.dev.set_stand_in(stand_in);
        self
    }

    /// This context with every dispatch run by the WGSL sanitizer (`wgsl-sanitizer`) at
    /// subgroups of [`Sanitize::Lanes`] lanes, or on the adapter ([`Sanitize::Off`]; the
    /// default is `WGPU_ATTENTION_SANITIZE`). Under it a call is planned as a discrete GPU of
    /// that subgroup width plans it (native subgroups, 16 × 16 cooperative matrices, f16
    /// where the device has it, 48 KiB of workgroup memory), each dispatch's kernel is the
    /// native text such a GPU gets, and the interpreter runs it on the device's buffers as
    /// they are just before it, writing its results back: the answer is the sanitizer's. A
    /// data race, an index out of bounds, a read of unwritten workgroup memory, a divergent
    /// barrier or a read of an inactive lane is an [`crate::Error::Sanitizer`] naming the
    /// kernel, its constants, the WGSL line and both invocations; NaN or infinity made from
    /// finite operands is a logged warning. For tests: slow. Call it before the first call.
    #[must_use]
    pub fn with_sanitizer(mut self, sanitize: Sanitize) -> Self {
        self.dev.set_sanitize(sanitize);
        self
    }

    /// Under the sanitizer, runs every dispatch under `seeds` schedules (seeds
    /// `WGPU_ATTENTION_SANITIZE_SEED` on; default `WGPU_ATTENTION_SANITIZE_SEEDS`, else 1),
    /// each from the same inputs: a finding names the seed that made it, and that seed alone
    /// reproduces it. Costs `seeds` times the interpreting.
    #[must_use]
    pub fn with_sanitizer_seeds(mut self, seeds: u32) -> Self {
        self.dev.sanitizer.seeds = Some(seeds.max(1));
        self
    }

    /// Under the sanitizer, runs each kernel's text as `edit` rewrites it (given the kernel
    /// file's name and its composed text; `None` keeps it): for tests that plant a defect
    /// in a real kernel (a barrier removed) and expect the sanitizer to name it.
    #[doc(hidden)]
    #[must_use]
    pub fn with_sanitizer_edit(mut self, edit: crate::gpu::sanitizer::KernelEdit) -> Self {
        self.dev.sanitizer.edit = Some(edit);
        self
    }

    /// Whether (and at which subgroup width) dispatches run under the WGSL sanitizer.
    pub fn sanitizing(&self) -> Sanitize {
        self.dev.sanitize_setting()
    }

    /// What ran under the WGSL sanitizer on this context so far and what it found (one line
    /// as `Display`).
    pub fn sanitizer_summary(&self) -> SanitizerSummary {
        self.dev.sanitizer_summary()
    }

    /// Whether this context stands in for a GPU (see [`Context::with_stand_in`]).
    pub fn standing_in(&self) -> StandIn {
        self.dev.hardware().stand_in
    }

    /// The adapter's name, backend, device type and driver, as the kernels take them: under
    /// the GPU stand-in the type is `DiscreteGpu` and the name says `standing in for a GPU`,
    /// and, where the device grants less workgroup memory than the stand-in plans for, how
    /// much it pretends (`, pretending 48 KiB of workgroup memory (the device grants 32 KiB)`).
    pub fn adapter_info(&self) -> wgpu::AdapterInfo {
        self.dev.adapter_info()
    }

    /// The device's limits (the adapter's full limits unless the caller made the device).
    pub fn limits(&self) -> &wgpu::Limits {
        self.dev.limits()
    }

    /// The subgroup size kernels can be compiled for: `Some` when the device has
    /// `Features::SUBGROUP` and the adapter reports one fixed size (8 on lavapipe, 32 on
    /// NVIDIA), `None` otherwise (the subgroup kernels are then unavailable).
    pub fn subgroup_size(&self) -> Option<u32> {
        self.dev.subgroup_size()
    }

    /// Turns per-kernel timing on or off. While on, each forward pass leaves its kernels'
    /// times in [`Context::kernel_times`]: from timestamp queries on GPUs that have
    /// `Features::TIMESTAMP_QUERY`, else (and on CPU adapters such as lavapipe, whose
    /// timestamps do not bracket the work of a pass) by submitting each kernel on its own and
    /// timing it with the wall clock. Meant for benchmarks: it serializes the passes, and with
    /// several threads sharing the context, the times of one call may be another's.
    pub fn set_profiling(&self, on: bool) -> Profiling {
        self.dev.set_profiling(on)
    }

    /// Replaces the autotuner's cache (by default the one [`TuneCache::from_env`] names).
    pub fn with_tune_cache(mut self, cache: TuneCache) -> Self {
        self.dev.pipelines.keep_in(cache.dir());
        self.settings.tune = cache;
        self
    }

    /// Whether the device can run the f16 kernels (`Features::SHADER_F16`), or the error
    /// saying it cannot.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the adapter, the missing feature and the alternative.
    pub fn require_f16(&self) -> Result<()> {
        self.dev.require_f16()
    }

    /// Turns the autotuner's measuring on or off for this context (default: on unless
    /// `WGPU_ATTENTION_TUNE=off`). Off, remembered choices are still used and everything else
    /// takes its family's default variant.
    pub fn with_tuning(mut self, on: bool) -> Self {
        self.settings.tuning = on;
        self
    }

    /// Whether the autotuner may measure.
    pub fn tuning(&self) -> bool {
        self.settings.tuning
    }

    /// The autotuner's remembered choices (see [`TuneCache`]).
    pub fn tune_cache(&self) -> &TuneCache {
        &self.settings.tune
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

    /// The wgpu device, for callers who record their own work beside ours.
    pub fn device(&self) -> &wgpu::Device {
        self.dev.device()
    }

    /// The wgpu queue.
    pub fn queue(&self) -> &wgpu::Queue {
        self.dev.queue()
    }

    /// Creates every kernel with naga's runtime bounds checks on, including the kernels whose
    /// indices are proven in bounds and that otherwise run without them (those that say
    /// `runtime checks: off`): for testing them against their checked twins. Set it before
    /// the first call (compiled kernels are kept per context).
    pub fn with_runtime_checks(mut self, on: bool) -> Self {
        self.dev.runtime_checks = on;
        self
    }

    /// This context with the GPU family's fused kernel (`FlashVariant::Blocked`) running its
    /// inner loop as `options` say (double buffer, subgroup reductions, f16 arithmetic; each
    /// `None` is the adapter's default).
    pub fn with_blocked_options(mut self, options: BlockedOptions) -> Self {
        self.settings.blocked = options;
        self
    }

    /// The fused GPU kernel's inner-loop options ([`Context::with_blocked_options`]).
    pub fn blocked_options(&self) -> BlockedOptions {
        self.settings.blocked
    }

    /// Whether every kernel keeps naga's runtime checks ([`Context::with_runtime_checks`]).
    pub fn runtime_checks(&self) -> bool {
        self.dev.runtime_checks()
    }

    /// Waits until everything submitted to the device so far has run (as
    /// `torch.cuda.synchronize()`): for timing work whose results stay on the device.
    ///
    /// # Errors
    /// [`Error::Poll`] when the wait fails or times out, [`Error::DeviceLost`].
    pub fn synchronize(&self) -> Result<()> {
        self.dev.synchronize()
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
        self.dev.check_alive()
    }

    /// The cooperative-matrix configurations the adapter reports (empty without
    /// `Features::EXPERIMENTAL_COOPERATIVE_MATRIX` on the device).
    pub fn coop_properties(&self) -> Vec<wgpu::CooperativeMatrixProperties> {
        self.dev.coop_properties()
    }

    /// The shape the coop kernels run with here: `Some` when the device has
    /// `Features::EXPERIMENTAL_COOPERATIVE_MATRIX` and `Features::SUBGROUP` and the adapter
    /// reports one of the shapes they are built for ([`CoopShape`]).
    pub fn coop_shape(&self) -> Option<CoopShape> {
        self.dev.coop_shape()
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
