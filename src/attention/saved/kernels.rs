//! Which kernels a saved forward's backward runs (the subgroup family's or the storage
//! ones, and their tiles), and the relative bias table's gradient they record beside them.

use super::super::upload::MaskBuffer;
use crate::context::Context;
use crate::error::Result;
use crate::gpu::buffer;
use crate::kernels::bias_grad::TableGrad;
use crate::kernels::flash_backward_dot::BackwardTiles;
use crate::kernels::flash_tiled::Flash;
use crate::kernels::pack::PackLayout;
use crate::modifiers::Preset;
use crate::variant::FlashVariant;

/// Keys (dK/dV) and query rows (dQ) per lane of the subgroup family's backward kernels.
/// Measured on lavapipe at d = 64 (2 shared cores, so runs vary by up to 2×): dK/dV took
/// 25 ms with 1 key per lane and 37 ms with 2 at n = 1024, and ~330 ms either way at
/// n = 4096; dQ 33 ms with 1 row per lane and 25 ms with 2 at n = 1024.
const SUBGROUP_PER_LANE: (u32, u32) = (1, 2);

/// Which backward kernels a saved forward's backward runs: the subgroup family's (rows per
/// lane) when the forward ran on it and Q and dO fit its textures, or on a loop-capped
/// adapter (lavapipe) when the storage ones would pass the cap and they would not; else the
/// storage ones.
#[derive(Debug, Clone, Copy)]
pub(in crate::attention) struct BackwardKernels {
    pub subgroup: Option<(u32, u32)>,
    pub tiles: BackwardTiles,
}

impl BackwardKernels {
    /// For a forward of `flash` with `variant` and `mask` on `ctx`.
    pub(in crate::attention) fn choose(
        ctx: &Context,
        variant: FlashVariant,
        flash: &Flash,
        mask: Option<&MaskBuffer>,
    ) -> Self {
        let max = ctx.limits().max_texture_dimension_2d;
        let tiles = BackwardTiles::for_adapter(ctx);
        let subgroup = match variant {
            // Q and dO must fit textures too (the forward packed only K and V).
            FlashVariant::Subgroup { .. } => queries_fit_textures(max, flash),
            // The storage kernels loop over every key (dQ) or query row (dK/dV) one at a
            // time, the subgroup ones a subgroup of them at a time; and they bind Q and dO
            // as storage where the subgroup ones read textures.
            _ => {
                let mods = mask.map_or(0, MaskBuffer::mods_bindings);
                (subgroup_within_loop_cap(ctx, flash, tiles)
                    || storage_past_binding_count(ctx, mods))
                    && ctx.subgroup_size().is_some()
                    && queries_fit_textures(max, flash)
                    && keys_fit_textures(max, flash)
            }
        };
        BackwardKernels {
            subgroup: subgroup.then_some(SUBGROUP_PER_LANE),
            tiles,
        }
    }

    /// Records `D = rowsum(dO ∘ O)` into the statistics, then dK and dV, then dQ (f32).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::attention) fn record(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        f: &Flash,
        inputs: (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
        (d_o, o, stats): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
        (dq, dk, dv): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
        mask: Option<crate::kernels::MaskArg<'_>>,
    ) -> Result<()> {
        f.dispatch_backward_dot(ctx, encoder, d_o, o, stats)?;
        let saved = (d_o, stats);
        match self.subgroup {
            Some(per_lane) => f.dispatch_backward_subgroup(
                ctx,
                encoder,
                per_lane,
                inputs,
                saved,
                (dq, dk, dv),
                mask,
            ),
            None => {
                f.dispatch_backward_kv(ctx, encoder, self.tiles, inputs, saved, (dk, dv), mask)?;
                f.dispatch_backward_q(ctx, encoder, self.tiles, inputs, saved, dq, mask)
            }
        }
    }
}

