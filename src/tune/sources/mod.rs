//! The fully specialised WGSL of every kernel variant either profile may run (a GPU's tuner's
//! picks, lavapipe's, the subgroup family's, the GPU stand-in's emulated sources), as the
//! pipeline cache hands it to wgpu, written to `DIR/<family>/<variant>.wgsl` for offline
//! compiler checks (`wgpu-attention shaders --out DIR`, then a real GPU compiler on the GPU
//! families, `.ci/gpu-shader-stats`, and Tint and naga's MSL/HLSL back ends on all,
//! `static_gates_ci` in `.ci/run`).

use std::path::{Path, PathBuf};

use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::gpu::coop::CoopShape;
use crate::gpu::device::{DryRun, Gpu};
use crate::kernels::decode_combine::{self, CombineConsts};
use crate::kernels::decode_partial_gpu::{self, GpuPartialConsts};
use crate::kernels::flash::{self, FlashVariant, FusedIo};
use crate::kernels::flash_backward_dot::BackwardTiles;
use crate::kernels::flash_blocked::BlockedOptions;
use crate::kernels::flash_combine::KeySplit;
use crate::kernels::flash_tiled::{Flash, FlashOut};
use crate::kernels::matmul::{F16_A, F16_B, F16_C};
use crate::kernels::matmul_blocked::{self, MatmulBlockedConsts};
use crate::kernels::softmax::SoftmaxConsts;
use crate::kernels::swap_heads;
use crate::kernels::wgsl::NoConstants;
use crate::kernels::{collect_keys, flash_backward_dot, flash_backward_kv, flash_backward_q};
use crate::kernels::{matmul, softmax, weighted_sum, KernelId, MaskArg, PipelineKey, Strides};
use crate::variant::Kernels;

mod profiles;
pub(crate) use profiles::SUBGROUP_WIDTHS;
use profiles::{cpu, cpu_only, shared, stand_in, subgroup_unfused, UNFUSED_WIDTHS};

/// Per-head sizes written (d_k = d_v).
pub(crate) const HEAD_SIZES: [usize; 6] = [32, 64, 80, 96, 128, 256];

/// The workgroup memory of desktop GPUs, in KiB: Apple's 32, NVIDIA's 48 under Vulkan, AMD's
/// and Intel's 64. `flash_blocked` widens its chunks with the memory, so each is a variant.
pub(crate) const GPU_WORKGROUP_KIB: [u32; 3] = [32, 48, 64];

/// The limits the storage family's variants are chosen under when no GPU is at hand: 32 KiB
/// of workgroup memory (the least of [`GPU_WORKGROUP_KIB`]) and 256 threads.
#[cfg(test)]
pub(crate) fn gpu_limits() -> wgpu::Limits {
    gpu_limits_with(32)
}

/// `gpu_limits` with `kib` KiB of workgroup memory.
fn gpu_limits_with(kib: u32) -> wgpu::Limits {
    wgpu::Limits {
        max_compute_workgroup_storage_size: kib << 10,
        max_compute_invocations_per_workgroup: 256,
        max_compute_workgroup_size_x: 256,
        ..wgpu::Limits::default()
    }
}

/// A single-head problem of per-head size `d`, f16 or not, no mask.
fn problem(d: usize, f16: bool) -> Flash {
    let s = Strides::row_major(d as u32, 0, 0);
    Flash {
        batch: 1,
        heads: 1,
        n_q: 1,
        n_kv: 1,
        dk_h: d,
        dv_h: d,
        q: s,
        k: s,
        v: s,
        o: s,
        causal: false,
        scale: 1.0,
        kv_ratio: 1,
        f16,
        key_split: KeySplit::Off,
        skip_zero: false,
    }
}

/// The cooperative-matrix shape the coop variants are written for (NVIDIA, AMD RDNA3, Intel).
const COOP_SHAPE: CoopShape = CoopShape {
    size: 16,
    f16_inputs: true,
};

/// A dry-run device standing for a GPU with `kib` KiB of workgroup memory and 256 threads:
/// subgroups of 16 to 64 lanes (no fixed size, so the subgroup kernels are not its; wide
/// enough for `flash_blocked`'s subgroup reductions) and tensor cores of [`COOP_SHAPE`].
fn gpu(kib: u32) -> Result<Gpu> {
    Gpu::dry_run(&DryRun {
        limits: gpu_limits_with(kib),
        device_type: wgpu::DeviceType::DiscreteGpu,
        subgroups: (16, 64),
        coop: Some(COOP_SHAPE),
    })
}

