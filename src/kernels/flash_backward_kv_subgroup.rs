//! `shaders/flash_backward_kv_subgroup.wgsl`: the fused backward's dK and dV for adapters
//! where textures and subgroup shuffles are fast (lavapipe), `R` keys per lane, Q and dO
//! packed into textures; and [`Flash::dispatch_backward_subgroup`], which records the
//! subgroup backward (packing, dK/dV, then dQ with `flash_backward_q_subgroup.wgsl`).

use super::flash_backward_q_subgroup;
use super::flash_tiled::{Flash, FlashParams};
use super::loops::{run, strided, Build};
use super::mods::ModsBind;
use super::pack::Pack;
use super::wgsl::constants;
use super::{record_with, u32_of, Binding, Dim, Kernel, KernelId, MaskArg, Slot, Strides};
use crate::error::Result;
use crate::gpu::Gpu;

/// The kernel.
pub(crate) struct Shader;

constants! {
    /// Specialisation of both subgroup backward kernels.
    pub(crate) struct BackwardSubgroupConsts {
        /// The subgroup size.
        sg => "SG",
        /// Keys (dK/dV) or query rows (dQ) per lane.
        per_lane => "R",
        /// Query/key width of one head in vec4s, rounded up.
        dk4 => "DK4",
        /// Value width of one head in vec4s, rounded up.
        dv4 => "DV4",
        /// 1 when a mask is bound.
        mask => "MASK",
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::FlashBackwardKvSubgroup;
    const WORKGROUP: [Dim; 3] = [Dim::Const("SG"), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Texture("q_tex"),
        Slot::Texture("do_tex"),
        Slot::Read("k_buf"),
        Slot::Read("v_buf"),
        Slot::Read("stats"),
        Slot::ReadWrite("dk_buf"),
        Slot::ReadWrite("dv_buf"),
        Slot::Read("mask"),
    ];
    /// K and V are f16 (Q is widened as it is packed).
    const DTYPES: &'static [&'static str] = &["KV_T"];
    const SUBGROUPS: bool = true;
    type Consts = BackwardSubgroupConsts;
    type Params = FlashParams;

    /// For each of the `kv_ratio` query heads of the K/V head, the loop over its rows in
    /// steps of SG (`⌈n_q / SG⌉`) around `// unroll` loops only: Q's and dO's texel loads,
    /// and per row of the step (SG) the scores (DK4 × R), P (R), dP and dV (DV4 × R) and
    /// dK (R × DK4); before it K's and V's loads (R × DK4 and DV4, `load4`'s 4 each), after
    /// it dK's and dV's stores (R × DK4 and DV4, 4 each). The `// unroll` loops count only
    /// where they stay loops (`Build::marked`): natively the count is the row loop's alone.
    fn loops(c: &BackwardSubgroupConsts, p: &FlashParams, b: Build) -> u64 {
        let m = |n| b.marked(n);
        let (sg, r) = (u64::from(c.sg.max(1)), u64::from(c.per_lane));
        let (dk4, dv4) = (u64::from(c.dk4), u64::from(c.dv4));
        let per_row = m(dk4) + dk4 * m(r) + m(r) + m(dv4) + dv4 * m(r) + m(r) + r * m(dk4);
        let step = m(dk4) + m(dv4) + m(sg) + sg * per_row;
        let steps = strided(u64::from(p.n_q), sg);
        let heads = u64::from(p.kv_ratio);
        let rows = m(dk4) + dk4 * m(4) + m(dv4) + dv4 * m(4);
        let edges = 2 * (m(r) + r * rows);
        run(heads) + heads * (run(steps) + steps * step) + edges
    }
}

