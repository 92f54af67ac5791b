//! `shaders/flash_backward_kv.wgsl`: the fused backward's dK and dV, one key per thread,
//! the query rows (of every query head that reads the K/V head) streamed through
//! workgroup memory. Same [`Flash`] problem and uniform as the fused forward.

use super::flash_backward_dot::{partials, BackwardTiles};
use super::flash_tiled::{Flash, FlashParams};
use super::mods::ModsBind;
use super::wgsl::constants;
use super::{record_with, u32_of, Dim, Kernel, KernelId, MaskArg, Slot};
use crate::error::Result;
use crate::gpu::Device;

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
        ctx: &Device,
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