/// A dry-run device standing for a GPU with cooperative matrices whose subgroups have `sg`
/// lanes, with the least workgroup memory of [`GPU_WORKGROUP_KIB`]: `flash_coop`'s query
/// block is one row block a subgroup, so the width the host plans for sets it.
fn coop_gpu(sg: u32) -> Result<Gpu> {
    Gpu::dry_run(&DryRun {
        limits: gpu_limits_with(GPU_WORKGROUP_KIB[0]),
        device_type: wgpu::DeviceType::DiscreteGpu,
        subgroups: (sg, sg),
        coop: Some(COOP_SHAPE),
    })
}

/// A dry-run device standing for a GPU whose subgroups have `sg` lanes (the subgroup
/// kernels' variants), with the least workgroup memory of [`GPU_WORKGROUP_KIB`].
fn subgroup_gpu(sg: u32) -> Result<Gpu> {
    Gpu::dry_run(&DryRun {
        limits: gpu_limits_with(GPU_WORKGROUP_KIB[0]),
        device_type: wgpu::DeviceType::DiscreteGpu,
        subgroups: (sg, sg),
        coop: None,
    })
}

/// `flash_blocked`'s plain inner loop: no double buffer, no subgroup reductions, f32
/// arithmetic (the variants with them are [`blocked_inner`]'s); vector loads where the
/// layout allows, as every adapter reads them.
const PLAIN: BlockedOptions = BlockedOptions {
    vector_loads: None,
    ..BlockedOptions::plain()
};

/// [`PLAIN`] with scalar loads (what head sizes that are not multiples of 4 run).
const SCALAR: BlockedOptions = BlockedOptions::plain();

/// What a recording reads and writes: stand-in buffers on a dry-run device.
struct Bindings {
    q: wgpu::Buffer,
    kv: wgpu::Buffer,
    out: wgpu::Buffer,
    lse: wgpu::Buffer,
    mask: wgpu::Buffer,
}

impl Bindings {
    fn new(dev: &Gpu) -> Self {
        let buffer = |label| {
            dev.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: 16,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            })
        };
        Bindings {
            q: buffer("Q"),
            kv: buffer("K = V"),
            out: buffer("O"),
            lse: buffer("lse"),
            mask: buffer("mask"),
        }
    }
}

/// The pipelines the dispatcher records for `variant` of `op` on the dry-run device `dev`,
/// `flash_blocked` with `opts`, with a mask bound when `mask` and the row statistics saved
/// when `lse`: what a GPU like `dev` would build ([`collect_keys`]).
///
/// # Errors
/// As the variant's kernel: the variant does not fit `dev`.
fn recorded(
    dev: &Gpu,
    op: &Flash,
    variant: FlashVariant,
    opts: BlockedOptions,
    (mask, lse): (bool, bool),
) -> Result<Vec<PipelineKey>> {
    let b = Bindings::new(dev);
    collect_keys(|| {
        let mut encoder = dev
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
        let io = FusedIo {
            q: &b.q,
            k: &b.kv,
            v: &b.kv,
            out: FlashOut {
                context: &b.out,
                lse: lse.then_some(&b.lse),
            },
            mask: mask.then_some(MaskArg {
                buffer: Some(&b.mask),
                strides: [0; 4],
                mods: None,
            }),
            host: None,
        };
        flash::record(dev, &mut encoder, op, variant, opts, io).map(|_| ())
    })
}

/// The pipeline of kernel `kernel` among `keys` (a recording may also pack operands, or
/// combine a key split).
///
/// # Errors
/// An internal error when the recording did not build it.
fn built(keys: &[PipelineKey], kernel: KernelId) -> Result<PipelineKey> {
    keys.iter()
        .copied()
        .find(|k| k.kernel == kernel)
        .ok_or_else(|| {
            Error::invalid(
                "shaders",
                format!("internal: the dry run built no {}", kernel.file()),
            )
        })
}

/// The pipeline `variant` of `op` builds with its own kernel on `dev` (see [`recorded`]).
///
/// # Errors
/// As [`recorded`].
fn fused_key(
    dev: &Gpu,
    op: &Flash,
    variant: FlashVariant,
    opts: BlockedOptions,
    mask: bool,
) -> Result<PipelineKey> {
    let keys = recorded(dev, op, variant, opts, (mask, false))?;
    built(&keys, flash::kernel_of(variant).kernel())
}

