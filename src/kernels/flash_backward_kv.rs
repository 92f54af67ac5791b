//! `shaders/flash_backward_kv.wgsl`: the fused backward's dK and dV, one key per thread,
//! the query rows (of every query head that reads the K/V head) streamed through
//! workgroup memory. Same [`Flash`] problem and uniform as the fused forward.

use super::flash_backward_dot::{partials, BackwardTiles};
use super::flash_tiled::{Flash, FlashParams};
use super::loops::{run, strided, Build};
use super::mods::ModsBind;
use super::wgsl::constants;
use super::{record_with, u32_of, Dim, Kernel, KernelId, MaskArg, Slot};
use crate::error::Result;
use crate::gpu::Gpu;

/// The kernel.
pub(crate) struct Shader;

constants! {
    /// Specialisation of `flash_backward_kv.wgsl`.
    pub(crate) struct BackwardKvConsts {
        /// Keys per workgroup.
        keys => "BC",
        /// Threads per key.
        split => "CT",
        /// Threads per workgroup, `keys · split`.
        threads => "WG",
        /// Query rows per workgroup-memory tile.
        rows => "BR",
        /// Query/key width of one head in vec4s, rounded up.
        dk4 => "DK4",
        /// Value width of one head in vec4s, rounded up.
        dv4 => "DV4",
        /// Vec4 columns of K (and dK) per thread, `⌈DK4 / CT⌉`.
        kc => "KC",
        /// Vec4 columns of V (and dV) per thread, `⌈DV4 / CT⌉`.
        vc => "VC",
        /// 1 when a mask is bound.
        mask => "MASK",
        /// 1 to read and write every buffer as vec4s ([`Flash::vector_layout`]).
        vec => "VEC",
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::FlashBackwardKv;
    const WORKGROUP: [Dim; 3] = [Dim::Const("WG"), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Read("q_buf"),
        Slot::Read("k_buf"),
        Slot::Read("v_buf"),
        Slot::Read("do_buf"),
        Slot::Read("stats"),
        Slot::ReadWrite("dk_buf"),
        Slot::ReadWrite("dv_buf"),
        Slot::Read("mask"),
    ];
    /// Bit 0: Q is f16; bit 1: K and V are f16.
    const DTYPES: &'static [&'static str] = &["Q_T", "KV_T"];
    type Consts = BackwardKvConsts;
    type Params = FlashParams;

    /// For each of the `kv_ratio` query heads of the K/V head, the row-tile loop over its
    /// rows (`⌈n_q / BR⌉` tiles) around: Q's, dO's (`load4`'s 4 values each where scalar)
    /// and the statistics' staging loops, with CT > 1 the partials' loop over the tile's
    /// rows (`partial`: its KC and VC loops), and the loop over the tile's rows (`partial`
    /// or the CT partials' sum, then dV's VC and dK's KC columns); before it K's and V's
    /// loads and the CT shares' slots of the partials, after it dK's and dV's stores
    /// (`store4`'s 4 where scalar). `// unroll` loops count only where they stay loops
    /// (`Build::marked`).
    fn loops(c: &BackwardKvConsts, p: &FlashParams, b: Build) -> u64 {
        let m = |n| b.marked(n);
        let (br, ct, wg) = (u64::from(c.rows), u64::from(c.split), u64::from(c.threads));
        let (kc, vc) = (u64::from(c.kc), u64::from(c.vc));
        let four = if c.vec != 0 { 0 } else { m(4) };
        let stage = |w4: u32| {
            let trips = strided(br * u64::from(w4), wg);
            run(trips) + trips * four
        };
        let partial = m(kc) + m(vc);
        let split = if ct > 1 { run(br) + br * partial } else { 0 };
        let per_row = if ct > 1 { m(ct) } else { partial } + m(vc) + m(kc);
        let stats = run(strided(br, wg));
        let tile = stage(c.dk4) + stage(c.dv4) + stats + split + run(br) + br * per_row;
        let tiles = strided(u64::from(p.n_q), br);
        let heads = u64::from(p.kv_ratio);
        // K's and V's loads, dK's and dV's stores; the CT shares' slots of `part`.
        let edges = 2 * (m(kc) + kc * four + m(vc) + vc * four) + m(ct);
        run(heads) + heads * (run(tiles) + tiles * tile) + edges
    }
}

