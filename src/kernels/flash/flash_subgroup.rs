//! `shaders/flash_subgroup.wgsl`: fused attention with K and V packed into textures (by
//! `pack.wgsl`, or on the CPU when they are a host array) and shared through subgroup
//! shuffles; one subgroup per workgroup, `R` query rows per lane. Fast on lavapipe, where
//! storage and workgroup memory are slow. Same [`Flash`] problem as `flash_tiled.rs`.

use super::flash_tiled::{Flash, FlashOut, FlashParams};
use crate::error::Result;
use crate::gpu::Gpu;
use crate::kernels::loops::Build;
use crate::kernels::pack::Pack;
use crate::kernels::wgsl::constants;
use crate::kernels::{record_with, Binding, Dim, Kernel, KernelId, MaskArg, Slot, Strides};

/// The kernel.
pub(crate) struct Shader;

constants! {
    /// Specialisation of `flash_subgroup.wgsl`.
    pub(crate) struct FlashSubgroupConsts {
        /// The subgroup size.
        sg => "SG",
        /// Query rows per lane.
        rows_per_lane => "R",
        /// Query/key width of one head in vec4s, rounded up.
        dk4 => "DK4",
        /// Value width of one head in vec4s, rounded up.
        dv4 => "DV4",
        /// 1 when a mask is bound.
        mask => "MASK",
        /// 1 to leave keys of weight exactly 0 out of the sum (NaN/Inf pass-through).
        skip_zero => "SKIP_ZERO",
        /// 1 to write each row's log-sum-exp (a forward saved for the backward pass).
        lse => "LSE",
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::FlashSubgroup;
    const WORKGROUP: [Dim; 3] = [Dim::Const("SG"), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Read("q_buf"),
        Slot::Texture("k_tex"),
        Slot::Texture("v_tex"),
        Slot::ReadWrite("out"),
        Slot::Read("mask"),
        Slot::ReadWrite("lse"),
    ];
    /// Q is f16 (K and V are widened as they are packed).
    const DTYPES: &'static [&'static str] = &["Q_T"];
    const SUBGROUPS: bool = true;
    type Consts = FlashSubgroupConsts;
    type Params = FlashParams;

    /// One iteration of the key loop per subgroup of keys; everything inside it, and Q's
    /// load and the output's store, is `// unroll` loops (counted where they stay loops).
    fn loops(c: &FlashSubgroupConsts, p: &FlashParams, b: Build) -> u64 {
        let (sg, r) = (u64::from(c.sg.max(1)), u64::from(c.rows_per_lane));
        let (dk4, dv4) = (u64::from(c.dk4), u64::from(c.dv4));
        let m = |n| b.marked(n);
        let scores = m(sg) + sg * (m(dk4) + dk4 * m(r) + m(r));
        let values = m(dv4) + dv4 * (m(r) + m(sg) + sg * m(r) + m(r));
        let tile = 1 + m(dk4) + m(dv4) + m(r) + scores + m(r) + r * m(sg) + values;
        let tiles = u64::from(p.n_kv).div_ceil(sg) + 1;
        let edges = 2 * m(r) + r * (m(dk4) + dk4 * m(4) + 2 * m(dv4) + dv4 * m(4));
        crate::kernels::loops::run(tiles * tile) + edges
    }
}

impl Flash {
    /// The constants of `flash_subgroup.wgsl` at subgroup size `sg` with `rows_per_lane`,
    /// `(mask, lse)` its flags.
    fn subgroup_consts(
        &self,
        sg: u32,
        rows_per_lane: u32,
        (mask, lse): (u32, u32),
    ) -> Result<FlashSubgroupConsts> {
        let (dk4, dv4) = self.widths4()?;
        Ok(FlashSubgroupConsts {
            sg,
            rows_per_lane,
            dk4,
            dv4,
            mask,
            skip_zero: u32::from(self.skip_zero),
            lse,
        })
    }

    /// The loop iterations of `flash_subgroup`'s busiest invocation on `dev` with
    /// `rows_per_lane`: what recording it checks against the adapter's loop cap (the count
    /// does not depend on the mask or the saved log-sum-exp).
    ///
    /// # Errors
    /// No fixed subgroup size; sizes past u32.
    pub(crate) fn subgroup_loops(&self, dev: &Gpu, rows_per_lane: u32) -> Result<u64> {
        let sg = dev.require_subgroups()?;
        let consts = self.subgroup_consts(sg, rows_per_lane, (0, 0))?;
        let (params, _) = self.params((sg * rows_per_lane) as usize, [0; 4])?;
        Ok(Shader::loops(
            &consts,
            &params,
            Build::of(dev.hardware().emulate),
        ))
    }

    /// Records `out ← softmax(scale·Q·Kᵀ + mask)·V` with `flash_subgroup.wgsl`,
    /// `rows_per_lane` query rows per lane, packing K and V first. When K and V are the same
    /// rows of the same buffer (no projections) and `host` holds that buffer's contents, they
    /// are packed on the CPU into one texture instead of a pass over slow storage loads.
    ///
    /// # Errors
    /// No fixed subgroup size; texture and grid limits.
    #[allow(clippy::too_many_arguments)]
    pub fn dispatch_subgroup(
        &self,
        ctx: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        rows_per_lane: u32,
        (q, k, v): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
        out: FlashOut<'_>,
        mask: Option<MaskArg<'_>>,
        host: Option<&[f32]>,
    ) -> Result<()> {
        let sg = ctx.require_subgroups()?;
        let mods = MaskArg::mods(mask);
        let (mask, mask_strides, has_mask) = MaskArg::bias_parts(ctx, mask);
        let (out, lse_buf, lse) = out.parts(ctx);
        let pack = |src: Strides, width: usize| Pack {
            batch: self.batch,
            heads: self.heads / self.kv_ratio.max(1),
            rows: self.n_kv,
            width,
            src,
            f16: self.f16,
        };
        // Q = K = V = X (no projections): one texture serves both.
        let same = k == v && self.k == self.v && self.dk_h == self.dv_h;
        let k_tex = match host {
            Some(data) if same => pack(self.k, self.dk_h).upload(ctx, "K", data)?,
            _ => pack(self.k, self.dk_h).dispatch(ctx, encoder, "K", k)?,
        };
        let v_packed;
        let v_tex = if same {
            &k_tex
        } else {
            v_packed = pack(self.v, self.dv_h).dispatch(ctx, encoder, "V", v)?;
            &v_packed
        };
        let (params, workgroups) = self.params((sg * rows_per_lane) as usize, mask_strides)?;
        let params = FlashParams {
            k_shift: k_tex.layout.shift,
            k_rows: k_tex.layout.rows,
            v_shift: v_tex.layout.shift,
            v_rows: v_tex.layout.rows,
            ..params
        };
        let map = self.block_map(ctx, mods, (sg * rows_per_lane) as usize, sg)?;
        let consts = self.subgroup_consts(sg, rows_per_lane, (has_mask, lse))?;
        record_with::<Shader>(
            ctx,
            encoder,
            (&consts, u8::from(self.f16)),
            &params,
            &[
                q.into(),
                Binding::Texture(&k_tex.view),
                Binding::Texture(&v_tex.view),
                out.into(),
                mask.into(),
                lse_buf.into(),
            ],
            mods.map(|upload| crate::kernels::mods::ModsBind {
                upload,
                map: map.as_deref(),
            }),
            workgroups,
        )
    }
}
