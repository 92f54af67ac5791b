//! The fully specialised WGSL of every kernel variant the tuner may pick, as the pipeline
//! cache hands it to wgpu, written to `DIR/<family>/<variant>.wgsl` for offline compiler
//! checks (`wgpu-attention shaders --out DIR`, then a real GPU compiler such as
//! `gpu-shader-stats` on each file: `.ci/gpu-shader-stats`).

use std::path::{Path, PathBuf};

use super::storage_flash;
use crate::error::{Error, Result};
use crate::kernels::decode_combine::{self, CombineConsts};
use crate::kernels::decode_partial_gpu::{self, GpuPartialConsts};
use crate::kernels::flash_backward_dot::BackwardTiles;
use crate::kernels::flash_blocked::{FlashBlockedConsts, Inner};
use crate::kernels::flash_combine::{self, SplitCombineConsts};
use crate::kernels::flash_coop;
use crate::kernels::flash_subgroup::{self, FlashSubgroupConsts};
use crate::kernels::flash_tiled::{self, Flash, FlashTiledConsts};
use crate::kernels::matmul::{F16_A, F16_B, F16_C};
use crate::kernels::matmul_blocked::{self, MatmulBlockedConsts};
use crate::kernels::softmax::SoftmaxConsts;
use crate::kernels::swap_heads;
use crate::kernels::wgsl::NoConstants;
use crate::kernels::{flash_backward_dot, flash_backward_kv, flash_backward_q};
use crate::kernels::{flash_blocked, matmul, softmax, weighted_sum, PipelineKey, Strides};
use crate::variant::FlashVariant;

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
        key_split: crate::variant::KeySplit::Auto,
        skip_zero: false,
    }
}

/// The pipeline key `variant` records for `op` (with a mask when `mask` is 1), on a device
/// with `limits` and subgroup size `sg` (subgroup variants only).
///
/// # Errors
/// The variant does not fit `limits`.
pub(crate) fn flash_key(
    op: &Flash,
    variant: FlashVariant,
    limits: &wgpu::Limits,
    sg: u32,
    mask: u32,
) -> Result<PipelineKey> {
    let (dk4, dv4) = op.widths4()?;
    Ok(match variant {
        FlashVariant::Tiled { keys } => {
            let c = FlashTiledConsts {
                keys,
                dk4,
                dv4,
                mask,
                lse: 0,
            };
            PipelineKey::of::<flash_tiled::Shader>(&c, op.f16_bits())
        }
        FlashVariant::Blocked { rows, keys } => {
            let c = op.blocked_consts(limits, (rows, keys), mask)?;
            PipelineKey::of::<flash_blocked::Shader>(&c, op.f16_bits())
        }
        FlashVariant::Subgroup { rows_per_lane } => {
            let c = FlashSubgroupConsts {
                sg,
                rows_per_lane,
                dk4,
                dv4,
                mask,
                skip_zero: u32::from(op.skip_zero),
                lse: 0,
            };
            PipelineKey::of::<flash_subgroup::Shader>(&c, u8::from(op.f16))
        }
        // Written for the tensor cores' common shape: 16 × 16 × 16, f16 inputs.
        FlashVariant::Coop => flash_coop::key(op, COOP_SHAPE, limits, mask)?,
    })
}

/// The cooperative-matrix shape the coop variants are written for (NVIDIA, AMD RDNA3, Intel).
const COOP_SHAPE: crate::context::CoopShape = crate::context::CoopShape {
    size: 16,
    f16_inputs: true,
};

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
fn backward() -> Result<Vec<(String, PipelineKey)>> {
    let limits = gpu_limits_with(GPU_WORKGROUP_KIB[0]);
    let mut v = Vec::new();
    for d in [64, 128] {
        for f16 in [false, true] {
            let op = problem(d, f16);
            let t = if f16 { "f16" } else { "f32" };
            for mask in [0, 1] {
                let c = op.backward_kv_consts(&limits, BackwardTiles::GPU, mask)?;
                let key = PipelineKey::of::<flash_backward_kv::Shader>(&c, op.f16_bits());
                v.push((format!("flash-backward-kv-d{d}-{t}-mask{mask}"), key));
                let c = op.backward_q_consts(&limits, BackwardTiles::GPU, mask)?;
                let key = PipelineKey::of::<flash_backward_q::Shader>(&c, op.f16_bits());
                v.push((format!("flash-backward-q-d{d}-{t}-mask{mask}"), key));
            }
            let c = FlashBlockedConsts {
                lse: 1,
                ..op.blocked_consts(&limits, (64, 64), 0)?
            };
            let key = PipelineKey::of::<flash_blocked::Shader>(&c, op.f16_bits());
            v.push((format!("flash-blocked-64x64-d{d}-{t}-lse"), key));
        }
    }
    let key = PipelineKey::of::<flash_backward_dot::Shader>(&NoConstants, 0);
    v.push(("flash-backward-dot".to_string(), key));
    Ok(v)
}