/// The file stem of `variant` at per-head size `d`.
fn file_name(variant: FlashVariant, d: usize, f16: bool) -> String {
    let v = match variant {
        FlashVariant::Tiled { keys } => format!("flash-tiled-bk{keys}"),
        FlashVariant::Blocked { rows, keys } => format!("flash-blocked-{rows}x{keys}"),
        FlashVariant::Subgroup { rows_per_lane } => format!("flash-subgroup-r{rows_per_lane}"),
        FlashVariant::Coop => "flash-coop-16".to_string(),
    };
    format!("{v}-d{d}-{}", if f16 { "f16" } else { "f32" })
}

/// The storage family's unfused kernels as a GPU runs them (the weights path, the
/// projections): file stem and pipeline key. `matmul` with the element types the crate
/// uses (f32; f16 Q and K for the scores; f16 weights for the output projection; f16
/// everything for the input projections), `softmax` with and without a mask, and
/// `weighted_sum` with f32 and f16 V.
fn unfused() -> Vec<(String, PipelineKey)> {
    let mut v = Vec::new();
    for (name, bits) in [
        ("f32", 0),
        ("f16-ab", F16_A | F16_B),
        ("f16-b", F16_B),
        ("f16-abc", F16_A | F16_B | F16_C),
    ] {
        let key = PipelineKey::of::<matmul::Shader>(&NoConstants, bits);
        v.push((format!("matmul-{name}"), key));
        // The register-blocked matmul, 4 × 4 and 8 × 8 per thread, B read along its columns
        // (the projections) or along the inner dimension (Kᵀ for the scores).
        for tb in matmul_blocked::BLOCKS {
            for (layout, kmajor) in [("", false), ("-bt", true)] {
                let c = MatmulBlockedConsts::new(tb, kmajor);
                let key = PipelineKey::of::<matmul_blocked::Shader>(&c, bits);
                let side = 4 * tb;
                v.push((format!("matmul-blocked-{side}x{side}{layout}-{name}"), key));
            }
        }
    }
    for mask in [0, 1] {
        let key = PipelineKey::of::<softmax::Shader>(&SoftmaxConsts { mask }, 0);
        v.push((format!("softmax-mask{mask}-f32"), key));
    }
    for f16 in [false, true] {
        let key = PipelineKey::of::<weighted_sum::Shader>(&NoConstants, u8::from(f16));
        let t = if f16 { "f16" } else { "f32" };
        v.push((format!("weighted-sum-{t}"), key));
    }
    v
}

/// The fused backward's storage kernels as a GPU runs them ([`BackwardTiles::GPU`], shrunk to
/// the least workgroup memory of [`GPU_WORKGROUP_KIB`]) for d = 64 and 128, f32 and f16,
/// with and without a mask; and `flash_blocked` saving its row statistics for them.
fn backward(dev: &Gpu) -> Result<Vec<(String, PipelineKey)>> {
    let mut v = backward_storage(BackwardTiles::GPU)?;
    for d in [64, 128] {
        for f16 in [false, true] {
            let op = problem(d, f16);
            let t = if f16 { "f16" } else { "f32" };
            let blocked = FlashVariant::Blocked { rows: 64, keys: 64 };
            let keys = recorded(dev, &op, blocked, PLAIN, (false, true))?;
            let key = built(&keys, KernelId::FlashBlocked)?;
            v.push((format!("flash-blocked-64x64-d{d}-{t}-lse"), key));
        }
    }
    let key = PipelineKey::of::<flash_backward_dot::Shader>(&NoConstants, 0);
    v.push(("flash-backward-dot".to_string(), key));
    Ok(v)
}

