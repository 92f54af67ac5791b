//! `shaders/adam.wgsl`: one Adam step on a parameter and its moments, in place on the device,
//! optionally mirrored into a packed copy of the parameter ([`Mirror`]).

use super::wgsl::{constants, uniform};
use super::{record, u32_of, Dim, Kernel, KernelId, Slot};
use crate::error::Result;
use crate::gpu::Gpu;

/// The kernel.
pub(crate) struct Shader;

uniform! {
    /// The uniform block of `adam.wgsl`: the hyper-parameters and step `t`'s bias
    /// corrections `c1 = 1 − β1^t`, `c2 = 1 − β2^t`.
    pub(crate) struct AdamParams {
        count: u32,
        lr: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        weight_decay: f32,
        c1: f32,
        c2: f32,
        /// The parameter's row width, and where its rows go in the mirror (see [`Mirror`]).
        cols: u32,
        mirror_row: u32,
        mirror_off: u32,
        _pad: u32,
    }
}

constants! {
    /// Specialisation of `adam.wgsl`.
    pub(crate) struct AdamConsts {
        /// 1: an f32 master copy beside an f16 parameter.
        master => "MASTER",
        /// 1: the new values are also written into a packed copy ([`Mirror`]).
        mirror => "MIRROR",
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::Adam;
    const WORKGROUP: [Dim; 3] = [Dim::Fixed(256), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Read("grad"),
        Slot::ReadWrite("param"),
        Slot::ReadWrite("m"),
        Slot::ReadWrite("v"),
        Slot::ReadWrite("master"),
        Slot::ReadWrite("mirror"),
    ];
    const DTYPES: &'static [&'static str] = &["P_T"];
    type Consts = AdamConsts;
    type Params = AdamParams;
}

/// A packed copy the step also writes (in the parameter's element type): the parameter,
/// `cols` values per row, has its row `r` at `buffer[off + r·row ..][..cols]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mirror<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub cols: usize,
    pub row: usize,
    pub off: usize,
}

/// Records one step over the first `params.count` elements of `param`, `m` and `v`, with
/// gradient `grad`; `master`, the f32 master copy of an f16 `param`; `mirror`, a packed copy
/// to write the new values into as well.
///
/// # Errors
/// A mirror past u32 indexing; GPU errors.
pub(crate) fn dispatch(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    params: &AdamParams,
    grad: &wgpu::Buffer,
    [param, m, v]: [&wgpu::Buffer; 3],
    master: Option<&wgpu::Buffer>,
    mirror: Option<Mirror<'_>>,
) -> Result<()> {
    let consts = AdamConsts {
        master: u32::from(master.is_some()),
        mirror: u32::from(mirror.is_some()),
    };
    let mut params = *params;
    if let Some(mi) = &mirror {
        let rows = (params.count as usize).div_ceil(mi.cols.max(1));
        u32_of(
            "mirror elements",
            mi.off + rows.saturating_sub(1) * mi.row + mi.cols,
        )?;
        params.cols = u32_of("parameter columns", mi.cols.max(1))?;
        params.mirror_row = u32_of("mirror row stride", mi.row)?;
        params.mirror_off = u32_of("mirror offset", mi.off)?;
    }
    // Writable bindings left untouched each take a stand-in of their own (no aliasing).
    let (spare0, spare1) = ctx.unused_outs();
    let master = master.unwrap_or(spare0);
    let mirror = mirror.map_or(spare1, |mi| mi.buffer);
    record::<Shader>(
        ctx,
        encoder,
        &consts,
        u8::from(consts.master == 1),
        &params,
        &[
            grad.into(),
            param.into(),
            m.into(),
            v.into(),
            master.into(),
            mirror.into(),
        ],
        u64::from(params.count).div_ceil(256),
    )
}

/// The uniform for `count` elements at step `t` (from 1).
///
/// # Errors
/// A count past u32.
pub(crate) fn params(
    count: usize,
    (lr, beta1, beta2, eps, weight_decay): (f32, f32, f32, f32, f32),
    t: u32,
) -> Result<AdamParams> {
    let t = i32::try_from(t).unwrap_or(i32::MAX);
    Ok(AdamParams {
        count: u32_of("parameter elements", count)?,
        lr,
        beta1,
        beta2,
        eps,
        weight_decay,
        c1: (1.0 - f64::from(beta1).powi(t)) as f32,
        c2: (1.0 - f64::from(beta2).powi(t)) as f32,
        cols: 1,
        mirror_row: 0,
        mirror_off: 0,
        _pad: 0,
    })
}