impl Flash {
    /// Records the subgroup backward: Q and dO (laid out as [`Flash::q`] and [`Flash::o`])
    /// and K and V packed into textures, then dK and dV (`kv_per_lane` keys per lane) and dQ
    /// (`q_per_lane` rows per lane), f32, laid out as Q, K and V; `stats` holds each row's
    /// log-sum-exp, then its `D`.
    ///
    /// # Errors
    /// No fixed subgroup size; texture and grid limits.
    #[allow(clippy::too_many_arguments)]
    pub fn dispatch_backward_subgroup(
        &self,
        ctx: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        (kv_per_lane, q_per_lane): (u32, u32),
        (q, k, v): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
        (d_o, stats): (&wgpu::Buffer, &wgpu::Buffer),
        (dq, dk, dv): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
        mask: Option<MaskArg<'_>>,
    ) -> Result<()> {
        let sg = ctx.require_subgroups()?;
        // The modifiers as the forward applied them; the block map only for dQ (the dK/dV
        // kernel walks a key block's rows, the map's other orientation: every tile visited).
        let upload = MaskArg::mods(mask);
        let mods = upload.map(|upload| ModsBind { upload, map: None });
        let q_map = self.block_map(ctx, upload, (sg * q_per_lane) as usize, sg)?;
        let q_mods = upload.map(|upload| ModsBind {
            upload,
            map: q_map.as_deref(),
        });
        let (mask, mask_strides, has_mask) = MaskArg::bias_parts(ctx, mask);
        let kv_heads = self.heads / self.kv_ratio.max(1);
        let pack = |heads: usize, rows: usize, src: Strides, width: usize, f16: bool| Pack {
            batch: self.batch,
            heads,
            rows,
            width,
            src,
            f16,
        };
        let (n_q, n_kv, f16) = (self.n_q, self.n_kv, self.f16);
        let q_tex = pack(self.heads, n_q, self.q, self.dk_h, f16).dispatch(ctx, encoder, "Q", q)?;
        let o_tex =
            pack(self.heads, n_q, self.o, self.dv_h, false).dispatch(ctx, encoder, "dO", d_o)?;
        let k_tex = pack(kv_heads, n_kv, self.k, self.dk_h, f16).dispatch(ctx, encoder, "K", k)?;
        let v_tex = pack(kv_heads, n_kv, self.v, self.dv_h, f16).dispatch(ctx, encoder, "V", v)?;
        let (dk4, dv4) = self.widths4()?;
        let consts = |per_lane| BackwardSubgroupConsts {
            sg,
            per_lane,
            dk4,
            dv4,
            mask: has_mask,
        };
        let (params, workgroups) = self.params((sg * q_per_lane) as usize, mask_strides)?;
        // dK and dV: blocks of keys of each (batch, K/V head); Q's and dO's texture layouts.
        let kv_groups = self.batch * kv_heads;
        let kv_blocks = n_kv.div_ceil((sg * kv_per_lane) as usize);
        let kv_params = FlashParams {
            groups: u32_of("batch·K/V heads", kv_groups)?,
            blocks: u32_of("key blocks", kv_blocks)?,
            k_shift: q_tex.layout.shift,
            k_rows: q_tex.layout.rows,
            v_shift: o_tex.layout.shift,
            v_rows: o_tex.layout.rows,
            ..params
        };
        record_with::<Shader>(
            ctx,
            encoder,
            (&consts(kv_per_lane), u8::from(f16)),
            &kv_params,
            &[
                Binding::Texture(&q_tex.view),
                Binding::Texture(&o_tex.view),
                k.into(),
                v.into(),
                stats.into(),
                dk.into(),
                dv.into(),
                mask.into(),
            ],
            mods,
            (kv_groups * kv_blocks) as u64,
        )?;
        let q_params = FlashParams {
            k_shift: k_tex.layout.shift,
            k_rows: k_tex.layout.rows,
            v_shift: v_tex.layout.shift,
            v_rows: v_tex.layout.rows,
            ..params
        };
        record_with::<flash_backward_q_subgroup::Shader>(
            ctx,
            encoder,
            (&consts(q_per_lane), u8::from(f16)),
            &q_params,
            &[
                q.into(),
                Binding::Texture(&k_tex.view),
                Binding::Texture(&v_tex.view),
                d_o.into(),
                stats.into(),
                dq.into(),
                mask.into(),
            ],
            q_mods,
            workgroups,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::hardware::Emulation;
    use crate::gpu::hardware::LLVMPIPE_LOOP_CAP;

    #[test]
    fn loops_step_a_subgroup_of_rows_at_a_time() {
        let c = BackwardSubgroupConsts {
            sg: 8,
            per_lane: 1,
            dk4: 16,
            dv4: 16,
            mask: 0,
        };
        let p = |n_q| FlashParams {
            n_q,
            kv_ratio: 1,
            ..Default::default()
        };
        let native = Build::of(Emulation::default());
        // Natively only the head loop (1 trip) and the row loop (⌈n_q / 8⌉ trips) remain.
        assert_eq!(Shader::loops(&c, &p(80), native), 2 + 11);
        assert!(Shader::loops(&c, &p(500_000), native) <= LLVMPIPE_LOOP_CAP);
        // Emulated subgroups keep the per-row `// unroll` loops.
        let rolled = Build::of(Emulation {
            subgroup: 8,
            coop: 0,
        });
        assert!(Shader::loops(&c, &p(80), rolled) > 10 * 8 * 16);
    }
}
