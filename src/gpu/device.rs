//! The device layer's core: an open wgpu device with its queue and limits, the error scopes
//! every call runs in, the buffer pool, the pipeline cache, the profiling state and the phase
//! clock, created once and shared. Kernels take a `&Gpu`; the user's [`crate::Context`] is
//! a `Gpu` and the settings it carries (it dereferences to its device).

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};

use super::coop;
use super::hardware::{Hardware, StandIn};
use super::pipeline::PipelineCache;
use super::pool::Pool;
use super::sanitizer::{Sanitize, Sanitizer};
use super::timing::{Profiling, Timing};
use crate::error::{Error, Result};
use crate::phases::{Phase, Phases};

/// An open device: the adapter, its device (a `wgpu::Device`) and queue, the compiled kernels
/// and the buffers kept for reuse. Unnamed outside the crate (a [`crate::Context`]
/// dereferences to it).
pub struct Gpu {
    pub(crate) adapter: wgpu::Adapter,
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) limits: wgpu::Limits,
    pub(crate) pipelines: PipelineCache,
    pub(crate) pool: Pool,
    pub(crate) timing: Timing,
    pub(crate) phases: Phases,
    /// Whether every kernel keeps naga's runtime checks (see
    /// [`crate::Context::with_runtime_checks`]).
    pub(crate) runtime_checks: bool,
    stand_in: OnceLock<wgpu::Buffer>,
    memo: Mutex<Vec<Memo>>,
    unused_out: OnceLock<[wgpu::Buffer; 2]>,
    one: OnceLock<wgpu::Buffer>,
    lost: Arc<Mutex<Option<String>>>,
    /// What the kernels take this device for: every GPU-or-CPU branch reads this (see
    /// [`Hardware`]).
    hardware: Hardware,
    /// Unique in the process: what a resource made on this device is checked against.
    id: u64,
    /// The WGSL sanitizer's parsed kernels and tally (used while [`Hardware::sanitize`]).
    pub(crate) sanitizer: Sanitizer,
}

/// What follows the adapter's name (and the stand-in's words) in its lines when the kernels
/// plan for more than the device grants: empty, or under the GPU stand-in on lavapipe
/// `, pretending 48 KiB of workgroup memory (the device grants 32 KiB)`. The stand-in plans
/// for an H100's 48 KiB so that lavapipe runs the kernels sized for it (`flash_blocked`
/// widens its chunks with the memory); lavapipe runs them, but its device reports 32 KiB, and
/// the Vulkan validation layers say so (`VUID-RuntimeSpirv-Workgroup-06530`; docs/testing.md,
/// "Validation layers").
fn pretended(planned: &wgpu::Limits, granted: &wgpu::Limits) -> String {
    let (plan, grant) = (
        planned.max_compute_workgroup_storage_size,
        granted.max_compute_workgroup_storage_size,
    );
    match plan > grant {
        true => format!(
            ", pretending {} KiB of workgroup memory (the device grants {} KiB)",
            plan >> 10,
            grant >> 10
        ),
        false => String::new(),
    }
}

/// How many values [`Gpu::memo`] keeps.
pub(crate) const MEMO_CAPACITY: usize = 8;

/// A value [`Gpu::memo`] keeps: shared between threads where wgpu's resources are.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) trait MemoValue: std::any::Any + Send + Sync {}
#[cfg(not(target_arch = "wasm32"))]
impl<T: std::any::Any + Send + Sync> MemoValue for T {}
/// A value [`Gpu::memo`] keeps (the browser's wgpu resources are not `Send`).
#[cfg(target_arch = "wasm32")]
pub(crate) trait MemoValue: std::any::Any {}
#[cfg(target_arch = "wasm32")]
impl<T: std::any::Any> MemoValue for T {}

/// A kept value: an `Arc<T>`, boxed as `Any` (found again by `downcast_ref`).
#[cfg(not(target_arch = "wasm32"))]
type Memo = (
    (std::any::TypeId, u64),
    Box<dyn std::any::Any + Send + Sync>,
);
#[cfg(target_arch = "wasm32")]
type Memo = ((std::any::TypeId, u64), Box<dyn std::any::Any>);