/// `flash_blocked`'s inner loops ([`Inner`]) as a GPU runs them: double buffer, subgroup
/// reductions, both, and with f16 operands f16 arithmetic, alone and with both, for blocks
/// of 64 × 64 and 64 × 32, d = 64 and 128, at each of [`GPU_WORKGROUP_KIB`] (a double buffer
/// that does not fit is left out, as the kernel leaves it out), and the default GPU loop
/// with a mask. Named `…-dbuf`, `…-sgr`, `…-hmul`, `-mask`, then `-wg<KiB>k` past 32 KiB.
fn blocked_inner() -> Vec<(String, PipelineKey)> {
    let mut v = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for kib in GPU_WORKGROUP_KIB {
        let limits = gpu_limits_with(kib);
        for (rows, keys) in [(64, 64), (64, 32)] {
            for d in [64, 128] {
                for f16 in [false, true] {
                    let op = problem(d, f16);
                    let t = if f16 { "f16" } else { "f32" };
                    let mut inners = vec![(1, 0, 0), (0, 1, 0), (1, 1, 0)];
                    if f16 {
                        inners.extend([(0, 0, 1), (1, 1, 1)]);
                    }
                    // What a GPU runs by default with a mask too (32 KiB, f32).
                    let masked = kib == GPU_WORKGROUP_KIB[0] && !f16;
                    let inners = inners
                        .into_iter()
                        .map(|i| (i, 0))
                        .chain(masked.then_some(((1, 1, 0), 1)));
                    for ((dbuf, sgr, hmul), mask) in inners {
                        let inner = Inner { dbuf, sgr, hmul };
                        let Ok(c) = op.blocked_consts_with(&limits, (rows, keys), mask, inner)
                        else {
                            continue;
                        };
                        // The plain loop is written with the other variants.
                        if c.dbuf + c.sgr + c.hmul == 0 {
                            continue;
                        }
                        let key =
                            PipelineKey::of::<flash_blocked::Shader>(&c, c.f16_bits(op.f16_bits()));
                        if seen.insert(key) {
                            let mut stem = format!("flash-blocked-{rows}x{keys}-d{d}-{t}");
                            // Named by what the constants became (f16 arithmetic is
                            // dropped where it would spill).
                            let tags = [(c.dbuf, "-dbuf"), (c.sgr, "-sgr"), (c.hmul, "-hmul")];
                            for (on, tag) in tags {
                                if on != 0 {
                                    stem.push_str(tag);
                                }
                            }
                            if mask != 0 {
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
    }
    v
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

/// The key split of prefill on GPUs: `flash_blocked` writing partials (blocks of 64 × 64, as
/// [`super::BLOCKED_SHAPES`] starts) for d = 64 and 128, f32 and f16, and the combine, with and
/// without the log-sum-exp.
fn key_split() -> Result<Vec<(String, PipelineKey)>> {
    let limits = gpu_limits_with(GPU_WORKGROUP_KIB[0]);
    let mut v = Vec::new();
    for d in [64, 128] {
        for f16 in [false, true] {
            let op = problem(d, f16);
            let t = if f16 { "f16" } else { "f32" };
            let c = FlashBlockedConsts {
                split: 1,
                ..op.blocked_consts(&limits, (64, 64), 0)?
            };
            let key = PipelineKey::of::<flash_blocked::Shader>(&c, op.f16_bits());
            v.push((format!("flash-blocked-64x64-d{d}-{t}-split"), key));
        }
        for lse in [0, 1] {
            let c = SplitCombineConsts {
                dv4: d as u32 / 4,
                lse,
            };
            let key = PipelineKey::of::<flash_combine::Shader>(&c, 0);
            v.push((format!("flash-combine-d{d}-lse{lse}"), key));
        }
    }
    Ok(v)
}

/// Writes every kernel variant the tuner may pick on a GPU to `dir/<family>/<variant>.wgsl`:
/// the storage family's fused variants as [`storage_flash`] offers them on a GPU with 256
/// threads and each of [`GPU_WORKGROUP_KIB`] of workgroup memory (`flash_blocked`;
/// `flash_tiled` is lavapipe's) for head sizes 32, 64, 80, 96, 128 and 256, f32 and f16 (a
/// variant that more memory changes is written again, its name ending in `-wg<KiB>k`), and
/// its unfused kernels ([`unfused`]), the fused backward's ([`backward`]) and the decode
/// step's ([`decode`]), the coop kernels (`coop/`, cooperative matrices); with a subgroup size, the subgroup family's fused
/// variants for d = 64 and 128. Returns the files written.
///
/// # Errors
/// [`Error::Io`] when the directory or a file cannot be written.
pub(crate) fn write(dir: &Path, subgroup_size: Option<u32>) -> Result<Vec<PathBuf>> {
    let mut files: Vec<(&str, String, PipelineKey)> = unfused()
        .into_iter()
        .chain(backward()?)
        .chain(decode()?)
        .chain(training())
        .chain(key_split()?)
        .chain(blocked_inner())
        .map(|(stem, key)| ("storage", stem, key))
        .collect();
    files.extend(
        crate::kernels::coop_matmul::sources()
            .into_iter()
            .map(|(stem, key)| ("coop", stem, key)),
    );
    let mut seen = std::collections::HashSet::new();
    for kib in GPU_WORKGROUP_KIB {
        let limits = gpu_limits_with(kib);
        let suffix = if kib == 32 {
            String::new()
        } else {
            format!("-wg{kib}k")
        };
        for d in HEAD_SIZES {
            let w4 = d.div_ceil(4) as u32;
            let (_, storage) = storage_flash(wgpu::DeviceType::DiscreteGpu, &limits, (w4, w4));
            for f16 in [false, true] {
                let mut variants: Vec<(&str, FlashVariant)> =
                    storage.iter().map(|&v| ("storage", v)).collect();
                if d == 64 || d == 128 {
                    variants.push(("coop", FlashVariant::Coop));
                }
                if kib == 32 && subgroup_size.is_some() && (d == 64 || d == 128) {
                    variants.extend(
                        (1..=4).map(|r| ("subgroup", FlashVariant::Subgroup { rows_per_lane: r })),
                    );
                }
                for (family, variant) in variants {
                    let sg = subgroup_size.unwrap_or(0);
                    let key = flash_key(&problem(d, f16), variant, &limits, sg, 0)?;
                    if seen.insert(key) {
                        let stem = file_name(variant, d, f16) + &suffix;
                        files.push((family, stem, key));
                    }
                    // With a mask, and with NaN/Inf pass-through (keys of weight 0 skipped),
                    // as masked and `propagate_non_finite` calls build them: at the common
                    // head sizes, f32, the default limits.
                    if family == "storage" && kib == 32 && !f16 && (d == 64 || d == 128) {
                        for (skip_zero, tag) in [(false, "mask"), (true, "mask-skip0")] {
                            let op = Flash {
                                skip_zero,
                                ..problem(d, f16)
                            };
                            let key = flash_key(&op, variant, &limits, sg, 1)?;
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
    let mut written = Vec::new();
    for (family, stem, key) in files {
        let folder = dir.join(family);
        let path = folder.join(format!("{stem}.wgsl"));
        std::fs::create_dir_all(&folder)
            .and_then(|()| std::fs::write(&path, key.source()))
            .map_err(|e| Error::io(&path, e))?;
        written.push(path);
    }
    Ok(written)
}
