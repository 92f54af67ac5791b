//! What the kernels take an adapter for, decided once when its device opens and read by every
//! branch that differs between a GPU and a CPU adapter: the device type the planner, the tuner,
//! `flash_blocked`'s defaults, the key split, the decode kernel and the backward tiles look
//! at; the subgroup width the subgroup kernels are compiled for (and the widths
//! `flash_blocked`'s subgroup reductions may meet); the cooperative-matrix shape; the
//! workgroup memory a kernel may plan for; and which of these are emulated in WGSL.
//!
//! The GPU stand-in ([`StandIn::Gpu`], `WGPU_ATTENTION_STAND_IN=gpu`) is the one switch that
//! makes a CPU adapter (lavapipe in CI) take every decision a discrete GPU takes: device type
//! `DiscreteGpu`, 32-lane subgroups (emulated through workgroup memory, see
//! [`super::subgroups`]), cooperative matrices with f16 inputs (emulated, see
//! [`super::coop::emulate`], [`STAND_IN_COOP_SIDE`]) and 48 KiB of workgroup memory, as on an
//! NVIDIA H100. It is for
//! tests: it is slow, and its timings mean nothing.

use super::coop::{self, CoopShape};
use super::sanitizer::Sanitize;
use crate::error::{Error, Result};

/// llvmpipe's cap: the loop iterations one invocation runs over all its loops, past which it
/// silently stops them (see `src/kernels/loops.rs`).
pub(crate) const LLVMPIPE_LOOP_CAP: u64 = 65_535;

/// The cap a device takes: `WGPU_ATTENTION_LOOP_CAP` (`off`, or a number: a test hook that
/// lowers or lifts it on any adapter), else [`LLVMPIPE_LOOP_CAP`] on llvmpipe and none
/// elsewhere.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the variable for a value that is neither.
pub(crate) fn loop_cap(info: &wgpu::AdapterInfo) -> Result<Option<u64>> {
    match std::env::var("WGPU_ATTENTION_LOOP_CAP") {
        Ok(v) => parse_cap(&v),
        Err(_) => Ok(is_llvmpipe(info).then_some(LLVMPIPE_LOOP_CAP)),
    }
}

/// Whether the adapter is Mesa's llvmpipe (lavapipe under Vulkan, llvmpipe under GL).
pub(crate) fn is_llvmpipe(info: &wgpu::AdapterInfo) -> bool {
    let has = |s: &str| s.to_ascii_lowercase().contains("llvmpipe");
    has(&info.name) || has(&info.driver)
}

fn parse_cap(v: &str) -> Result<Option<u64>> {
    match v.trim() {
        "off" | "none" => Ok(None),
        n => n.parse::<u64>().map(Some).map_err(|_| {
            Error::invalid(
                "WGPU_ATTENTION_LOOP_CAP",
                format!("{n:?} is not a cap: give a number of iterations, or off"),
            )
        }),
    }
}

/// Whether a CPU adapter stands in for a GPU (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StandIn {
    /// The adapter is taken for what it is.
    #[default]
    Off,
    /// The adapter takes every decision a discrete GPU takes (subgroups of 32 lanes,
    /// cooperative matrices, 48 KiB of workgroup memory: `STAND_IN_SUBGROUP`,
    /// `STAND_IN_WORKGROUP_KIB`), emulating in WGSL what it lacks.
    Gpu,
    /// [`StandIn::Gpu`] with subgroups of this many lanes (16, 32 or 64: Intel's, NVIDIA's,
    /// AMD's wave64), `WGPU_ATTENTION_STAND_IN=gpu:64`.
    GpuSubgroups(u32),
}

/// The subgroup width the GPU stand-in emulates (NVIDIA's).
pub const STAND_IN_SUBGROUP: u32 = 32;
/// The workgroup memory the GPU stand-in plans for, KiB (an H100's under Vulkan).
pub const STAND_IN_WORKGROUP_KIB: u32 = 48;
/// The side of the cooperative matrices the GPU stand-in emulates (with f16 inputs) unless
/// `WGPU_ATTENTION_COOP_EMULATE` names one: 8, not the H100's 16, because LLVM takes minutes
/// to compile the 16 × 16 emulation of each coop kernel on lavapipe (8 × 8 takes seconds, and
/// runs the kernels' several rounds of blocks per subgroup, where 16 × 16 on 32 lanes runs
/// one).
pub const STAND_IN_COOP_SIDE: u32 = 8;
/// What the adapter line says after the adapter's name under the stand-in.
pub const STAND_IN_SUFFIX: &str = " standing in for a GPU";
/// What the adapter line says after the adapter's name under the WGSL sanitizer.
pub const SANITIZER_SUFFIX: &str = ", every dispatch run by the WGSL sanitizer as a GPU";
/// The side of the cooperative matrices under the sanitizer: an H100's 16 × 16 × 16.
pub const SANITIZER_COOP_SIDE: u32 = 16;

