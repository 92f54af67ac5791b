//! `shaders/flash_backward_q.wgsl`: the fused backward's dQ, one query row per thread, K and
//! V streamed through workgroup memory. A pass of its own because WGSL has no atomic float
//! add to accumulate dQ from the dK/dV kernel. Same [`Flash`] problem and uniform as the
//! fused forward.

use super::flash_backward_dot::{partials, BackwardTiles};
use super::flash_tiled::Flash;
use super::mods::ModsBind;
use super::wgsl::constants;
use super::{record_with, Dim, Kernel, KernelId, MaskArg, Slot};
use crate::error::Result;
use crate::gpu::Device;

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
    type Params = super::flash_tiled::FlashParams;
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
        ctx: &Device,
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
