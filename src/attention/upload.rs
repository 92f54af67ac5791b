//! Upload: the call's operands onto the device. Q, K and V come from the host (a call on Q,
//! K, V), or from X and the projections, projected on the device in the same encoder (a call
//! on X with projections); with neither, Q = K = V = X is uploaded once. Masks go up in the
//! kernels' layout.

use std::borrow::Cow;

use ndarray::{ArrayView, ArrayView4, ArrayViewD, Dimension};

use super::plan::Plan;
use super::projections::Projections;
use super::weights::DeviceWeights;
use super::Attention;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::gpu::buffer::Buf;
use crate::gpu::upload::{self, Stored, Values};
use crate::kernels::mods::ModsUpload;
use crate::kernels::{u32_of, MaskArg};
use crate::modifiers::Modifiers;

/// Where a call's Q, K and V come from.
// One per call, on the stack: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum Source<'a, 'p> {
    /// From the host, each `(batch, heads, rows, width)` (PyTorch's layout; arrays of any
    /// strides, or opened `.npy` files); their values checked on the way up when `check`.
    Qkv {
        values: [Values<'a>; 3],
        check: bool,
    },
    /// X `(…, n, d)` and its projections; without them Q = K = V = X.
    Projected {
        x: &'a ArrayViewD<'a, f32>,
        proj: Option<&'a Projections<'p>>,
        /// The projections' weights when they are on the device already (a layer's).
        weights: Option<&'a DeviceWeights>,
    },
    /// Q, K and V on the device already, each `(batch, rows, heads·width)`.
    DeviceQkv([&'a wgpu::Buffer; 3]),
    /// X on the device already (f16 when `x_f16`), projected by `weights` if any.
    DeviceX {
        x: &'a wgpu::Buffer,
        x_f16: bool,
        weights: Option<&'a DeviceWeights>,
    },
}

impl<'p> Source<'_, 'p> {
    /// The projections' weights when they are on the device already.
    pub(super) fn weights(&self) -> Option<&DeviceWeights> {
        match self {
            Source::Projected { weights, .. } | Source::DeviceX { weights, .. } => *weights,
            Source::Qkv { .. } | Source::DeviceQkv(_) => None,
        }
    }

    /// What kind of source it is, as far as it decides the kernels a call records (for
    /// [`Attention::prepare_pipelines`]).
    pub(super) fn kind(&self) -> String {
        let projected = self.weights().is_some() || self.projections().is_some();
        match self {
            Source::Qkv { .. } => "qkv".to_string(),
            Source::DeviceQkv(_) => "device-qkv".to_string(),
            Source::Projected { .. } => format!("x projected={projected}"),
            Source::DeviceX { x_f16, .. } => format!("device-x f16={x_f16} projected={projected}"),
        }
    }

    /// The host projections, to upload for this call.
    pub(super) fn projections(&self) -> Option<&Projections<'p>> {
        match self {
            Source::Projected { proj, .. } => *proj,
            _ => None,
        }
    }
}

/// Q, K and V on the device, and the host copy of K = V when they are one host array.
pub(super) struct Uploaded<'a> {
    q: Buf,
    /// K and V, when they are not Q's buffer.
    kv: Option<(Buf, Buf)>,
    host: Option<Cow<'a, [f32]>>,
}

impl Uploaded<'_> {
    /// The Q, K and V buffers.
    pub(super) fn qkv(&self) -> (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer) {
        match &self.kv {
            Some((k, v)) => (&self.q, k, v),
            None => (&self.q, &self.q, &self.q),
        }
    }

    /// The contents of K = V when they are one host array (the subgroup kernel then packs
    /// them on the CPU).
    pub(super) fn host_kv(&self) -> Option<&[f32]> {
        self.host.as_deref()
    }
}

