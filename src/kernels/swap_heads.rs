//! `shaders/swap_heads.wgsl`: the rows layout `(batch, tokens, heads, width)` to the
//! heads-first layout `(batch, heads, tokens, width)` and back, on the device, each row
//! zero-padded to a chosen width. The decode path uses it to move the projections' K and V
//! into the KV cache's row order, Q into the decode kernel's padded rows, and the decode
//! output back into the rows the output projection reads, without a round trip to the host.

use super::wgsl::{uniform, NoConstants};
use super::{record, u32_of, Dim, Kernel, KernelId, Slot};
use crate::error::{Error, Result};
use crate::gpu::Gpu;

/// The kernel.
pub(crate) struct Shader;

uniform! {
    /// The uniform block of `swap_heads.wgsl`.
    pub(crate) struct SwapParams {
        total: u32,
        n1: u32,
        n2: u32,
        w: u32,
        dw: u32,
        s0: u32,
        s1: u32,
        s2: u32,
        off: u32,
        _pad0: u32,
        _pad: [u32; 2],
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::SwapHeads;
    const WORKGROUP: [Dim; 3] = [Dim::Fixed(64), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[Slot::Read("src"), Slot::ReadWrite("dst")];
    /// Bit 0: the source is f16; bit 1: the destination is.
    const DTYPES: &'static [&'static str] = &["SRC_T", "DST_T"];
    type Consts = NoConstants;
    type Params = SwapParams;
}

/// Element `(i0, i1, i2, c)` of a source of shape `(n0, n1, n2, w)` at
/// `off + i0·s0 + i1·s1 + i2·s2 + c`, written to a dense `(n0, n2, n1, dw)` destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SwapHeads {
    /// The source's shape: `[n0, n1, n2]` and the row width `w`.
    pub n: [usize; 3],
    pub w: usize,
    /// The destination's row width (`≥ w`; zero-padded).
    pub dw: usize,
    /// The source's strides of the first three axes, and its first element (in elements).
    pub strides: [usize; 3],
    pub off: usize,
    /// Which of source and destination are f16.
    pub src_f16: bool,
    pub dst_f16: bool,
}

impl SwapHeads {
    /// A dense row-major source `(n0, n1, n2, w)` from element 0.
    pub fn dense(n: [usize; 3], w: usize, dw: usize) -> Self {
        SwapHeads {
            n,
            w,
            dw,
            strides: [n[1] * n[2] * w, n[2] * w, w],
            off: 0,
            src_f16: false,
            dst_f16: false,
        }
    }

    /// With these element types.
    pub fn types(mut self, src_f16: bool, dst_f16: bool) -> Self {
        (self.src_f16, self.dst_f16) = (src_f16, dst_f16);
        self
    }

    /// Elements the destination holds.
    pub fn dst_len(&self) -> usize {
        self.n.iter().product::<usize>() * self.dw
    }

    /// Records the copy of `src` into `dst`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a row would not fit its padded width;
    /// [`Error::LimitExceeded`] past u32 indexing; GPU errors.
    pub fn record(
        &self,
        ctx: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        dst: &wgpu::Buffer,
    ) -> Result<()> {
        if self.dw < self.w {
            return Err(Error::invalid(
                "swap_heads",
                format!("internal: rows of {} padded to {}", self.w, self.dw),
            ));
        }
        let total = u32_of("swapped elements", self.dst_len())?;
        let [s0, s1, s2] = self.strides;
        let last = self.off
            + self
                .n
                .iter()
                .zip(self.strides)
                .map(|(n, s)| n.saturating_sub(1) * s)
                .sum::<usize>()
            + self.w;
        u32_of("swapped source elements", last)?;
        let params = SwapParams {
            total,
            n1: u32_of("tokens", self.n[1])?,
            n2: u32_of("heads", self.n[2])?,
            w: u32_of("row width", self.w)?,
            dw: u32_of("padded row width", self.dw)?,
            s0: u32_of("batch stride", s0)?,
            s1: u32_of("token stride", s1)?,
            s2: u32_of("head stride", s2)?,
            off: u32_of("offset", self.off)?,
            _pad0: 0,
            _pad: [0; 2],
        };
        let f16 = u8::from(self.src_f16) | (u8::from(self.dst_f16) << 1);
        record::<Shader>(
            ctx,
            encoder,
            &NoConstants,
            f16,
            &params,
            &[src.into(), dst.into()],
            u64::from(total).div_ceil(64),
        )
    }
}
