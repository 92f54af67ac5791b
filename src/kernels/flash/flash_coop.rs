//! `shaders/flash_coop.wgsl`: the fused attention forward of `flash_tiled.rs`'s [`Flash`]
//! problem (same uniform, same bindings: masks, key lengths through the mask, GQA, causal,
//! the saved log-sum-exp) with `Q·Kᵀ` and `P·V` on cooperative matrices (tensor cores), f16
//! (or f32) inputs accumulated in f32, the softmax statistics in f32 from a workgroup-memory
//! copy of the scores. Runs only where [`crate::Context::coop_shape`] is `Some`.

use super::flash_tiled::{Flash, FlashOut, FlashParams};
use crate::error::{Error, Limit, Result};
use crate::gpu::coop::CoopShape;
use crate::gpu::Gpu;
use crate::kernels::coop_matmul::F16_AB;
use crate::kernels::loops::{self, run, Build};
use crate::kernels::wgsl::constants;
use crate::kernels::{record, Dim, Kernel, KernelId, MaskArg, Slot};

/// The kernel.
pub(crate) struct Shader;

constants! {
    /// Specialisation of `flash_coop.wgsl`.
    pub(crate) struct FlashCoopConsts {
        /// One cooperative matrix's side (8 or 16).
        size => "S",
        /// The head width (max of d_k and d_v) rounded up to 16.
        d => "D",
        /// Query rows per workgroup (a multiple of `size`): one row block of `size` rows a
        /// subgroup, so at most `size` times the fewest subgroups a workgroup may have.
        rows => "BQ",
        /// Keys per tile (a multiple of `size`).
        keys => "BKV",
        /// 1 when a mask is bound.
        mask => "MASK",
        /// 1 to write each row's log-sum-exp.
        lse => "LSE",
        /// Elements of padding (16 bytes) after each row of Q, K/V and P in workgroup memory.
        pad => "PAD",
        /// 1 where the head width divides the workgroup: K/V staged by the fast path.
        kv_fast => "KV_FAST",
        /// Elements of a K/V tile each invocation stages on the fast path (1 without it).
        kv_e => "KV_E",
        /// Invocations that share one row of the softmax.
        lanes_per_row => "LPR",
        /// Keys of a tile each of them takes.
        keys_per_lane => "KPL",
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::FlashCoop;
    const WORKGROUP: [Dim; 3] = [Dim::Fixed(128), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Read("q_buf"),
        Slot::Read("k_buf"),
        Slot::Read("v_buf"),
        Slot::ReadWrite("out"),
        Slot::Read("mask"),
        Slot::ReadWrite("lse"),
    ];
    /// Bit 0: Q is f16; bit 1: K and V are f16; bit 2 ([`F16_AB`] >> 1): the cooperative
    /// matrices' inputs are f16.
    const DTYPES: &'static [&'static str] = &["Q_T", "KV_T", "AB_T"];
    const COOP: bool = true;
    type Consts = FlashCoopConsts;
    type Params = FlashParams;

    /// Per key tile: K and V staging (the fast path's loops, or the general one's trips of
    /// `KV_U` elements, K's then V's: the larger), the subgroup's S = Q·Kᵀ blocks and O +=
    /// P·V steps, the softmax's two walks of its keys and its read of the row's parts, and
    /// O's rescale (counted on every tile: data can raise a row's max on any); the emulated
    /// matrices are loop-free. Before the loop, Q's staging and loads; after it, the rows'
    /// sums and O's blocks out.
    fn loops(c: &FlashCoopConsts, p: &FlashParams, _: Build) -> u64 {
        let u = |x: u32| u64::from(x);
        let (s, d, bq, bkv) = (u(c.size).max(1), u(c.d), u(c.rows), u(c.keys).max(1));
        let (sd, sk) = (d / s, bkv / s);
        let (lpr, kpl) = (u(c.lanes_per_row).max(1), u(c.keys_per_lane));
        let wg = u64::from(WG);
        let stage = (3 * run(u(c.kv_e))).max(2 * run(loops::strided(bkv * d, KV_U * wg)));
        let products = 2 * (run(sk) + sk * run(sd));
        let rescale = run(sd) + sd * run(s.div_ceil(lpr));
        let tile = 1 + stage + products + 2 * run(kpl) + run(lpr) + rescale;
        let tiles = u(p.n_kv).div_ceil(bkv) + 1;
        run(tiles * tile)
            + run(loops::strided(bq * d, wg))
            + run(sd)
            + run(lpr)
            + run(sd)
            + sd * run(loops::strided(bq * s, wg))
    }
}