/// What a dry-run device ([`Gpu::dry_run`]) stands for.
#[derive(Debug, Clone)]
pub(crate) struct DryRun {
    /// Its limits.
    pub limits: wgpu::Limits,
    /// Its type (a GPU's kernels differ from a CPU adapter's).
    pub device_type: wgpu::DeviceType,
    /// The smallest and largest subgroup it may run (equal: a fixed size, which the subgroup
    /// kernels need).
    pub subgroups: (u32, u32),
    /// Its cooperative-matrix shape, if any.
    pub coop: Option<coop::CoopShape>,
}

impl Gpu {
    /// Opens a device on `adapter` with the adapter's full limits and the optional features
    /// the kernels use where it has them (subgroups, timestamp queries, f16, the pipeline
    /// cache, cooperative matrices).
    ///
    /// # Errors
    /// [`Error::RequestDevice`] when the adapter refuses.
    pub(crate) async fn from_adapter_async(adapter: wgpu::Adapter) -> Result<Self> {
        let start = crate::phases::Instant::now();
        let limits = adapter.limits();
        let wanted = wgpu::Features::SUBGROUP
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::SHADER_F16
            | wgpu::Features::PIPELINE_CACHE;
        // Unified memory (see Hardware): the operands' own buffers are mapped, no staging;
        // and the allocator's blocks kept small, so that memory a call freed goes back to
        // the process (its blocks are the process's memory there) rather than staying in a
        // 64-256 MiB block until the next call.
        let unified = super::hardware::unified(adapter.get_info().device_type);
        let (wanted, memory_hints) = match unified {
            true => (
                wanted | wgpu::Features::MAPPABLE_PRIMARY_BUFFERS,
                wgpu::MemoryHints::MemoryUsage,
            ),
            false => (wanted, wgpu::MemoryHints::Performance),
        };
        let (coop, experimental_features) = coop::request(&adapter);
        let desc = wgpu::DeviceDescriptor {
            label: Some("wgpu-attention"),
            required_features: (adapter.features() & wanted) | coop,
            required_limits: limits.clone(),
            experimental_features,
            memory_hints,
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
        let dev = Self::from_parts(adapter, device, queue);
        dev.phases.add(Phase::Adapter, start.elapsed());
        Ok(dev)
    }

    /// Wraps a device the caller already owns (its limits are taken from the device).
    pub(crate) fn from_parts(
        adapter: wgpu::Adapter,
        device: wgpu::Device,
        queue: wgpu::Queue,
    ) -> Self {
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
        let stand_in = StandIn::from_env().unwrap_or_else(|e| {
            log::warn!("{e}; the stand-in stays off");
            StandIn::Off
        });
        let sanitize = Sanitize::from_env().unwrap_or_else(|e| {
            log::warn!("{e}; the sanitizer stays off");
            Sanitize::Off
        });
        let hardware = Hardware::of(&adapter, &device, stand_in, sanitize);
        let mut limits = device.limits();
        limits.max_compute_workgroup_storage_size = hardware.workgroup_storage;
        let info = adapter.get_info();
        log::info!(
            "adapter: {}{}{} ({:?}, {:?}, driver {} {}); subgroup size {}; features {:?}",
            info.name,
            hardware.name_suffix(),
            pretended(&limits, &device.limits()),
            info.backend,
            hardware.device_type,
            info.driver,
            info.driver_info,
            hardware
                .subgroup_size
                .map_or("not fixed/none".to_string(), |s| s.to_string()),
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
            pool: Pool::default(),
            runtime_checks: false,
            stand_in: OnceLock::new(),
            memo: Mutex::default(),
            unused_out: OnceLock::new(),
            one: OnceLock::new(),
            lost,
            hardware,
            timing: Timing::default(),
            phases: Phases::default(),
            sanitizer: Sanitizer::default(),
        }
    }

    /// A device on wgpu's noop backend that stands for `what` (with subgroups and f16): it
    /// runs nothing, so it is only for dry runs (`kernels::collect_keys`): which
    /// pipelines the kernels build on such a device, without one at hand.
    ///
    /// # Errors
    /// [`Error::NoAdapter`] without the noop backend (the browser), [`Error::RequestDevice`].
    pub(crate) fn dry_run(what: &DryRun) -> Result<Self> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = wgpu::Backends::NOOP;
        desc.backend_options.noop = wgpu::NoopBackendOptions {
            enable: true,
            limits: Some(what.limits.clone()),
            features: Some(wgpu::Features::SUBGROUP | wgpu::Features::SHADER_F16),
            device_type: Some(what.device_type),
            subgroup_min_size: Some(what.subgroups.0),
            subgroup_max_size: Some(what.subgroups.1),
        };
        let instance = wgpu::Instance::new(desc);
        super::oneshot::block_on(async {
            let adapter = instance
                .enumerate_adapters(wgpu::Backends::NOOP)
                .await
                .into_iter()
                .next()
                .ok_or_else(|| Error::NoAdapter {
                    wanted: "wgpu's noop backend (a dry run)".into(),
                    hint: "dry runs need a native build".into(),
                })?;
            let mut dev = Self::from_adapter_async(adapter).await?;
            // wgpu 30's noop adapter reports a CPU whatever it is given, and no
            // cooperative matrices; a dry run emulates nothing.
            dev.hardware.device_type = what.device_type;
            dev.hardware.decide = super::hardware::Decisions::of(what.device_type);
            dev.hardware.coop = what.coop;
            dev.hardware.emulate = Default::default();
            dev.hardware.stand_in = StandIn::Off;
            dev.hardware.sanitize = None;
            dev.hardware.subgroup_range = what.subgroups;
            dev.hardware.subgroup_size =
                (what.subgroups.0 == what.subgroups.1).then_some(what.subgroups.0);
            dev.hardware.workgroup_storage = what.limits.max_compute_workgroup_storage_size;
            dev.limits.max_compute_workgroup_storage_size = dev.hardware.workgroup_storage;
            Ok(dev)
        })
    }