/// dK/dV's and dQ's storage kernels at `tiles` (a GPU's or the CPU adapter's), under the
/// least workgroup memory of [`GPU_WORKGROUP_KIB`], for d = 64 and 128, f32 and f16, with
/// and without a mask.
fn backward_storage(tiles: BackwardTiles) -> Result<Vec<(String, PipelineKey)>> {
    let limits = gpu_limits_with(GPU_WORKGROUP_KIB[0]);
    let mut v = Vec::new();
    for d in [64, 128] {
        for f16 in [false, true] {
            let op = problem(d, f16);
            let t = if f16 { "f16" } else { "f32" };
            for mask in [0, 1] {
                let c = op.backward_kv_consts(&limits, tiles, mask)?;
                let key = PipelineKey::of::<flash_backward_kv::Shader>(&c, op.f16_bits());
                v.push((format!("flash-backward-kv-d{d}-{t}-mask{mask}"), key));
                let c = op.backward_q_consts(&limits, tiles, mask)?;
                let key = PipelineKey::of::<flash_backward_q::Shader>(&c, op.f16_bits());
                v.push((format!("flash-backward-q-d{d}-{t}-mask{mask}"), key));
            }
        }
    }
    Ok(v)
}

/// `flash_blocked`'s inner loops as a GPU runs them: double buffer, subgroup reductions,
/// both, and with f16 operands f16 arithmetic, alone and with both, for blocks of 64 × 64
/// and 64 × 32, d = 64 and 128, on each of `gpus` (a double buffer that does not fit is left
/// out, as the kernel leaves it out), resident queries alone, with subgroup reductions and
/// with both, and the default GPU loop with a mask. Named `…-dbuf`, `…-sgr`, `…-hmul`,
/// `…-qres`, `-mask`, then `-wg<KiB>k` past 32 KiB.
///
/// # Errors
/// As [`recorded`], but for the variants that do not fit, which are left out.
fn blocked_inner(gpus: &[(u32, Gpu)]) -> Result<Vec<(String, PipelineKey)>> {
    let mut v = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (kib, dev) in gpus {
        let kib = *kib;
        for (rows, keys) in crate::kernels::flash::BLOCKED_SHAPES[..2].iter().copied() {
            for d in [64, 128] {
                for f16 in [false, true] {
                    let op = problem(d, f16);
                    let t = if f16 { "f16" } else { "f32" };
                    // (double buffer, subgroup reductions, f16 arithmetic, resident Q).
                    let mut inners = vec![(true, false, false, false), (false, true, false, false)];
                    inners.push((true, true, false, false));
                    // Resident queries alone, with subgroups (where the double buffer does
                    // not fit beside them) and with both (a GPU's default where all fit).
                    inners.extend([(false, false, false, true), (false, true, false, true)]);
                    inners.push((true, true, false, true));
                    if f16 {
                        inners.extend([(false, false, true, false), (true, true, true, false)]);
                        inners.push((true, true, true, true));
                    }
                    // What a GPU runs by default with a mask too (32 KiB, f32).
                    let masked = kib == GPU_WORKGROUP_KIB[0] && !f16;
                    let inners = inners
                        .into_iter()
                        .map(|i| (i, false))
                        .chain(masked.then_some(((true, true, false, true), true)));
                    for ((dbuf, sgr, hmul, qres), mask) in inners {
                        let opts = BlockedOptions {
                            double_buffer: Some(dbuf),
                            subgroups: Some(sgr),
                            f16_arithmetic: Some(hmul),
                            vector_loads: None,
                            // Left to the kernel, as a GPU leaves it (within 32 KiB).
                            resident_queries: if qres { None } else { Some(false) },
                        };
                        let variant = FlashVariant::Blocked { rows, keys };
                        let Ok(key) = fused_key(dev, &op, variant, opts, mask) else {
                            continue;
                        };
                        // Named by what the constants became (f16 arithmetic is dropped
                        // where it would spill); the plain loop is written with the other
                        // variants.
                        let on = |name| key.constant(name).is_some_and(|c| c != 0);
                        let tags = [(on("DBUF"), "-dbuf"), (on("SGR"), "-sgr")];
                        let tags = tags
                            .into_iter()
                            .chain([(on("HMUL"), "-hmul"), (on("QRES"), "-qres")]);
                        let tags: Vec<&str> = tags.filter(|t| t.0).map(|t| t.1).collect();
                        if tags.is_empty() || !seen.insert(key) {
                            continue;
                        }
                        let mut stem = format!("flash-blocked-{rows}x{keys}-d{d}-{t}");
                        stem.extend(tags);
                        if mask {
                            stem.push_str("-mask");
                        }
                        if kib != GPU_WORKGROUP_KIB[0] {
                            stem.push_str(&format!("-wg{kib}k"));
                        }
                        v.push((stem, key));
                    }
                }
            }
        }
    }
    Ok(v)
}