impl StandIn {
    /// The subgroup width it emulates (`None`: off).
    pub fn subgroup_width(self) -> Option<u32> {
        match self {
            StandIn::Off => None,
            StandIn::Gpu => Some(STAND_IN_SUBGROUP),
            StandIn::GpuSubgroups(n) => Some(n),
        }
    }

    /// `WGPU_ATTENTION_STAND_IN`: `gpu`, `gpu:N` (N = 16, 32 or 64 lanes), or `off` / `0` /
    /// empty / unset.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the variable for any other value.
    pub fn from_env() -> Result<Self> {
        match std::env::var("WGPU_ATTENTION_STAND_IN") {
            Err(_) => Ok(StandIn::Off),
            Ok(v) => v.parse(),
        }
    }
}

impl std::str::FromStr for StandIn {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "gpu" => Ok(StandIn::Gpu),
            "gpu:16" => Ok(StandIn::GpuSubgroups(16)),
            "gpu:32" => Ok(StandIn::GpuSubgroups(32)),
            "gpu:64" => Ok(StandIn::GpuSubgroups(64)),
            "" | "off" | "0" | "none" => Ok(StandIn::Off),
            other => Err(Error::invalid(
                "WGPU_ATTENTION_STAND_IN",
                format!("{other:?} is not a stand-in: use gpu, gpu:16, gpu:32, gpu:64 or off"),
            )),
        }
    }
}

/// Whether a device of this type computes in the host's memory, so that its buffers are the
/// process's memory: a CPU adapter (lavapipe, SwiftShader, WARP). Such a device is opened with
/// `MAPPABLE_PRIMARY_BUFFERS` where it has it. (Integrated GPUs share the host's memory too,
/// but their mappable memory types can be slower for the kernels: untried, so they keep the
/// staging path.)
pub(crate) fn unified(device_type: wgpu::DeviceType) -> bool {
    device_type == wgpu::DeviceType::Cpu
}

/// Whether the tuner offers the cooperative-matrix kernels at all (they run wherever a caller
/// forces them: `Kernels::Coop`, `MatmulVariant::Coop`, `FlashVariant::Coop`). Off until they
/// have passed `tools/gpu-check` on real tensor cores: on the H100 the coop matmul with f16
/// storage gave wrong answers (relative error 0.6-1.8 on every `[storage] f16` case it
/// computed), while the same kernel is right under the GPU stand-in's emulation and under the
/// WGSL sanitizer at 16 × 16; the lead is naga's SPIR-V, which declares the Vulkan memory
/// model for coop modules without marking any access non-private
/// (`tools/coop-memory-model/README.md`, with the test that decides it on a GPU).
pub const COOP_TUNED: bool = false;