/// Keys' (and values') elements each invocation loads in one trip of the general staging
/// loop (`KV_U` in the shader, which unrolls that many).
const KV_U: u64 = 8;

/// The shader's workgroup size.
const WG: u32 = 128;

/// The block shapes (query rows × keys) tried, largest first; those whose rows are a
/// multiple of the cooperative matrices' side and at most that side times the fewest
/// subgroups a workgroup may have, and whose keys are a multiple of the side.
const SHAPES: [(u32, u32); 8] = [
    (128, 32),
    (64, 32),
    (32, 32),
    (32, 16),
    (16, 32),
    (16, 16),
    (16, 8),
    (8, 8),
];

/// Workgroup memory of the shader at these constants, in bytes: the `AB_T` array (Q over
/// K, V and P, each row padded by 16 bytes), the scores (rows padded by 16 bytes) in f32,
/// the rows' sums and maxes, and the rescale flag.
fn workgroup_bytes(c: &FlashCoopConsts, f16_inputs: bool) -> u64 {
    let [d, bq, bkv] = [c.d, c.rows, c.keys].map(u64::from);
    let (ab, pad) = if f16_inputs { (2, 8) } else { (4, 4) };
    let kv_p = 2 * bkv * (d + pad) + bq * (bkv + pad);
    ab * (bq * (d + pad)).max(kv_p) + 4 * (bq * (bkv + 4) + 2 * bq + 1)
}

/// The constants at block `(rows, keys)`: the staging's fast path where `d` divides the
/// workgroup, and the softmax's split of a row over `min(WG / rows, keys)` invocations.
fn at_block(
    shape: CoopShape,
    d: u32,
    (rows, keys): (u32, u32),
    (mask, lse): (u32, u32),
) -> FlashCoopConsts {
    let kv_fast = u32::from(WG.is_multiple_of(d));
    let lanes_per_row = (WG / rows).min(keys);
    FlashCoopConsts {
        size: shape.size,
        d,
        rows,
        keys,
        mask,
        lse,
        pad: if shape.f16_inputs { 8 } else { 4 },
        kv_fast,
        kv_e: if kv_fast == 1 { keys * d / WG } else { 1 },
        lanes_per_row,
        keys_per_lane: keys / lanes_per_row,
    }
}

/// The constants for `op` with `shape` under `limits`, for subgroups at most `widest` lanes
/// wide: the largest block of [`SHAPES`] with a subgroup for each of its row blocks whose
/// tiles fit the workgroup memory.
///
/// # Errors
/// [`Error::LimitExceeded`] when even the smallest does not fit.
pub(crate) fn consts(
    op: &Flash,
    shape: CoopShape,
    (limits, widest): (&wgpu::Limits, u32),
    (mask, lse): (u32, u32),
) -> Result<FlashCoopConsts> {
    let d = crate::kernels::u32_of("head width", op.dk_h.max(op.dv_h).max(1).div_ceil(16) * 16)?;
    let limit = u64::from(limits.max_compute_workgroup_storage_size);
    let fewest = (WG / widest.clamp(1, WG)).max(1);
    let mut need = 0;
    let fits = |(rows, keys): &(u32, u32)| {
        rows % shape.size == 0 && keys % shape.size == 0 && *rows <= shape.size * fewest
    };
    for (rows, keys) in SHAPES.into_iter().filter(fits) {
        let c = at_block(shape, d, (rows, keys), (mask, lse));
        need = workgroup_bytes(&c, shape.f16_inputs);
        if need <= limit {
            return Ok(c);
        }
    }
    Err(Error::LimitExceeded {
        what: format!("flash-coop tiles at head width {d}"),
        needed: format!("{need} bytes"),
        limit: format!("{limit} bytes"),
        limit_name: Limit::MaxComputeWorkgroupStorageSize,
    })
}