    /// The adapter's name, backend, device type and driver as the kernels take them: the
    /// device type is [`Hardware`]'s (a dry run's, or a GPU's under the stand-in, whose name
    /// then ends in `standing in for a GPU`, so every adapter line says so and the tuning
    /// cache keeps its choices apart).
    pub(crate) fn adapter_info(&self) -> wgpu::AdapterInfo {
        let mut info = self.adapter.get_info();
        info.device_type = self.hardware.device_type;
        info.name.push_str(&self.hardware.name_suffix());
        info.name
            .push_str(&pretended(&self.limits, &self.device.limits()));
        info
    }

    /// What the kernels take this device for.
    pub(crate) fn hardware(&self) -> &Hardware {
        &self.hardware
    }

    /// Turns the GPU stand-in on or off (see [`StandIn`]); the device's limits follow.
    pub(crate) fn set_stand_in(&mut self, stand_in: StandIn) {
        if self.hardware.stand_in == stand_in {
            return;
        }
        let sanitize = self.sanitize_setting();
        self.hardware = Hardware::of(&self.adapter, &self.device, stand_in, sanitize);
        self.limits.max_compute_workgroup_storage_size = self.hardware.workgroup_storage;
    }

    /// Turns the WGSL sanitizer on (at a subgroup width) or off (see
    /// [`super::sanitizer`]); the device's limits follow. Under it the stand-in is off.
    pub(crate) fn set_sanitize(&mut self, sanitize: Sanitize) {
        if self.sanitize_setting() == sanitize {
            return;
        }
        let stand_in = self.hardware.stand_in;
        self.hardware = Hardware::of(&self.adapter, &self.device, stand_in, sanitize);
        self.limits.max_compute_workgroup_storage_size = self.hardware.workgroup_storage;
    }

    /// The sanitizer's setting.
    pub(crate) fn sanitize_setting(&self) -> Sanitize {
        self.hardware
            .sanitize
            .map_or(Sanitize::Off, Sanitize::Lanes)
    }

    /// The adapter's name for messages; the browser gives none, so there it is its backend.
    pub(crate) fn adapter_name(&self) -> String {
        let info = self.adapter.get_info();
        if info.name.is_empty() {
            format!("{:?} adapter", info.backend)
        } else {
            info.name
        }
    }

