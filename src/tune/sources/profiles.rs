//! The sources of the profiles beside a GPU tuner's picks: lavapipe's own kernels, the
//! subgroup family's unfused kernels at each width, the kernels every profile shares, and the
//! GPU stand-in's emulated builds of all the GPU's (see the [parent](super)).

use super::*;

/// The subgroup widths the subgroup family is written for: lavapipe's 8 (AVX2; this kind of
/// machine), Intel's and AVX-512 lavapipe's 16, NVIDIA's and RDNA's 32, AMD's wave64.
pub(crate) const SUBGROUP_WIDTHS: [u32; 4] = [8, 16, 32, 64];

/// The widths [`subgroup_unfused`]'s kernels are written for: lavapipe's and the stand-in's
/// (32: NVIDIA's, Apple's). Their sources unroll over the lanes; naga's front end takes
/// seconds per file at 64.
pub(super) const UNFUSED_WIDTHS: [u32; 2] = [8, 32];

/// The GPU stand-in's emulated subgroup width (`WGPU_ATTENTION_STAND_IN=gpu`), at which the
/// GPU variants' emulated sources are written ([`stand_in`]).
const STAND_IN_WIDTH: u32 = 32;

/// A dry-run device standing for lavapipe: a CPU adapter with subgroups of `sg` lanes and
/// 32 KiB of workgroup memory.
pub(super) fn cpu(sg: u32) -> Result<Gpu> {
    Gpu::dry_run(&DryRun {
        limits: gpu_limits_with(GPU_WORKGROUP_KIB[0]),
        device_type: wgpu::DeviceType::Cpu,
        subgroups: (sg, sg),
        coop: None,
    })
}

/// What only the CPU adapter (lavapipe) runs, as its planner records it on a dry-run CPU
/// device ([`cpu`]): `flash_tiled` at every key tile the tuner offers it, for head sizes 32
/// to 256, f32 and f16, and at d = 64 and 128 with a mask, with NaN/Inf pass-through and
/// saving its row statistics; the fused backward's storage kernels at the CPU's tiles
/// (`BackwardTiles::CPU`) for d = 64 and 128, f32 and f16, with and without a mask; the
/// decode step's CPU kernel (`decode_partial`) for every rows per workgroup its constants
/// may choose.
///
/// # Errors
/// As [`recorded`].
pub(super) fn cpu_only() -> Result<Vec<(String, PipelineKey)>> {
    use crate::kernels::decode_partial::{self, PartialConsts};
    let dev = cpu(SUBGROUP_WIDTHS[0])?;
    let mut v = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for d in HEAD_SIZES {
        let w4 = d.div_ceil(4) as u32;
        for f16 in [false, true] {
            let dtype = if f16 { Dtype::F16 } else { Dtype::F32 };
            let offered = crate::tune::flash_candidates(&dev, &[Kernels::Storage], w4, w4, dtype);
            for variant in offered {
                let op = problem(d, f16);
                let key = fused_key(&dev, &op, variant, PLAIN, false)?;
                if seen.insert(key) {
                    v.push((file_name(variant, d, f16), key));
                }
                if f16 || !(d == 64 || d == 128) {
                    continue;
                }
                let skip0 = Flash {
                    skip_zero: true,
                    ..problem(d, f16)
                };
                let masked = [(&op, "mask"), (&skip0, "mask-skip0")];
                for (op, tag) in masked {
                    let key = fused_key(&dev, op, variant, PLAIN, true)?;
                    if seen.insert(key) {
                        v.push((format!("{}-{tag}", file_name(variant, d, f16)), key));
                    }
                }
                let keys = recorded(&dev, &op, variant, PLAIN, (false, true))?;
                let key = built(&keys, KernelId::FlashTiled)?;
                if seen.insert(key) {
                    v.push((format!("{}-lse", file_name(variant, d, f16)), key));
                }
            }
        }
    }
    // The fused backward's storage kernels at the CPU adapter's tiles (a key or row per
    // thread, 32-row tiles), as `attention::saved` records them there.
    v.extend(backward_storage(BackwardTiles::CPU)?);
    let limit = gpu_limits_with(GPU_WORKGROUP_KIB[0]).max_compute_workgroup_storage_size;
    for d in [64u32, 128] {
        let d4 = d / 4;
        let mut rows_seen = std::collections::HashSet::new();
        for rows in 1..=8 {
            let c = PartialConsts::new(rows, (d4, d4), decode_partial::THREADS, limit)?;
            if rows_seen.insert(c.rows) {
                let key = PipelineKey::of::<decode_partial::Shader>(&c, 0);
                v.push((format!("decode-partial-d{d}-rows{}", c.rows), key));
            }
        }
    }
    Ok(v)
}