/// The decode step's kernels as a GPU runs them (`decode_partial_gpu`), every
/// rows-per-workgroup the constants may choose, for d = 64 and 128 (the cache's K and V are
/// textures: one variant serves f32 and f16 caches); and the combine.
fn decode() -> Result<Vec<(String, PipelineKey)>> {
    let limit = gpu_limits_with(GPU_WORKGROUP_KIB[0]).max_compute_workgroup_storage_size;
    let mut v = Vec::new();
    for d in [64u32, 128] {
        let d4 = d / 4;
        let mut seen = std::collections::HashSet::new();
        for rows in 1..=8 {
            let c = GpuPartialConsts::new(rows, (d4, d4), limit)?;
            if seen.insert(c.rows) {
                let key = PipelineKey::of::<decode_partial_gpu::Shader>(&c, 0);
                v.push((format!("decode-partial-gpu-d{d}-rows{}", c.rows), key));
            }
        }
        let key = PipelineKey::of::<decode_combine::Shader>(&CombineConsts { dv4: d4 }, 0);
        v.push((format!("decode-combine-d{d}"), key));
    }
    // The layout moves of a layer's decode step (bit 0: f16 source, bit 1: f16 destination).
    for (name, bits) in [("f32", 0), ("f16-f32", 1), ("f32-f16", 2), ("f16", 3)] {
        let key = PipelineKey::of::<swap_heads::Shader>(&NoConstants, bits);
        v.push((format!("swap-heads-{name}"), key));
    }
    Ok(v)
}

/// The block map of a caller's mask modifier (block sparsity) at the GPU family's query
/// blocks, with the identity stub in place of the modifier (the caller's code is theirs).
fn block_maps() -> Vec<(String, PipelineKey)> {
    use crate::kernels::block_map::{self, BlockMapConsts};
    [32, 64]
        .into_iter()
        .map(|rows| {
            let consts = BlockMapConsts { rows, keys: 64 };
            let key = PipelineKey::of::<block_map::Shader>(&consts, 0);
            (format!("block-map-r{rows}"), key)
        })
        .collect()
}

/// A relative bias table's gradient (the fused backward with T5's bias): the diagonal sums,
/// f32 and f16 operands, with and without a mask (at d 64: the head widths are constants
/// of its loops' lengths, nothing else), and their reduction into buckets.
fn bias_grads() -> Vec<(String, PipelineKey)> {
    use crate::kernels::bias_grad::{self, BiasGradConsts};
    use crate::kernels::bias_grad_reduce;
    let mut v = Vec::new();
    for (dtype, bits) in [("f32", 0), ("f16", 3)] {
        for mask in [0, 1] {
            let consts = BiasGradConsts {
                mask,
                dk: 64,
                dv: 64,
            };
            let key = PipelineKey::of::<bias_grad::Shader>(&consts, bits);
            v.push((format!("bias-grad-{dtype}-mask{mask}"), key));
        }
    }
    let key = PipelineKey::of::<bias_grad_reduce::Shader>(&NoConstants, 0);
    v.push(("bias-grad-reduce".into(), key));
    v
}

/// The training step's elementwise kernels: Adam's update (also mirrored into a layer's packed
/// `W_Q | W_K | W_V`), the MSE loss, and `y += x`.
fn training() -> Vec<(String, PipelineKey)> {
    use crate::kernels::{adam, add, mse};
    let adam = |name: &str, master: u32, mirror: u32| {
        let consts = adam::AdamConsts { master, mirror };
        (
            name.into(),
            PipelineKey::of::<adam::Shader>(&consts, master as u8),
        )
    };
    vec![
        adam("adam", 0, 0),
        adam("adam-f16", 1, 0),
        adam("adam-mirror", 0, 1),
        adam("adam-f16-mirror", 1, 1),
        (
            "mse".into(),
            PipelineKey::of::<mse::Shader>(&NoConstants, 0),
        ),
        (
            "add".into(),
            PipelineKey::of::<add::Shader>(&NoConstants, 0),
        ),
    ]
}