/// What the crate decides for a device, each decision once, from the device's facts: every
/// branch that differs between a CPU adapter (lavapipe) and a GPU reads one of these and none
/// asks the device type itself. A real GPU, the GPU stand-in and the sanitizer's GPU take
/// [`Decisions::gpu`]; a CPU adapter takes [`Decisions::cpu`] (why, measured, is in each
/// field's doc). Part of [`Hardware`], made where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decisions {
    /// The subgroup family first among the kernel families `Kernels::Auto` tunes (the
    /// default when tuning is off): where storage memory is slow (a CPU adapter's
    /// workgroup memory is ordinary memory, its subgroup operations are SIMD lanes); the
    /// storage family first on GPUs.
    pub subgroup_family_first: bool,
    /// With subgroups, a call runs the three subgroup kernels (scores, softmax, weighted sum)
    /// unfused, the weights asked for or not: the same kernels either way, compiled once
    /// (lavapipe's subgroup matmul is its fastest path; on a GPU the fused kernels are).
    pub unfused_subgroup_plan: bool,
    /// The storage family's fused kernel is `flash_blocked` (its block shapes the tuner's
    /// candidates); else `flash_tiled`, whose one-row-per-thread loop suits a CPU adapter.
    pub flash_blocked: bool,
    /// The register-blocked matmul among the tuner's candidates (on a CPU adapter its extra
    /// work per workgroup-memory load buys nothing).
    pub matmul_blocked: bool,
    /// `flash_blocked`'s double buffering by default (on lavapipe the second buffer only
    /// costs: n 1,024, d 64, 16 % slower at 64 × 64 blocks, 5 % at 64 × 32,
    /// examples/blocked_bench.rs).
    pub double_buffer: bool,
    /// f16 operands multiplied in f16 by default (`BlockedOptions::f16_arithmetic`): a GPU's
    /// f16 rate; a CPU adapter converts each product and gains nothing.
    pub f16_products: bool,
    /// `KeySplit::Auto` splits the keys of a call with too few workgroups to fill a GPU's
    /// units (a CPU adapter runs workgroups on a few cores: a split only adds a pass).
    pub split_keys_to_fill: bool,
    /// The decoding step's partial kernel is `decode_partial_gpu` (a subgroup per key block);
    /// else `decode_partial`, one subgroup of threads a workgroup (lavapipe runs a workgroup's
    /// subgroups one after the other, so more threads only add merge rounds), with fewer,
    /// longer key blocks.
    pub decode_gpu_kernel: bool,
    /// The backward kernels' tiles for a GPU (`BackwardTiles::GPU`); else the CPU adapter's
    /// (64 keys or rows a thread, tiles of 32 rows: lavapipe runs a workgroup as a loop over
    /// 8-lane SIMD batches and registers are cheap).
    pub backward_gpu_tiles: bool,
    /// The tuner offers the cooperative-matrix kernels where the device has them
    /// ([`COOP_TUNED`]: off everywhere until they pass on real tensor cores).
    pub coop_tuned: bool,
    /// Benchmarks size their work for a GPU (`bench::fma_peak`: ~1 TFLOP), else for a CPU
    /// adapter (~2 GFLOP).
    pub gpu_sized_benchmarks: bool,
}

impl Decisions {
    /// What a GPU takes (a real one, the stand-in, the sanitizer's).
    pub(crate) const fn gpu() -> Decisions {
        Decisions {
            subgroup_family_first: false,
            unfused_subgroup_plan: false,
            flash_blocked: true,
            matmul_blocked: true,
            double_buffer: true,
            f16_products: true,
            split_keys_to_fill: true,
            decode_gpu_kernel: true,
            backward_gpu_tiles: true,
            coop_tuned: COOP_TUNED,
            gpu_sized_benchmarks: true,
        }
    }

    /// What a CPU adapter takes.
    pub(crate) const fn cpu() -> Decisions {
        Decisions {
            subgroup_family_first: true,
            unfused_subgroup_plan: true,
            flash_blocked: false,
            matmul_blocked: false,
            double_buffer: false,
            f16_products: false,
            split_keys_to_fill: false,
            decode_gpu_kernel: false,
            backward_gpu_tiles: false,
            coop_tuned: COOP_TUNED,
            gpu_sized_benchmarks: false,
        }
    }

    /// The decisions of a device of type `device_type`: [`Decisions::cpu`] for a CPU
    /// adapter, [`Decisions::gpu`] for any other.
    pub(crate) const fn of(device_type: wgpu::DeviceType) -> Decisions {
        match device_type {
            wgpu::DeviceType::Cpu => Decisions::cpu(),
            _ => Decisions::gpu(),
        }
    }
}

/// What is emulated in WGSL on a device: part of every pipeline's key, since it changes the
/// source built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct Emulation {
    /// The subgroup width emulated through workgroup memory (0: the hardware's subgroups).
    pub subgroup: u32,
    /// The cooperative matrices' side emulated in private arrays (0: the hardware's).
    pub coop: u32,
}