/// The subgroup family's kernels at subgroup width `sg` besides the fused forward (which
/// [`write`] takes from the tuner's offer): `matmul_subgroup` at 1, 2 and 4 rows per lane,
/// and at 2 with a mask, with a split output and with f16 B (and C); the fused backward's
/// subgroup kernels (dK/dV at one key per lane, dQ at two rows per lane, as
/// `attention::saved` records them) at d = 64, f32, with and without a mask, and at d = 128
/// with f16 operands. (Their sources unroll over the lanes: a few each keep the files and
/// the checks' time small.)
pub(super) fn subgroup_unfused(sg: u32) -> Vec<(String, PipelineKey)> {
    use crate::kernels::flash_backward_kv_subgroup::{self as kv_sg, BackwardSubgroupConsts};
    use crate::kernels::flash_backward_q_subgroup as q_sg;
    use crate::kernels::matmul_subgroup::{self, MatmulSubgroupConsts};
    let mut v = Vec::new();
    let plain = [1, 2, 4].map(|t| (t, 0, 0, ("f32", 0)));
    let two = [(1, 0, ("f32", 0)), (0, 1, ("f32", 0)), (0, 0, ("f16-b", 1))];
    let two = two.map(|(mask, split, t)| (2, mask, split, t));
    let last = [(2, 0, 0, ("f16-bc", 3))];
    for (rows_per_lane, mask, split, (t, bits)) in plain.into_iter().chain(two).chain(last) {
        let c = MatmulSubgroupConsts {
            sg,
            rows_per_lane,
            mask,
            split,
        };
        let key = PipelineKey::of::<matmul_subgroup::Shader>(&c, bits);
        let stem = format!("matmul-subgroup-t{rows_per_lane}-mask{mask}-split{split}");
        v.push((format!("{stem}-{t}-sg{sg}"), key));
    }
    for (d, f16, mask) in [(64u32, false, 0), (64, false, 1), (128, true, 0)] {
        let t = if f16 { "f16" } else { "f32" };
        let c = |per_lane| BackwardSubgroupConsts {
            sg,
            per_lane,
            dk4: d / 4,
            dv4: d / 4,
            mask,
        };
        let key = PipelineKey::of::<kv_sg::Shader>(&c(1), u8::from(f16));
        v.push((
            format!("flash-backward-kv-subgroup-d{d}-{t}-mask{mask}-sg{sg}"),
            key,
        ));
        let key = PipelineKey::of::<q_sg::Shader>(&c(2), u8::from(f16));
        v.push((
            format!("flash-backward-q-subgroup-d{d}-{t}-mask{mask}-sg{sg}"),
            key,
        ));
    }
    v
}

/// The kernels of every adapter that no family's list above holds: the subgroup family's
/// packing into textures (f32 and f16 source and texels) and its row statistics, and the
/// bench's FMA peak.
pub(super) fn shared() -> Vec<(&'static str, String, PipelineKey)> {
    use crate::kernels::{fma_peak, pack, row_stats};
    let mut v = Vec::new();
    for (name, bits) in [("f32", 0), ("f16-f32", 1), ("f32-f16", 2), ("f16", 3)] {
        let key = PipelineKey::of::<pack::Shader>(&NoConstants, bits);
        v.push(("subgroup", format!("pack-{name}"), key));
    }
    let key = PipelineKey::of::<row_stats::Shader>(&NoConstants, 0);
    v.push(("subgroup", "row-stats".to_string(), key));
    let key = PipelineKey::of::<fma_peak::Shader>(&NoConstants, 0);
    v.push(("bench", "fma-peak".to_string(), key));
    v
}

/// The GPU stand-in's sources of `files` (what lavapipe compiles under
/// `WGPU_ATTENTION_STAND_IN`): every variant whose source the emulation changes, its
/// subgroups emulated through workgroup memory (a subgroup-family file at its own width,
/// the others at [`STAND_IN_WIDTH`]) and its cooperative matrices emulated in private
/// arrays, under `stand-in/` with `-emu<width>` appended.
pub(super) fn stand_in(
    files: &[(&str, String, PipelineKey)],
) -> Vec<(&'static str, String, PipelineKey)> {
    let mut v = Vec::new();
    for (family, stem, key) in files {
        let width = match *family {
            "storage" | "coop" => STAND_IN_WIDTH,
            "subgroup" => match key.constant("SG") {
                Some(sg) if sg >= 16 => sg,
                _ => continue,
            },
            _ => continue,
        };
        let mut emulated = *key;
        emulated.emulate = crate::gpu::hardware::Emulation {
            subgroup: width,
            coop: if key.kernel.info().coop {
                key.constant("S").unwrap_or(16)
            } else {
                0
            },
        };
        if emulated.source() != key.source() {
            v.push(("stand-in", format!("{stem}-emu{width}"), emulated));
        }
    }
    v
}
