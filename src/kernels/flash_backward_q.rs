//! `shaders/flash_backward_q.wgsl`: the fused backward's dQ, one query row per thread, K and
//! V streamed through workgroup memory. A pass of its own because WGSL has no atomic float
//! add to accumulate dQ from the dK/dV kernel. Same [`Flash`] problem and uniform as the
//! fused forward.

use super::flash_backward_dot::{partials, BackwardTiles};
use super::flash_tiled::{Flash, FlashParams};
use super::loops::{run, strided, Build};
use super::mods::ModsBind;
use super::wgsl::constants;
use super::{record_with, Dim, Kernel, KernelId, MaskArg, Slot};
use crate::error::Result;
use crate::gpu::Gpu;

/// The kernel.
pub(crate) struct Shader;

constants! {
    /// Specialisation of `flash_backward_q.wgsl`.
    pub(crate) struct BackwardQConsts {
        /// Query rows per workgroup.
        rows => "BR",
        /// Threads per row.
        split => "CT",
        /// Threads per workgroup, `rows · split`.
        threads => "WG",
        /// Keys per workgroup-memory tile.
        keys => "BC",
        /// Query/key width of one head in vec4s, rounded up.
        dk4 => "DK4",
        /// Value width of one head in vec4s, rounded up.
        dv4 => "DV4",
        /// Vec4 columns of Q (and dQ) per thread, `⌈DK4 / CT⌉`.
        kc => "KC",
        /// Vec4 columns of dO per thread, `⌈DV4 / CT⌉`.
        vc => "VC",
        /// 1 when a mask is bound.
        mask => "MASK",
        /// 1 to read and write every buffer as vec4s ([`Flash::vector_layout`]).
        vec => "VEC",
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::FlashBackwardQ;
    const WORKGROUP: [Dim; 3] = [Dim::Const("WG"), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Read("q_buf"),
        Slot::Read("k_buf"),
        Slot::Read("v_buf"),
        Slot::Read("do_buf"),
        Slot::Read("stats"),
        Slot::ReadWrite("dq_buf"),
        Slot::Read("mask"),
    ];
    /// Bit 0: Q is f16; bit 1: K and V are f16.
    const DTYPES: &'static [&'static str] = &["Q_T", "KV_T"];
    type Consts = BackwardQConsts;
    type Params = FlashParams;

    /// The key-tile loop over the row's keys (`⌈keys / BC⌉` tiles, causal: at most up to the
    /// last row) around: K's and V's staging loops (`load4`'s 4 values each where scalar),
    /// with CT > 1 the partials' loop over the tile's keys (`partial`: its KC and VC loops),
    /// and the loop over the tile's keys (`partial` or the CT partials' sum, then dQ's KC
    /// columns); before it Q's and dO's loads and the CT shares' slots of the partials,
    /// after it dQ's store (`store4`'s 4 where scalar). `// unroll` loops count only where they stay loops (`Build::marked`).
    fn loops(c: &BackwardQConsts, p: &FlashParams, b: Build) -> u64 {
        let m = |n| b.marked(n);
        let (bc, ct, wg) = (u64::from(c.keys), u64::from(c.split), u64::from(c.threads));
        let (kc, vc) = (u64::from(c.kc), u64::from(c.vc));
        let four = if c.vec != 0 { 0 } else { m(4) };
        let stage = |w4: u32| {
            let trips = strided(bc * u64::from(w4), wg);
            run(trips) + trips * four
        };
        let partial = m(kc) + m(vc);
        let split = if ct > 1 { run(bc) + bc * partial } else { 0 };
        let per_key = if ct > 1 { m(ct) } else { partial } + m(kc);
        let tile = stage(c.dk4) + stage(c.dv4) + split + run(bc) + bc * per_key;
        let keys = match p.causal {
            0 => p.n_kv,
            _ => p.n_kv.min(p.n_q),
        };
        let tiles = strided(u64::from(keys), bc);
        // Q's and dO's loads, dQ's store; the CT shares' slots of `part`.
        let edges = m(kc) + kc * four + m(vc) + vc * four + m(kc) + kc * four + m(ct);
        run(tiles) + tiles * tile + edges
    }
}