    /// The device's limits.
    pub(crate) fn limits(&self) -> &wgpu::Limits {
        &self.limits
    }

    /// The subgroup size kernels can be compiled for (see [`crate::Context::subgroup_size`]).
    pub(crate) fn subgroup_size(&self) -> Option<u32> {
        self.hardware.subgroup_size
    }

    /// The wgpu device.
    pub(crate) fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// The wgpu queue.
    pub(crate) fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    /// Whether every kernel keeps naga's runtime checks.
    pub(crate) fn runtime_checks(&self) -> bool {
        self.runtime_checks
    }

    /// This device's id, unique in the process.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Turns per-kernel timing on or off (see [`crate::Context::set_profiling`]).
    pub(crate) fn set_profiling(&self, on: bool) -> Profiling {
        let timestamps = self
            .device
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY)
            && self.hardware.timestamps_bracket_work;
        self.timing.set(on, timestamps)
    }

    /// What the layers above keep per device under a key of theirs (a call's modifiers on
    /// the device, with their block maps): the value stored under `key` for which `same`
    /// holds, or `make`'s, stored (the oldest of [`MEMO_CAPACITY`] goes). The key only finds
    /// candidates: `same` decides, so two values whose keys collide are each their own.
    ///
    /// # Errors
    /// `make`'s.
    pub(crate) fn memo<T: MemoValue>(
        &self,
        key: u64,
        same: impl Fn(&T) -> bool,
        make: impl FnOnce() -> Result<T>,
    ) -> Result<Arc<T>> {
        let id = (std::any::TypeId::of::<T>(), key);
        let found = self
            .memo
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|m| m.0 == id)
            .filter_map(|m| m.1.downcast_ref::<Arc<T>>())
            .find(|v| same(v))
            .cloned();
        if let Some(v) = found {
            return Ok(v);
        }
        // Made without the lock held: `make` may use the device.
        let v = Arc::new(make()?);
        let mut memo = self.memo.lock().unwrap_or_else(|e| e.into_inner());
        if memo.len() >= MEMO_CAPACITY {
            memo.remove(0);
        }
        memo.push((id, Box::new(v.clone())));
        Ok(v)
    }

    /// A small zeroed storage buffer (one vec4) bound wherever a kernel's binding has nothing
    /// to read: a matmul without a bias, a row statistic that is not used. Made once per
    /// device; kernels only read it.
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
    /// split-output matmul that does not split). Made once per device.
    pub(crate) fn unused_outs(&self) -> (&wgpu::Buffer, &wgpu::Buffer) {
        let [a, b] = self.unused_out.get_or_init(|| {
            [0, 1].map(|_| {
                self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("unused output"),
                    size: 16,
                    // Copies: the WGSL sanitizer reads every bound buffer back.
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
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
        let b = super::buffer::upload(self, "one", &[1.0])?;
        Ok(self.one.get_or_init(|| b))
    }

    /// Whether the device can run the f16 kernels (`Features::SHADER_F16`), or the error
    /// saying it cannot.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the adapter, the missing feature and the alternative.
    pub(crate) fn require_f16(&self) -> Result<()> {
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
        self.hardware
            .subgroup_size
            .ok_or_else(|| Error::Unsupported {
                feature: "the subgroup kernels (wgpu::Features::SUBGROUP with one fixed subgroup \
                      size)"
                    .into(),
                adapter: self.adapter_name(),
                hint: "use Kernels::Storage or Kernels::Auto (CLI --kernels storage or auto)"
                    .into(),
            })
    }

    /// Waits until everything submitted to the device so far has run.
    ///
    /// # Errors
    /// [`Error::Poll`] when the wait fails or times out, [`Error::DeviceLost`].
    pub(crate) fn synchronize(&self) -> Result<()> {
        super::readback::wait_all(self)
    }

    /// `Err(DeviceLost)` once the device has been lost; a lost device stays unusable.
    ///
    /// # Errors
    /// [`Error::DeviceLost`] with the driver's reason.
    pub(crate) fn check_alive(&self) -> Result<()> {
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
        super::oneshot::block_on(self.scoped_async(async { f() }))
    }

    /// [`Gpu::scoped`] around a future (the async core's calls).
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
