//! `shaders/decode_combine.wgsl`: step 2 of a decode step, the key blocks' partial results
//! (see `decode_partial.rs`) merged into each query row's output.

use super::loops::{run, Build};
use super::wgsl::{constants, uniform};
use super::{record, u32_of, Dim, Kernel, KernelId, Slot};
use crate::error::Result;
use crate::gpu::Gpu;

/// The kernel.
pub(crate) struct Shader;

/// Threads per workgroup (the shader's literal).
const THREADS: usize = 64;

uniform! {
    /// The uniform block of `decode_combine.wgsl`.
    pub(crate) struct CombineParams {
        /// Output rows: `batch · heads · m`.
        rows: u32,
        /// Key blocks per row.
        blocks: u32,
        /// Output width d_v (unpadded).
        dv: u32,
        _pad: u32,
    }
}

constants! {
    /// Specialisation of `decode_combine.wgsl`.
    pub(crate) struct CombineConsts {
        /// d_v in vec4s, rounded up.
        dv4 => "DV4",
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::DecodeCombine;
    const WORKGROUP: [Dim; 3] = [Dim::Fixed(THREADS as u32), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Read("o_part"),
        Slot::Read("ml_part"),
        Slot::ReadWrite("out"),
    ];
    type Consts = CombineConsts;
    type Params = CombineParams;

    /// Two loops over the row's key blocks (the maximum, then the sums), and the store's
    /// `// unroll` loop of 4.
    fn loops(_: &CombineConsts, p: &CombineParams, b: Build) -> u64 {
        2 * run(u64::from(p.blocks)) + b.marked(4)
    }
}

/// Records the combine of `rows` rows' `blocks` partials (`o_part`, `ml_part`) into `out`,
/// `(rows, dv)` f32.
///
/// # Errors
/// A size over u32 indexing or the grid.
pub(crate) fn dispatch(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    (rows, blocks, dv): (usize, usize, usize),
    (o_part, ml_part): (&wgpu::Buffer, &wgpu::Buffer),
    out: &wgpu::Buffer,
) -> Result<()> {
    let dv4 = dv.div_ceil(4);
    let params = CombineParams {
        rows: u32_of("decode rows", rows)?,
        blocks: u32_of("key blocks", blocks)?,
        dv: u32_of("d_v", dv)?,
        _pad: 0,
    };
    u32_of("decode outputs", rows * dv4)?;
    record::<Shader>(
        ctx,
        encoder,
        &CombineConsts { dv4: dv4 as u32 },
        0,
        &params,
        &[o_part.into(), ml_part.into(), out.into()],
        (rows * dv4).div_ceil(THREADS) as u64,
    )
}