/// What the kernels take a device for (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hardware {
    /// The device type every GPU-or-CPU branch reads.
    pub device_type: wgpu::DeviceType,
    /// The subgroup size the subgroup kernels are compiled for (`None`: not fixed, or no
    /// subgroups).
    pub subgroup_size: Option<u32>,
    /// The smallest and largest subgroup a kernel may run in.
    pub subgroup_range: (u32, u32),
    /// The cooperative-matrix shape of the coop kernels, if any.
    pub coop: Option<CoopShape>,
    /// What runs emulated.
    pub emulate: Emulation,
    /// The workgroup memory kernels plan for, bytes.
    pub workgroup_storage: u32,
    /// The stand-in it is (`StandIn::Off`: the adapter as it is).
    pub stand_in: StandIn,
    /// Device memory is host memory (a CPU adapter: see [`unified`]) and the device maps
    /// its storage buffers (`MAPPABLE_PRIMARY_BUFFERS`): uploads are written straight into
    /// the operands' buffers and results read straight out of theirs, with no staging
    /// buffer (which there would be one more copy of the data in the process's memory). Off
    /// under the stand-in (a discrete GPU's path, staging included).
    pub unified_memory: bool,
    /// The loop iterations one invocation may run before the driver silently stops its
    /// loops (`Some(65_535)` on llvmpipe, under the stand-in too: see
    /// `src/kernels/loops.rs`, [`loop_cap`]).
    pub loop_cap: Option<u64>,
    /// The subgroup width every dispatch runs at under the WGSL sanitizer (`None`: the
    /// adapter runs them; see [`super::sanitizer`]).
    pub sanitize: Option<u32>,
    /// What the crate decides for it (from the device type it takes).
    pub decide: Decisions,
    /// The adapter's timestamps bracket a pass's work: a real GPU's do; a CPU adapter's
    /// (lavapipe's, under the stand-in too: it changes what runs, not how it is timed) do
    /// not, so per-kernel times there come from the wall clock of each kernel alone.
    pub timestamps_bracket_work: bool,
}