/// With a relative bias among the modifiers of `mask`: its table's shape `(buckets, heads)`
/// and the bucket of each diagonal of `flash`'s score matrix, for
/// [`Flash::dispatch_bias_grad`].
pub(in crate::attention) fn table_grad(
    flash: &Flash,
    mask: Option<&MaskBuffer>,
) -> Option<(TableGrad, [usize; 2])> {
    let mods = &mask?.arg().mods?.source;
    mods.presets().iter().find_map(|p| match p {
        Preset::RelativeBias {
            buckets,
            max_distance,
            bidirectional,
            ..
        } => {
            let bucket_of = (0..flash.n_q + flash.n_kv - 1)
                .map(|t| {
                    let d = t as i64 - (flash.n_q as i64 - 1);
                    Preset::t5_bucket(d, *buckets, *max_distance, *bidirectional)
                })
                .collect();
            let grad = TableGrad {
                bucket_of,
                buckets: *buckets,
            };
            Some((grad, [*buckets as usize, flash.heads]))
        }
        _ => None,
    })
}

/// Records the gradient of the relative bias table among `mask`'s modifiers (when it has
/// one) into a new buffer, after [`BackwardKernels::record`] wrote each row's `D` into
/// `stats`; with the table's shape.
pub(in crate::attention) fn record_table_grad(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    flash: &Flash,
    (qkv, d_o, stats): ([&wgpu::Buffer; 3], &wgpu::Buffer, &wgpu::Buffer),
    mask: Option<&MaskBuffer>,
) -> Result<Option<(crate::gpu::buffer::Buf, [usize; 2])>> {
    let Some((grad, shape)) = table_grad(flash, mask) else {
        return Ok(None);
    };
    let out = buffer::output(ctx, "relative bias gradient", shape[0] * shape[1], false)?;
    let [q, k, v] = qkv;
    flash.dispatch_bias_grad(
        ctx,
        encoder,
        (q, k, v),
        (d_o, stats),
        mask.map(MaskBuffer::arg),
        &grad,
        &out,
    )?;
    Ok(Some((out, shape)))
}

/// Whether the storage backward's widest kernel (`flash_backward_kv`: Q, K, V, dO, the
/// statistics, dK, dV and the mask) with the modifiers' `mods` bindings passes the device's
/// storage buffers a stage (WebGPU's default is 8: one modifier buffer passes it), where the
/// subgroup kernels, which read Q and dO as textures, fit.
fn storage_past_binding_count(ctx: &Context, mods: usize) -> bool {
    use crate::kernels::{flash_backward_kv, Kernel};
    let own = <flash_backward_kv::Shader as Kernel>::storage_bindings();
    mods > 0 && own + mods > ctx.limits().max_storage_buffers_per_shader_stage as usize
}

/// Whether Q and dO of `f` fit the subgroup backward's textures, `max` texels a side.
pub(super) fn queries_fit_textures(max: u32, f: &Flash) -> bool {
    let fits = |width: usize| {
        PackLayout::new("Q", f.batch * f.heads, f.n_q, width.div_ceil(4), max).is_ok()
    };
    fits(f.dk_h) && fits(f.dv_h)
}

/// Whether K and V fit the subgroup backward's textures (it packs them itself).
fn keys_fit_textures(max: u32, f: &Flash) -> bool {
    let kv_heads = f.heads / f.kv_ratio.max(1);
    let fits = |width: usize| {
        PackLayout::new("K", f.batch * kv_heads, f.n_kv, width.div_ceil(4), max).is_ok()
    };
    fits(f.dk_h) && fits(f.dv_h)
}

/// Whether, on a loop-capped adapter (lavapipe), the storage backward's kernels would pass
/// its cap (and be refused) while the subgroup backward's stay within it.
fn subgroup_within_loop_cap(ctx: &Context, f: &Flash, tiles: BackwardTiles) -> bool {
    let Some(cap) = ctx.hardware().loop_cap else {
        return false;
    };
    let storage = f.storage_backward_loops(ctx, tiles).unwrap_or(0);
    storage > cap
        && f.subgroup_backward_loops(ctx, SUBGROUP_PER_LANE)
            .is_some_and(|n| n <= cap)
}