/// The key split of prefill on GPUs, as the dispatcher records it on `dev` for a call
/// split into two key ranges: `flash_blocked` writing partials (blocks of 64 × 64, as
/// [`crate::kernels::flash::BLOCKED_SHAPES`] starts) for d = 64 and 128, f32 and f16, and
/// the combine, with and without the log-sum-exp.
///
/// # Errors
/// As [`recorded`].
fn key_split(dev: &Gpu) -> Result<Vec<(String, PipelineKey)>> {
    let blocked = FlashVariant::Blocked { rows: 64, keys: 64 };
    let split = |d, f16| Flash {
        n_kv: 256,
        key_split: KeySplit::Ranges(2),
        ..problem(d, f16)
    };
    let mut v = Vec::new();
    for d in [64, 128] {
        for f16 in [false, true] {
            let t = if f16 { "f16" } else { "f32" };
            let keys = recorded(dev, &split(d, f16), blocked, PLAIN, (false, false))?;
            let key = built(&keys, KernelId::FlashBlocked)?;
            v.push((format!("flash-blocked-64x64-d{d}-{t}-split"), key));
        }
        for lse in [false, true] {
            let keys = recorded(dev, &split(d, false), blocked, PLAIN, (false, lse))?;
            let key = built(&keys, KernelId::FlashCombine)?;
            v.push((format!("flash-combine-d{d}-lse{}", u8::from(lse)), key));
        }
    }
    Ok(v)
}