impl Hardware {
    /// The adapter as it is: its device type and subgroup sizes, the cooperative-matrix shape
    /// it offers (or `WGPU_ATTENTION_COOP_EMULATE`'s, the coop kernels' test hook), and its
    /// workgroup memory; then `stand_in` on top, or, under the sanitizer, the GPU that
    /// `sanitize` stands for (which takes precedence).
    pub(crate) fn of(
        adapter: &wgpu::Adapter,
        device: &wgpu::Device,
        stand_in: StandIn,
        sanitize: Sanitize,
    ) -> Hardware {
        let info = adapter.get_info();
        let features = device.features();
        let subgroups = features.contains(wgpu::Features::SUBGROUP);
        let f16 = features.contains(wgpu::Features::SHADER_F16);
        // Subgroup kernels are compiled for one size, so they need it fixed and known.
        let subgroup_size = (subgroups && info.subgroup_min_size == info.subgroup_max_size)
            .then_some(info.subgroup_min_size);
        let mut emulate = Emulation::default();
        let coop = match (subgroups, coop::emulate::size()) {
            (false, _) => None,
            (true, Some(size)) => {
                emulate.coop = size;
                Some(CoopShape {
                    size,
                    f16_inputs: f16,
                })
            }
            (true, None) => {
                let props = match features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
                {
                    true => adapter.cooperative_matrix_properties(),
                    false => Vec::new(),
                };
                coop::pick(&props, f16)
            }
        };
        let hw = Hardware {
            device_type: info.device_type,
            subgroup_size,
            subgroup_range: (info.subgroup_min_size, info.subgroup_max_size),
            coop,
            emulate,
            workgroup_storage: device.limits().max_compute_workgroup_storage_size,
            stand_in: StandIn::Off,
            unified_memory: unified(info.device_type)
                && features.contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS),
            loop_cap: loop_cap(&info).unwrap_or_else(|err| {
                log::warn!("{err}; taking the adapter's own cap");
                is_llvmpipe(&info).then_some(LLVMPIPE_LOOP_CAP)
            }),
            sanitize: None,
            decide: Decisions::of(info.device_type),
            timestamps_bracket_work: info.device_type != wgpu::DeviceType::Cpu,
        };
        if let Some(sg) = sanitize.lanes() {
            return hw.sanitized(sg, f16);
        }
        match stand_in.subgroup_width() {
            None => hw,
            Some(sg) => hw.standing_in_for_gpu((stand_in, sg), subgroups, f16),
        }
    }

    /// This device taking a discrete GPU's decisions, its subgroups emulated `sg` lanes wide
    /// and its cooperative matrices emulated. Without subgroups (the emulation's barriers
    /// need nothing, but the kernels' subgroup builtins need the feature to validate) the
    /// subgroup and coop kernels stay off.
    fn standing_in_for_gpu(
        self,
        (stand_in, sg): (StandIn, u32),
        subgroups: bool,
        f16: bool,
    ) -> Hardware {
        let mut emulate = self.emulate;
        if subgroups {
            emulate.subgroup = sg;
        }
        let coop = match subgroups {
            true => {
                let size = coop::emulate::size().unwrap_or(STAND_IN_COOP_SIDE);
                emulate.coop = size;
                Some(CoopShape {
                    size,
                    f16_inputs: f16,
                })
            }
            false => None,
        };
        Hardware {
            device_type: wgpu::DeviceType::DiscreteGpu,
            subgroup_size: subgroups.then_some(sg),
            subgroup_range: (sg, sg),
            coop,
            emulate,
            workgroup_storage: STAND_IN_WORKGROUP_KIB << 10,
            stand_in,
            unified_memory: false,
            loop_cap: self.loop_cap,
            sanitize: None,
            decide: Decisions::gpu(),
            timestamps_bracket_work: self.timestamps_bracket_work,
        }
    }

    /// The GPU the WGSL sanitizer runs every dispatch as (see [`super::sanitizer`]): a
    /// discrete GPU's decisions, native subgroups of `sg` lanes, cooperative matrices of
    /// 16 × 16 (or `WGPU_ATTENTION_COOP_EMULATE`'s side) with f16 inputs where the device has
    /// f16, 48 KiB of workgroup memory, nothing emulated and no loop cap (the adapter runs no
    /// kernel).
    fn sanitized(self, sg: u32, f16: bool) -> Hardware {
        Hardware {
            device_type: wgpu::DeviceType::DiscreteGpu,
            subgroup_size: Some(sg),
            subgroup_range: (sg, sg),
            coop: Some(CoopShape {
                size: coop::emulate::size().unwrap_or(SANITIZER_COOP_SIDE),
                f16_inputs: f16,
            }),
            emulate: Emulation::default(),
            workgroup_storage: STAND_IN_WORKGROUP_KIB << 10,
            stand_in: StandIn::Off,
            unified_memory: false,
            loop_cap: None,
            sanitize: Some(sg),
            decide: Decisions::gpu(),
            timestamps_bracket_work: self.timestamps_bracket_work,
        }
    }

    /// What follows the adapter's name in its lines: empty, or under the stand-in
    /// `standing in for a GPU` and the subgroup width (which also keeps the tuning cache's
    /// choices of each width apart).
    pub(crate) fn name_suffix(&self) -> String {
        if let Some(sg) = self.sanitize {
            return format!("{SANITIZER_SUFFIX} ({sg}-lane subgroups)");
        }
        match (self.is_stand_in(), self.subgroup_size) {
            (false, _) => String::new(),
            (true, Some(w)) => format!("{STAND_IN_SUFFIX} ({w}-lane subgroups)"),
            (true, None) => STAND_IN_SUFFIX.to_string(),
        }
    }

    /// Whether this is a GPU stand-in.
    pub(crate) fn is_stand_in(&self) -> bool {
        self.stand_in != StandIn::Off
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loop_cap_variable_takes_off_or_a_number() {
        assert_eq!(parse_cap("off").unwrap(), None);
        assert_eq!(parse_cap(" 100 ").unwrap(), Some(100));
        assert!(parse_cap("lots").is_err());
    }

    use crate::Context;

    /// The adapter at hand takes its own type's decisions; the stand-in and the sanitizer's
    /// device, a GPU's, whatever the adapter; a dry-run CPU device, a CPU adapter's.
    #[test]
    fn each_profile_is_one_value_of_the_decisions() {
        let ctx = crate::context::test_context();
        let own = Decisions::of(ctx.adapter_info().device_type);
        assert_eq!(ctx.hardware().decide, own);
        let stand_in = Context::new().unwrap().with_stand_in(StandIn::Gpu);
        assert_eq!(stand_in.hardware().decide, Decisions::gpu());
        let sanitized = Context::new().unwrap().with_sanitizer(Sanitize::Lanes(32));
        assert_eq!(sanitized.hardware().decide, Decisions::gpu());
        let cpu = crate::gpu::device::Gpu::dry_run(&crate::gpu::device::DryRun {
            limits: wgpu::Limits::default(),
            device_type: wgpu::DeviceType::Cpu,
            subgroups: (8, 8),
            coop: None,
        })
        .unwrap();
        assert_eq!(cpu.hardware().decide, Decisions::cpu());
        assert_ne!(Decisions::cpu(), Decisions::gpu());
    }
}