/// The widest subgroup `dev`'s kernels may run in (the whole workgroup where the adapter
/// does not say).
fn widest(dev: &Gpu) -> u32 {
    match dev.hardware().subgroup_range.1 {
        0 => WG,
        w => w,
    }
}

/// The loop iterations of `flash_coop`'s busiest invocation for `op` on `dev`: what
/// recording it checks against the adapter's loop cap (the count does not depend on the
/// mask or the saved log-sum-exp).
///
/// # Errors
/// No cooperative-matrix shape; the tiles do not fit; sizes past u32.
pub(crate) fn loops(dev: &Gpu, op: &Flash) -> Result<u64> {
    let c = consts(op, dev.require_coop()?, (dev.limits(), widest(dev)), (0, 0))?;
    let (params, _) = op.params(c.rows as usize, [0; 4])?;
    Ok(Shader::loops(
        &c,
        &params,
        Build::of(dev.hardware().emulate),
    ))
}

/// The element-type bits of `op` on `shape`.
fn f16_bits(op: &Flash, shape: CoopShape) -> u8 {
    op.f16_bits() | if shape.f16_inputs { F16_AB >> 1 } else { 0 }
}

/// Records `out ← softmax(scale·Q·Kᵀ + mask)·V` for `op` on cooperative matrices.
///
/// # Errors
/// [`Error::Unsupported`] without a cooperative-matrix shape; [`Error::LimitExceeded`] when
/// the tiles do not fit or the grid cannot hold the workgroups.
pub(crate) fn dispatch(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    op: &Flash,
    (q, k, v): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
    out: FlashOut<'_>,
    mask: Option<MaskArg<'_>>,
) -> Result<()> {
    let shape = ctx.require_coop()?;
    let (mask, mask_strides, has_mask) = MaskArg::parts(ctx, mask)?;
    let (out, lse_buf, lse) = out.parts(ctx);
    let c = consts(op, shape, (ctx.limits(), widest(ctx)), (has_mask, lse))?;
    let (params, workgroups) = op.params(c.rows as usize, mask_strides)?;
    record::<Shader>(
        ctx,
        encoder,
        &c,
        f16_bits(op, shape),
        &params,
        &[
            q.into(),
            k.into(),
            v.into(),
            out.into(),
            mask.into(),
            lse_buf.into(),
        ],
        workgroups,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::coop_matmul::{self, CoopConsts};
    use crate::kernels::PipelineKey;

    /// Every coop kernel as the pipeline cache would build it on each shape a device may
    /// report (16 f16, 8 f16, 8 and 16 f32 inputs), for d = 64 and 128 (and 40: rounded up),
    /// f32 and f16 storage, with and without a mask and the saved log-sum-exp, at 32, 48 and
    /// 64 KiB of workgroup memory and subgroups of 16, 32 and 64 lanes: what CI checks
    /// without the feature.
    fn every_key() -> Vec<PipelineKey> {
        let mut keys: Vec<PipelineKey> = coop_matmul::sources().into_iter().map(|s| s.1).collect();
        for (size, f16_inputs) in [(16, true), (8, true), (16, false), (8, false)] {
            let shape = CoopShape { size, f16_inputs };
            for bits in 0..8u8 {
                let ab = if f16_inputs { coop_matmul::F16_AB } else { 0 };
                keys.push(PipelineKey::of::<coop_matmul::Shader>(
                    &CoopConsts { size },
                    bits | ab,
                ));
            }
            for d in [40, 64, 128] {
                for f16 in [false, true] {
                    let op = Flash {
                        f16,
                        ..Flash::one_head(1, 1, d)
                    };
                    for (kib, widest) in [(32, 32), (64, 32), (48, 16), (48, 64)] {
                        let limits = wgpu::Limits {
                            max_compute_workgroup_storage_size: kib << 10,
                            ..wgpu::Limits::default()
                        };
                        for flags in [(0, 0), (1, 1)] {
                            let c = consts(&op, shape, (&limits, widest), flags).unwrap();
                            keys.push(PipelineKey::of::<Shader>(&c, f16_bits(&op, shape)));
                        }
                    }
                }
            }
        }
        keys
    }

    #[test]
    fn every_coop_variant_validates_with_naga_and_translates_to_spirv() {
        let caps = naga::valid::Capabilities::COOPERATIVE_MATRIX
            | naga::valid::Capabilities::SUBGROUP
            | naga::valid::Capabilities::SHADER_FLOAT16;
        let keys = every_key();
        assert!(keys.len() > 50, "{}", keys.len());
        for key in keys {
            let source = key.source();
            let what = format!("{:?} {:?} f16={}", key.kernel, key.consts, key.f16);
            assert!(
                source.starts_with("enable wgpu_cooperative_matrix;"),
                "{what}"
            );
            let module = naga::front::wgsl::parse_str(&source)
                .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(&source)));
            let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
                .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
                .subgroup_operations(naga::valid::SubgroupOperationSet::all())
                .validate(&module)
                .unwrap_or_else(|e| panic!("{what}: {e:?}"));
            // What wgpu's Vulkan backend does next (naga's SPIR-V writer rejects, by
            // panicking, some forms the validator accepts, such as a computed store stride).
            naga::back::spv::write_vec(&module, &info, &naga::back::spv::Options::default(), None)
                .unwrap_or_else(|e| panic!("{what}: SPIR-V: {e:?}"));
        }
    }

    /// What the host counts is what the shader declares (the sanitizer sums its workgroup
    /// variables), on every shape and width the tests build.
    #[test]
    fn workgroup_bytes_are_the_shaders() {
        for (size, f16_inputs) in [(16, true), (8, true), (16, false), (8, false)] {
            let shape = CoopShape { size, f16_inputs };
            for d_h in [40usize, 64, 128] {
                let op = Flash::one_head(1, 1, d_h);
                for block in SHAPES
                    .into_iter()
                    .filter(|(r, k)| r % size == 0 && k % size == 0)
                {
                    let d = u32::try_from(d_h.div_ceil(16) * 16).unwrap();
                    let c = at_block(shape, d, block, (1, 1));
                    let key = PipelineKey::of::<Shader>(&c, f16_bits(&op, shape));
                    let shader = wgsl_sanitizer::Shader::parse(&key.source()).unwrap();
                    assert_eq!(
                        shader.workgroup_memory_bytes(),
                        workgroup_bytes(&c, f16_inputs),
                        "{c:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn blocks_shrink_to_fit_the_workgroup_memory() {
        let mut op = Flash {
            dv_h: 100,
            ..Flash::one_head(1, 1, 128)
        };
        let f16 = CoopShape {
            size: 16,
            f16_inputs: true,
        };
        let kib = |k: u32| wgpu::Limits {
            max_compute_workgroup_storage_size: k << 10,
            ..wgpu::Limits::default()
        };
        // 64 rows (a 16-row block for each of 4 subgroups of 32 lanes) of 32 keys: 32,260
        // bytes; with subgroups of 64 lanes, 2 subgroups: 32 rows.
        let c = consts(&op, f16, (&kib(64), 32), (0, 0)).unwrap();
        assert_eq!((c.d, c.rows, c.keys), (128, 64, 32));
        assert_eq!(workgroup_bytes(&c, true), 32_260);
        let c = consts(&op, f16, (&kib(64), 64), (0, 0)).unwrap();
        assert_eq!((c.rows, c.keys), (32, 32));
        // 32 query rows of 16 keys: 13,060 bytes (32 × 32 takes 24,588).
        let c = consts(&op, f16, (&kib(16), 32), (0, 0)).unwrap();
        assert_eq!((c.rows, c.keys), (32, 16));
        assert_eq!(workgroup_bytes(&c, true), 13_060);
        op.dk_h = 1000;
        assert!(matches!(
            consts(&op, f16, (&kib(16), 32), (0, 0)),
            Err(Error::LimitExceeded { .. })
        ));
    }
}