/// Writes every kernel variant either profile may run to `dir/<family>/<variant>.wgsl`.
/// The fused kernels' are what the tuner offers ([`super::flash_candidates`], over the fused
/// family) and the dispatcher records on dry-run devices standing for GPUs with 256 threads
/// and each of [`GPU_WORKGROUP_KIB`] of workgroup memory: the storage family's
/// (`flash_blocked`; `flash_tiled` is lavapipe's) for head sizes 32, 64, 80, 96, 128 and 256,
/// f32 and f16 (a variant that more memory changes is written again, its name ending in
/// `-wg<KiB>k`), with a mask and with NaN/Inf pass-through at d = 64 and 128, `flash_blocked`'s
/// inner loops ([`blocked_inner`]), its key split ([`key_split`]) and its saved statistics;
/// the coop kernel's at d = 64 and 128 (`coop/`, cooperative matrices); the subgroup
/// family's at d = 64 and 128 for each of [`SUBGROUP_WIDTHS`] (d = 64 alone at 64 lanes) and
/// `subgroup_size` (`subgroup/`, `-sg<lanes>`). Then the storage family's unfused kernels
/// ([`unfused`]), the fused backward's ([`backward`]), the decode step's ([`decode`]) and the
/// training step's ([`training`]), the coop matmul's, lavapipe's own ([`cpu_only`], `cpu/`),
/// the subgroup family's unfused ones ([`subgroup_unfused`]), the rest ([`shared`]), and last
/// the stand-in's emulated sources of all of the GPU's ([`stand_in`], `stand-in/`). Returns
/// the files written.
///
/// # Errors
/// [`Error::Io`] when the directory or a file cannot be written; an internal error when two
/// variants would share a file.
pub(crate) fn write(dir: &Path, subgroup_size: Option<u32>) -> Result<Vec<PathBuf>> {
    let gpus = GPU_WORKGROUP_KIB
        .into_iter()
        .map(|kib| Ok((kib, gpu(kib)?)))
        .collect::<Result<Vec<_>>>()?;
    let least = &gpus[0].1;
    let mut files: Vec<(&str, String, PipelineKey)> = unfused()
        .into_iter()
        .chain(backward(least)?)
        .chain(decode()?)
        .chain(block_maps())
        .chain(bias_grads())
        .chain(training())
        .chain(key_split(least)?)
        .chain(blocked_inner(&gpus)?)
        .map(|(stem, key)| ("storage", stem, key))
        .collect();
    files.extend(
        crate::kernels::coop_matmul::sources()
            .into_iter()
            .map(|(stem, key)| ("coop", stem, key)),
    );
    files.extend(
        cpu_only()?
            .into_iter()
            .map(|(stem, key)| ("cpu", stem, key)),
    );
    files.extend(shared());
    // The subgroup family at each width (and the adapter's, given one): lavapipe's below 16
    // lanes on a CPU device, a GPU's from 16.
    let mut widths = SUBGROUP_WIDTHS.to_vec();
    widths.extend(subgroup_size.filter(|w| !SUBGROUP_WIDTHS.contains(w)));
    let mut subgroup = Vec::new();
    for sg in widths {
        let dev = if sg < 16 { cpu(sg)? } else { subgroup_gpu(sg)? };
        if UNFUSED_WIDTHS.contains(&sg) || subgroup_size == Some(sg) {
            let unfused = subgroup_unfused(sg).into_iter();
            files.extend(unfused.map(|(stem, key)| ("subgroup", stem, key)));
        }
        subgroup.push((sg, dev));
    }
    // flash_coop as a GPU of 32-lane subgroups alone (NVIDIA's) plans it: 64 query rows.
    let coop32 = coop_gpu(32)?;
    let mut seen = std::collections::HashSet::new();
    for (kib, dev) in &gpus {
        let kib = *kib;
        let suffix = if kib == 32 {
            String::new()
        } else {
            format!("-wg{kib}k")
        };
        for d in HEAD_SIZES {
            let w4 = d.div_ceil(4) as u32;
            let common = d == 64 || d == 128;
            for f16 in [false, true] {
                // What the tuner offers the storage family here (tensor cores with it), then
                // the subgroup family on a device of the given subgroup size.
                let dtype = if f16 { Dtype::F16 } else { Dtype::F32 };
                let mut offered = super::flash_candidates(dev, &[Kernels::Storage], w4, w4, dtype);
                // The tensor-core kernel where the device has them, offered or not yet (see
                // COOP_TUNED): it runs when forced, and its compile is checked for when it is.
                if dev.coop_shape().is_some() && !offered.contains(&FlashVariant::Coop) {
                    offered.push(FlashVariant::Coop);
                }
                // (device, variant, the file name's suffix).
                let mut variants: Vec<(&Gpu, FlashVariant, String)> = offered
                    .into_iter()
                    .filter(|v| v.family() == Kernels::Storage || common)
                    .map(|v| (dev, v, suffix.clone()))
                    .collect();
                // At 64 lanes d = 64 alone: naga's front end takes ~10 s per file of the
                // d = 128 sources unrolled over 64 lanes (3-4 MB), for the same code.
                let widths = subgroup.iter().filter(|(sg, _)| *sg < 64 || d == 64);
                for (sg, sub) in widths.filter(|_| kib == 32 && common) {
                    let offered = super::flash_candidates(sub, &[Kernels::Subgroup], w4, w4, dtype);
                    variants.extend(offered.into_iter().map(|v| (sub, v, format!("-sg{sg}"))));
                }
                if kib == 32 && common && dev.coop_shape().is_some() {
                    variants.push((&coop32, FlashVariant::Coop, "-sg32".to_string()));
                }
                for (dev, variant, suffix) in variants {
                    let family = match variant.family() {
                        Kernels::Subgroup => "subgroup",
                        Kernels::Coop => "coop",
                        _ => "storage",
                    };
                    let key = fused_key(dev, &problem(d, f16), variant, PLAIN, false)?;
                    if seen.insert(key) {
                        let stem = file_name(variant, d, f16) + &suffix;
                        files.push((family, stem, key));
                    }
                    // With a mask, and with NaN/Inf pass-through (keys of weight 0 skipped),
                    // as masked and `propagate_non_finite` calls build them: at the common
                    // head sizes, f32, the least memory.
                    // And with scalar loads, as head sizes that are not multiples of 4 run.
                    if family == "storage" && kib == 32 && !f16 && common {
                        let scalar = [(false, true, "mask"), (true, true, "mask-skip0")];
                        let scalar = scalar.into_iter().chain([(false, false, "scalar")]);
                        for (skip_zero, mask, tag) in scalar {
                            let op = Flash {
                                skip_zero,
                                ..problem(d, f16)
                            };
                            let opts = if mask { PLAIN } else { SCALAR };
                            let key = fused_key(dev, &op, variant, opts, mask)?;
                            if seen.insert(key) {
                                files.push((
                                    family,
                                    format!("{}-{tag}", file_name(variant, d, f16)),
                                    key,
                                ));
                            }
                        }
                    }
                }
            }
        }
    }
    let emulated = stand_in(&files);
    files.extend(emulated);
    let mut written = Vec::new();
    for (family, stem, key) in files {
        let folder = dir.join(family);
        let path = folder.join(format!("{stem}.wgsl"));
        if written.contains(&path) {
            let why = format!("internal: two variants named {}", path.display());
            return Err(Error::invalid("shaders", why));
        }
        std::fs::create_dir_all(&folder)
            .and_then(|()| std::fs::write(&path, key.source()))
            .map_err(|e| Error::io(&path, e))?;
        written.push(path);
    }
    Ok(written)
}