impl Attention {
    /// Uploads `source` (recording the projections into `encoder` when it has them) as
    /// `rows · d` values of X or the Q, K and V of a call on Q, K, V.
    pub(super) fn upload<'a>(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        plan: &Plan,
        (rows, d): (usize, usize),
        source: &'a Source<'_, '_>,
        weights: Option<&DeviceWeights>,
    ) -> Result<Uploaded<'a>> {
        let f16 = self.f16();
        match source {
            Source::Qkv {
                values: [q, k, v],
                check,
            } => {
                let how = stored(f16, *check && !self.propagate);
                let named = [("Q", q.clone()), ("K", k.clone()), ("V", v.clone())];
                let mut bufs = upload::arrays(ctx, &named, how)?.into_iter();
                let mut next = || {
                    bufs.next()
                        .ok_or_else(|| Error::invalid("upload", "internal: a buffer is missing"))
                };
                Ok(Uploaded {
                    q: next()?,
                    kv: Some((next()?, next()?)),
                    host: None,
                })
            }
            Source::DeviceQkv([q, k, v]) => Ok(Uploaded {
                q: Buf::unpooled((*q).clone()),
                kv: Some((Buf::unpooled((*k).clone()), Buf::unpooled((*v).clone()))),
                host: None,
            }),
            Source::DeviceX { x, x_f16, .. } => match weights {
                Some(w) => {
                    let (q, k, v) =
                        self.record_projections(ctx, encoder, plan, (rows, d), (x, *x_f16), w)?;
                    Ok(Uploaded {
                        q,
                        kv: Some((k, v)),
                        host: None,
                    })
                }
                None => Ok(Uploaded {
                    q: Buf::unpooled((*x).clone()),
                    kv: None,
                    host: None,
                }),
            },
            Source::Projected { x, .. } if weights.is_some() => {
                let how = stored(f16, !self.propagate);
                let x_buf = upload::array(ctx, "X", &x.view(), how)?;
                let w = weights.ok_or_else(|| Error::invalid("weights", "internal: none"))?;
                let (q, k, v) =
                    self.record_projections(ctx, encoder, plan, (rows, d), (&x_buf, f16), w)?;
                Ok(Uploaded {
                    q,
                    kv: Some((k, v)),
                    host: None,
                })
            }
            Source::Projected { x, .. } => {
                // Checked here, not while uploading: the host copy below is kept (the
                // subgroup kernel packs K = V = X from it). Once, not again in the dry run.
                if !crate::kernels::collecting() {
                    if !self.propagate {
                        crate::values::check_finite("X", x)?;
                    }
                    if f16 {
                        crate::values::check_f16_range("X", x)?;
                    }
                }
                let mut x_host = contiguous(x);
                if f16 {
                    // What the device holds, for packing K = V = X on the host too.
                    for v in x_host.to_mut() {
                        *v = half::f16::from_f32(*v).to_f32();
                    }
                }
                let how = stored(f16, false);
                let x_buf = upload::array(ctx, "X", &ndarray::aview1(&x_host).into_dyn(), how)?;
                Ok(Uploaded {
                    q: x_buf,
                    kv: None,
                    host: Some(x_host),
                })
            }
        }
    }
}

/// How a call's operand goes up: as f16 or f32, checked for NaN/Inf when `finite`, and only
/// as a buffer, without its contents, in the pipeline dry run (which records nothing).
pub(super) fn stored(f16: bool, finite: bool) -> Stored {
    Stored {
        f16,
        finite,
        dry: crate::kernels::collecting(),
    }
}

/// Uploads an array (any layout) as f32 or f16 in one pass (`gpu::upload`: no
/// intermediate copy, staging reused) into a buffer of its own, which the caller keeps (a
/// weight, a bias, a layer's saved X). Its values are not checked here (the callers check
/// them where they need to).
pub(super) fn upload_as<D: Dimension>(
    ctx: &Context,
    label: &str,
    a: ArrayView<'_, f32, D>,
    f16: bool,
) -> Result<wgpu::Buffer> {
    let how = Stored {
        f16,
        finite: false,
        dry: false,
    };
    Ok(upload::array(ctx, label, &a.into_dyn(), how)?.detach())
}

/// The elements of an array in row-major order, copied only when it is not already.
fn contiguous<'a, D: Dimension>(a: &'a ArrayView<'_, f32, D>) -> Cow<'a, [f32]> {
    match a.as_slice() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(a.iter().copied().collect()),
    }
}

/// A mask uploaded for the kernels: its bias, its modifiers, or both.
pub(super) struct MaskBuffer {
    buffer: Option<Buf>,
    strides: [u32; 4],
    mods: Option<std::sync::Arc<ModsUpload>>,
}

impl MaskBuffer {
    /// The resolved bias and the modifiers on the device, or `None` with neither.
    pub(super) fn upload(
        ctx: &Context,
        bias: Option<&ArrayView4<'_, f32>>,
        mods: Option<&Modifiers>,
    ) -> Result<Option<Self>> {
        if bias.is_none() && mods.is_none() {
            return Ok(None);
        }
        // Equal modifiers share one upload (and its block maps) per device.
        let mods = mods.map(|m| ModsUpload::shared(ctx, m)).transpose()?;
        let Some(bias) = bias else {
            return Ok(Some(MaskBuffer {
                buffer: None,
                strides: [0; 4],
                mods,
            }));
        };
        let (data, strides) = crate::mask::gpu_layout(bias);
        let how = stored(false, false);
        let buffer = upload::array(ctx, "mask", &ndarray::aview1(&data).into_dyn(), how)?;
        let mut s = [0u32; 4];
        for (out, stride) in s.iter_mut().zip(strides) {
            *out = u32_of("mask stride", stride)?;
        }
        Ok(Some(MaskBuffer {
            buffer: Some(buffer),
            strides: s,
            mods,
        }))
    }

    /// The storage bindings the modifiers add to a kernel's own (see
    /// [`crate::kernels::mods::ModsUpload::storage_bindings`]).
    pub(super) fn mods_bindings(&self) -> usize {
        self.mods.as_ref().map_or(0, |m| m.storage_bindings())
    }

    /// As the kernels take it.
    pub(super) fn arg(&self) -> MaskArg<'_> {
        MaskArg {
            buffer: self.buffer.as_deref(),
            strides: self.strides,
            mods: self.mods.as_deref(),
        }
    }
}