impl Flash {
    /// The constants of `flash_backward_q.wgsl` for `tiles` on a device with `limits`.
    ///
    /// # Errors
    /// Not even a one-key tile fits the workgroup memory.
    pub fn backward_q_consts(
        &self,
        limits: &wgpu::Limits,
        tiles: BackwardTiles,
        mask: u32,
    ) -> Result<BackwardQConsts> {
        let (dk4, dv4) = self.widths4()?;
        // A key of K and V, and each thread's partial (s, dP) of it.
        let row_bytes = |t: &BackwardTiles| 16 * u64::from(dk4 + dv4) + partials(t);
        let t = tiles
            .for_width(dk4.max(dv4))
            .fit(limits, row_bytes, "flash-backward-q")?;
        Ok(BackwardQConsts {
            rows: t.owners,
            split: t.split,
            threads: t.threads(),
            keys: t.tile,
            dk4,
            dv4,
            kc: dk4.div_ceil(t.split.max(1)),
            vc: dv4.div_ceil(t.split.max(1)),
            mask,
            vec: u32::from(self.vector_layout()),
        })
    }

    /// Records `dQ` (f32, laid out as [`Flash::q`]) from Q, K, V, dO (laid out as
    /// [`Flash::o`]) and `stats` (each row's log-sum-exp, then its `D`).
    ///
    /// # Errors
    /// As [`Flash::backward_q_consts`]; a size that does not fit the grid.
    #[allow(clippy::too_many_arguments)]
    pub fn dispatch_backward_q(
        &self,
        ctx: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        tiles: BackwardTiles,
        (q, k, v): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
        (d_o, stats): (&wgpu::Buffer, &wgpu::Buffer),
        dq: &wgpu::Buffer,
        mask: Option<MaskArg<'_>>,
    ) -> Result<()> {
        let upload = MaskArg::mods(mask);
        let (mask, mask_strides, has_mask) = MaskArg::bias_parts(ctx, mask);
        let consts = self.backward_q_consts(ctx.limits(), tiles, has_mask)?;
        // The modifiers as the forward applied them, with the block map of this kernel's
        // blocks of rows and tiles of keys.
        let map = self.block_map(ctx, upload, consts.rows as usize, consts.keys)?;
        let mods = upload.map(|upload| ModsBind {
            upload,
            map: map.as_deref(),
        });
        let (params, workgroups) = self.params(consts.rows as usize, mask_strides)?;
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
                dq.into(),
                mask.into(),
            ],
            mods,
            workgroups,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::hardware::Emulation;
    use crate::gpu::hardware::LLVMPIPE_LOOP_CAP;

    /// Lavapipe's shape ([`BackwardTiles::CPU`]: 64 rows of one thread, 32-key tiles) at
    /// d = 16 (or 64), vector loads.
    fn consts(dk4: u32) -> BackwardQConsts {
        BackwardQConsts {
            rows: 64,
            split: 1,
            threads: 64,
            keys: 32,
            dk4,
            dv4: dk4,
            kc: dk4,
            vc: dk4,
            mask: 0,
            vec: 1,
        }
    }

    fn params(n_q: u32, n_kv: u32, causal: bool) -> FlashParams {
        FlashParams {
            n_q,
            n_kv,
            causal: u32::from(causal),
            kv_ratio: 1,
            ..Default::default()
        }
    }

    #[test]
    fn loops_count_every_key_tile() {
        let native = Build::of(Emulation::default());
        // By hand, 64 keys at d 16: the tile loop's 2 trips and its end (3), per tile K's and
        // V's staging (128 vec4s over 64 threads: 2 trips and an end each) and the 32 keys
        // (33): 3 + 2 · 39.
        assert_eq!(Shader::loops(&consts(4), &params(1, 64, false), native), 81);
        // Emulated builds keep the `// unroll` loops: per key `partial`'s KC and VC loops
        // and dQ's KC (5 each with their ends).
        let rolled = Build::of(Emulation {
            subgroup: 32,
            coop: 0,
        });
        assert!(Shader::loops(&consts(4), &params(1, 64, false), rolled) >= 81 + 2 * 32 * 15);
        // d 64: 40,000 keys fit lavapipe's cap, 70,000 do not; causal stops at the last row.
        let at = |n_kv, causal| Shader::loops(&consts(16), &params(4, n_kv, causal), native);
        assert!(at(40_000, false) <= LLVMPIPE_LOOP_CAP && at(70_000, false) > LLVMPIPE_LOOP_CAP);
        assert!(at(70_000, true) < at(64, false));
    }
}