impl Flash {
    /// The constants of `flash_backward_kv.wgsl` for `tiles` on a device with `limits`.
    ///
    /// # Errors
    /// Not even a one-row tile fits the workgroup memory.
    pub fn backward_kv_consts(
        &self,
        limits: &wgpu::Limits,
        tiles: BackwardTiles,
        mask: u32,
    ) -> Result<BackwardKvConsts> {
        let (dk4, dv4) = self.widths4()?;
        // A row of q and dO, its (lse, D), and each thread's partial (s, dP) of it.
        let row_bytes = |t: &BackwardTiles| 16 * u64::from(dk4 + dv4) + 8 + partials(t);
        let t = tiles
            .for_width(dk4.max(dv4))
            .fit(limits, row_bytes, "flash-backward-kv")?;
        Ok(BackwardKvConsts {
            keys: t.owners,
            split: t.split,
            threads: t.threads(),
            rows: t.tile,
            dk4,
            dv4,
            kc: dk4.div_ceil(t.split.max(1)),
            vc: dv4.div_ceil(t.split.max(1)),
            mask,
            vec: u32::from(self.vector_layout()),
        })
    }

    /// Records `dK` and `dV` (f32, laid out as [`Flash::k`] and [`Flash::v`]) from Q, K, V,
    /// dO (laid out as [`Flash::o`]) and `stats` (each row's log-sum-exp, then its `D`).
    ///
    /// # Errors
    /// As [`Flash::backward_kv_consts`]; a size that does not fit the grid.
    #[allow(clippy::too_many_arguments)]
    pub fn dispatch_backward_kv(
        &self,
        ctx: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        tiles: BackwardTiles,
        (q, k, v): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
        (d_o, stats): (&wgpu::Buffer, &wgpu::Buffer),
        (dk, dv): (&wgpu::Buffer, &wgpu::Buffer),
        mask: Option<MaskArg<'_>>,
    ) -> Result<()> {
        // The modifiers as the forward applied them. No block map: this kernel walks a key
        // block's query rows, the map's other orientation, so every tile is visited.
        let mods = MaskArg::mods(mask).map(|upload| ModsBind { upload, map: None });
        let (mask, mask_strides, has_mask) = MaskArg::bias_parts(ctx, mask);
        let consts = self.backward_kv_consts(ctx.limits(), tiles, has_mask)?;
        let kv_groups = self.batch * (self.heads / self.kv_ratio.max(1));
        let blocks = self.n_kv.div_ceil(consts.keys as usize);
        let (params, _) = self.params(1, mask_strides)?;
        let params = FlashParams {
            groups: u32_of("batch·K/V heads", kv_groups)?,
            blocks: u32_of("key blocks", blocks)?,
            ..params
        };
        record_with::<Shader>(
            ctx,
            encoder,
            (&consts, self.f16_bits()),
            &params,
            &[
                q.into(),
                k.into(),
                v.into(),
                d_o.into(),
                stats.into(),
                dk.into(),
                dv.into(),
                mask.into(),
            ],
            mods,
            (kv_groups * blocks) as u64,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::hardware::Emulation;
    use crate::gpu::hardware::LLVMPIPE_LOOP_CAP;

    #[test]
    fn loops_count_every_row_tile_of_every_query_head() {
        // Lavapipe's shape (64 keys of one thread, 32-row tiles) at d 16, vector loads.
        let c = BackwardKvConsts {
            keys: 64,
            split: 1,
            threads: 64,
            rows: 32,
            dk4: 4,
            dv4: 4,
            kc: 4,
            vc: 4,
            mask: 0,
            vec: 1,
        };
        let p = |n_q, kv_ratio| FlashParams {
            n_q,
            n_kv: 64,
            kv_ratio,
            ..Default::default()
        };
        let native = Build::of(Emulation::default());
        // By hand, 64 rows of one head: the head loop (1 trip, 2), the tile loop (2 trips, 3),
        // per tile Q's and dO's staging (2 trips, 3 each), the statistics' (1 trip, 2) and
        // the 32 rows (33): 2 + 3 + 2 · 41.
        assert_eq!(Shader::loops(&c, &p(64, 1), native), 87);
        let loops = |n_q, ratio| Shader::loops(&c, &p(n_q, ratio), native);
        assert!(loops(64, 4) > 4 * 80);
        assert!(loops(40_000, 1) <= LLVMPIPE_LOOP_CAP && loops(70_000, 1) > LLVMPIPE_LOOP_CAP);
    }
}
