//! A forward pass that keeps what its backward pass needs, and that backward pass: the fused
//! FlashAttention-2 backward on the device (`kernels/flash_backward_*.rs`).
//!
//! A call on Q, K and V with [`Attention::save_for_backward`] on ([`Call::run`] on arrays
//! comes here, to [`forward`]; [`Call::record`] on tensors, to [`record`]) runs the fused
//! forward with its row statistics on (each row's log-sum-exp, written by the forward kernel
//! itself) and returns, beside the output, a [`SdpaSaved`] (the public [`crate::Saved`] wraps it) holding Q, K,
//! V, the output O, the statistics and the mask on the device. [`SdpaSaved::backward`]
//! (behind [`crate::Saved::backward`]) takes `dO` and runs three kernels in one encoder:
//! `D_i = dO_i·O_i`, then dK and dV (one key per thread, over every query row of every query
//! head that reads the K/V head), then dQ (one query row per thread); the probabilities are
//! recomputed tile by tile, no n × n matrix exists anywhere.

use ndarray::{Array2, Array3, Array4, ArrayView4};

use super::call::Call;
use super::dispatch::Shape;
use super::gradients::SdpaGradients;
use super::plan::Plan;
use super::upload::MaskBuffer;
use super::{Attention, Output, TensorOutput};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::gpu::buffer::{self, Buf};
use crate::gpu::oneshot::block_on;
use crate::gpu::readback;
use crate::gpu::timing;
use crate::gpu::upload::{self, Stored, Values};
use crate::kernels::flash_tiled::{Flash, FlashOut};
use crate::tensor::{Recorder, Tensor};
use crate::variant;

mod kernels;
mod tensors;

pub(super) use kernels::{record_table_grad, BackwardKernels};
pub(crate) use tensors::SdpaTensorGradients;

/// What a saved forward on Q, K, V ([`forward`], [`record`]) keeps on the device for its backward pass:
/// Q, K and V as uploaded (f16 under [`crate::Dtype::F16`]), the output O, each query row's
/// log-sum-exp, the mask (with key lengths, causal and its score/mask modifiers, whose
/// upload the backward binds again), the scale, the grouped-query layout and the dtype,
/// and which [`Context`] holds them.
///
/// The log-sum-exp is of the row's scores in the log2 domain, `log2 Σ_j 2^(s_ij·log2 e)`
/// with `s_ij = mod(scale·q_i·k_j) + mask_ij`, `mod` the score modifiers if any (so
/// `P_ij = 2^(s_ij·log2 e − lse_i)`); a row with nothing to attend to stores 3e38, which
/// makes every probability of it exactly 0.
/// [`SdpaSaved::log_sum_exp`] reads it back in natural-log units.
pub(crate) struct SdpaSaved {
    ctx_id: u64,
    op: Attention,
    flash: Flash,
    out_shape: [usize; 4],
    k_shape: [usize; 4],
    v_shape: [usize; 4],
    qkv: [wgpu::Buffer; 3],
    /// Q, K and V when they came as tensors ([`SdpaSaved`]'s tensor form), kept alive (their
    /// pooled buffers are `qkv`).
    _inputs: Option<[Tensor; 3]>,
    /// Q, K and V uploaded from arrays (the array form), kept alive (`qkv` are theirs).
    _uploads: Vec<crate::gpu::buffer::Buf>,
    /// Q, K, V, the output and the gradients are heads-first, `(batch, heads, rows, width)`
    /// (the array form: the caller's layout, read and written in place); else in rows,
    /// `(batch, rows, heads·width)` (the tensor form).
    heads_first: bool,
    /// The output, in the layout `heads_first` says.
    o: Tensor,
    /// `2·batch·heads·L` f32s: each row's log-sum-exp, then (written by each backward) its
    /// `D_i = dO_i·O_i`.
    stats: crate::gpu::buffer::Buf,
    mask: Option<MaskBuffer>,
    /// The backward's kernels: the subgroup family's (rows per lane) when the forward ran
    /// on it, else the storage family's, with their tiles.
    kernels: BackwardKernels,
}

impl std::fmt::Debug for SdpaSaved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SdpaSaved")
            .field("output", &self.out_shape)
            .field("k", &self.k_shape)
            .field("v", &self.v_shape)
            .field("causal", &self.flash.causal)
            .field("scale", &self.flash.scale)
            .field("mask", &self.mask.is_some())
            .finish_non_exhaustive()
    }
}

impl SdpaSaved {
    /// [`record_table_grad`] of this saved forward.
    fn record_table_grad(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        d_o: &wgpu::Buffer,
    ) -> Result<Option<(crate::gpu::buffer::Buf, [usize; 2])>> {
        let [q, k, v] = &self.qkv;
        let saved = ([q, k, v], d_o, &*self.stats);
        record_table_grad(ctx, encoder, &self.flash, saved, self.mask.as_ref())
    }
}

/// Ours, `(batch, rows, heads·width)` flat, back into `(batch, heads, rows, width)`.
fn from_rows(flat: Vec<f32>, [b, h, n, w]: [usize; 4]) -> Result<Array4<f32>> {
    let a = Array4::from_shape_vec((b, n, h, w), flat).map_err(|e| Error::shape(e.to_string()))?;
    Ok(a.permuted_axes([0, 2, 1, 3])
        .as_standard_layout()
        .into_owned())
}

/// What a saved forward on Q, K, V makes before it records: its fused kernel's problem, its
/// plan, the mask's buffer, and the output and row statistics it writes (the array and
/// tensor forms share it).
struct Forward {
    flash: Flash,
    plan: Plan,
    mask: Option<MaskBuffer>,
    o: Buf,
    stats: Buf,
}

impl Forward {
    /// For `call` (checked), on Q, K and V heads-first (`heads_first`, the caller's arrays)
    /// or in rows (tensors).
    ///
    /// # Errors
    /// Sizes past u32 indexing; planning; GPU errors.
    fn new(ctx: &Context, call: &Call<'_, '_, '_>, heads_first: bool) -> Result<Self> {
        let (op, dims) = (&call.op, &call.dims);
        let shape = Shape::sdpa(
            dims,
            [dims.batch, dims.heads, dims.kv_heads, dims.n, call.n_kv],
        );
        let shape = match heads_first {
            true => shape.heads_first(),
            false => shape,
        };
        let mut flash = shape.flash(dims.causal, dims.scale, op.f16(), false)?;
        flash.key_split = op.key_split;
        let (bias, mods) = call.masking();
        let plan = op.resolved(ctx, op.plan(ctx, dims)?, &flash, mods.is_some())?;
        let mask = ctx.scoped(|| MaskBuffer::upload(ctx, bias.as_ref(), mods))?;
        let rows = dims.batch * dims.heads * dims.n;
        Ok(Forward {
            flash,
            plan,
            mask,
            o: buffer::output(ctx, "context", rows * dims.d_v / dims.heads, op.nan_fill)?,
            stats: buffer::output(ctx, "row statistics", 2 * rows, op.nan_fill)?,
        })
    }

    /// Records the fused kernel of `plan` on `qkv` into `encoder`, with its row statistics.
    fn record(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        plan: &Plan,
        [q, k, v]: &[wgpu::Buffer; 3],
    ) -> Result<()> {
        let out = FlashOut {
            context: &self.o,
            lse: Some(&self.stats),
        };
        let m = self.mask.as_ref().map(MaskBuffer::arg);
        variant::record_flash(
            ctx,
            encoder,
            &self.flash,
            plan.flash,
            (q, k, v),
            out,
            m,
            None,
        )
        .map(drop)
    }

    /// `attempt` with the plan, on the storage kernels past the textures' limit
    /// ([`Attention::with_storage_fallback`], which leaves the plan that ran).
    fn retried<T>(
        &mut self,
        ctx: &Context,
        call: &Call<'_, '_, '_>,
        mut attempt: impl FnMut(&Self, &Plan) -> Result<T>,
    ) -> Result<T> {
        let mut plan = self.plan;
        let fallback = (&call.dims, &self.flash, call.mods.is_some());
        let result = call
            .op
            .with_storage_fallback(ctx, fallback, &mut plan, |plan| attempt(self, plan));
        self.plan = plan;
        result
    }

    /// The output's shape, `(batch, heads, L, E_v)`.
    fn out_shape(call: &Call<'_, '_, '_>) -> [usize; 4] {
        let d = &call.dims;
        [d.batch, d.heads, d.n, d.d_v / d.heads]
    }

    /// What the backward keeps: Q, K and V (`inputs` when they came as tensors, in rows;
    /// else `uploads`, heads-first), the output made a tensor by `o`.
    fn saved(
        self,
        ctx: &Context,
        call: &Call<'_, '_, '_>,
        qkv: [wgpu::Buffer; 3],
        (inputs, uploads): (Option<[Tensor; 3]>, Vec<Buf>),
        o: impl FnOnce(Buf) -> Tensor,
    ) -> SdpaSaved {
        let d = &call.dims;
        let out_shape = Forward::out_shape(call);
        let kv = [d.batch, d.kv_heads, call.n_kv];
        let heads_first = inputs.is_none();
        SdpaSaved {
            ctx_id: ctx.id(),
            op: call.op,
            out_shape,
            k_shape: [kv[0], kv[1], kv[2], d.d_k / d.heads],
            v_shape: [kv[0], kv[1], kv[2], out_shape[3]],
            qkv,
            _inputs: inputs,
            _uploads: uploads,
            heads_first,
            o: o(self.o),
            stats: self.stats,
            kernels: BackwardKernels::choose(ctx, self.plan.flash, &self.flash, self.mask.as_ref()),
            mask: self.mask,
            flash: self.flash,
        }
    }
}

/// The saved forward of a checked call on Q, K, V arrays (or opened files): uploaded
/// heads-first as they are, checked on the way up (NaN/Inf always: a gradient through them
/// means nothing); the fused kernel keeping each row's log-sum-exp; the output read back.
/// Always the fused path: the weights are not returned, and the call is never split.
///
/// # Errors
/// NaN/Inf in Q, K or V; overflow in the output; GPU errors.
pub(super) fn forward(
    ctx: &Context,
    call: &Call<'_, '_, '_>,
    [q, k, v]: &[Values<'_>; 3],
) -> Result<(Output, SdpaSaved)> {
    let op = &call.op;
    let mut fwd = Forward::new(ctx, call, true)?;
    let how = Stored {
        f16: op.f16(),
        finite: true,
        dry: false,
    };
    let named = [("Q", q.clone()), ("K", k.clone()), ("V", v.clone())];
    let uploads = upload::arrays(ctx, &named, how)?;
    let qkv: [wgpu::Buffer; 3] = std::array::from_fn(|i| (*uploads[i]).clone());
    let out_shape = Forward::out_shape(call);
    let len = out_shape.iter().product();
    let (context, _) = fwd.retried(ctx, call, |fwd, plan| {
        ctx.scoped(|| {
            // Declared first, dropped last: buffers dropped while recording (a key split's
            // partials) are not handed out before this encoder is submitted.
            let _open = ctx.pool.open();
            let mut encoder = ctx
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("attention (saved)"),
                });
            timing::begin(ctx);
            fwd.record(ctx, &mut encoder, plan, &qkv)?;
            block_on(op.read_back(ctx, encoder, &fwd.o, len, None))
        })
    })?;
    log::info!("saved forward: {}", fwd.plan);
    let output = Output::new(
        Array4::from_shape_vec(out_shape, context)
            .map_err(|e| Error::shape(e.to_string()))?
            .into_dyn(),
        None,
    );
    let written = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let saved = fwd.saved(ctx, call, qkv, (None, uploads), |o| {
        Tensor::new(ctx, o, out_shape.to_vec(), crate::Dtype::F32, written)
    });
    Ok((output, saved))
}

/// The saved forward of a checked call on Q, K, V tensors in the rows layout (`q`
/// `(batch, L, heads, E)`, `k` `(batch, S, kv_heads, E)`, `v` `(batch, S, kv_heads, E_v)`),
/// recorded into `rec`: the output `(batch, L, heads, E_v)` is a tensor of `rec`, and the
/// [`SdpaSaved`] can record its backward into `rec` too ([`SdpaSaved::record_backward`]).
/// NaN/Inf are not scanned for: a tensor was checked when it was made.
///
/// # Errors
/// Tensors from a recorder not submitted yet; GPU errors.
pub(super) fn record(
    rec: &mut Recorder<'_>,
    call: &Call<'_, '_, '_>,
    [q, k, v]: [&Tensor; 3],
) -> Result<(TensorOutput, SdpaSaved)> {
    let ctx = rec.ctx;
    let qkv = [
        q.input(rec, "Q")?.clone(),
        k.input(rec, "K")?.clone(),
        v.input(rec, "V")?.clone(),
    ];
    let mut fwd = Forward::new(ctx, call, false)?;
    fwd.retried(ctx, call, |fwd, plan| {
        ctx.scoped(|| fwd.record(ctx, rec.encoder(), plan, &qkv))
    })?;
    let [b, h, l, e_v] = Forward::out_shape(call);
    let wrap = rec.wrapper();
    let inputs = Some([q.clone(), k.clone(), v.clone()]);
    let saved = fwd.saved(ctx, call, qkv, (inputs, Vec::new()), |o| {
        wrap(o, vec![b, l, h, e_v])
    });
    Ok((TensorOutput::new(saved.o.clone(), None), saved))
}

impl SdpaSaved {
    /// The gradients of a loss `ℓ` with respect to the forward's Q, K and V, given
    /// `d_o = ∂ℓ/∂output`, computed on the device by the fused backward (f32 arithmetic,
    /// f32 results; see the module documentation). With grouped-query attention the
    /// gradient of a shared K/V head is the sum over the query heads that read it. A row
    /// with nothing to attend to has zero gradients and adds nothing to any key or value.
    ///
    /// # Errors
    /// "backward without a matching forward" ([`Error::InvalidArgument`] for a `SdpaSaved` from
    /// another [`Context`], [`Error::ShapeMismatch`] for a `d_o` not of the output's shape);
    /// [`Error::NonFinite`] for NaN/Inf in `d_o`; [`Error::Overflow`] for a gradient that
    /// overflowed; GPU errors.
    pub(crate) fn backward(
        &self,
        ctx: &Context,
        d_o: ArrayView4<'_, f32>,
    ) -> Result<SdpaGradients> {
        if ctx.id() != self.ctx_id {
            return Err(Error::invalid(
                "backward",
                "backward without a matching forward: this SdpaSaved was made on another Context; \
                 run the saved forward on the Context the backward runs on",
            ));
        }
        if d_o.shape() != self.out_shape {
            return Err(Error::shape(format!(
                "backward without a matching forward: dO has shape {:?}, the forward's output \
                 (batch, heads, L, E_v) has {:?}",
                d_o.shape(),
                self.out_shape
            )));
        }
        ctx.check_alive()?;
        let f = &self.flash;
        let [q_len, k_len, v_len] = [
            f.batch * f.heads * f.n_q * f.dk_h,
            self.k_shape.iter().product(),
            self.v_shape.iter().product::<usize>(),
        ];
        // In the forward's layout, checked on the way up.
        let how = Stored {
            f16: false,
            finite: true,
            dry: false,
        };
        let d_o = match self.heads_first {
            true => upload::array(ctx, "dO", &d_o.into_dyn(), how)?,
            false => {
                // Checked first, so that an error has the caller's index, then permuted.
                crate::values::check_finite("dO", &d_o)?;
                let rows = d_o.permuted_axes([0, 2, 1, 3]);
                let how = Stored {
                    finite: false,
                    ..how
                };
                upload::array(ctx, "dO", &rows.into_dyn(), how)?
            }
        };
        let nan = self.op.nan_fill;
        let dq = buffer::output(ctx, "dQ", q_len, nan)?;
        let dk = buffer::output(ctx, "dK", k_len, nan)?;
        let dv = buffer::output(ctx, "dV", v_len, nan)?;
        let (flat, table_shape) = ctx.scoped(|| {
            // As in the forward: the table gradient's scratch is not reused before the submit.
            let _open = ctx.pool.open();
            let mut encoder = ctx
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("attention backward"),
                });
            timing::begin(ctx);
            let [q, k, v] = &self.qkv;
            let mask = self.mask.as_ref().map(MaskBuffer::arg);
            let saved = (&*d_o, self.o.buffer(ctx, "O")?, &*self.stats);
            self.kernels.record(
                ctx,
                &mut encoder,
                f,
                (q, k, v),
                saved,
                (&dq, &dk, &dv),
                mask,
            )?;
            let table = self.record_table_grad(ctx, &mut encoder, &d_o)?;
            let mut pending = vec![
                readback::copy_out(ctx, &mut encoder, &dq, q_len),
                readback::copy_out(ctx, &mut encoder, &dk, k_len),
                readback::copy_out(ctx, &mut encoder, &dv, v_len),
            ];
            if let Some((t, [rows, cols])) = &table {
                pending.push(readback::copy_out(ctx, &mut encoder, t, rows * cols));
            }
            let table_shape = table.map(|(_, shape)| shape);
            let read = timing::submit_and_read_scanned_async(ctx, encoder, pending);
            crate::gpu::oneshot::block_on(read).map(|flat| (flat, table_shape))
        })?;
        // Each checked for overflow while it was copied out.
        let mut flat = flat.into_iter();
        let mut next = |what: &str| -> Result<Vec<f32>> {
            let (values, bad) = flat.next().unwrap_or_default();
            crate::values::overflow_at(what, self.op.dtype, bad)?;
            Ok(values)
        };
        let (dq, dk, dv) = (
            next("gradient dQ")?,
            next("gradient dK")?,
            next("gradient dV")?,
        );
        let relative_bias = match table_shape {
            Some(shape) => Some(
                Array2::from_shape_vec(shape, next("gradient of the relative bias table")?)
                    .map_err(|e| Error::shape(e.to_string()))?,
            ),
            None => None,
        };
        let [b, h, l, _] = self.out_shape;
        let shaped = |flat: Vec<f32>, shape: [usize; 4]| match self.heads_first {
            true => Array4::from_shape_vec(shape, flat).map_err(|e| Error::shape(e.to_string())),
            false => from_rows(flat, shape),
        };
        Ok(SdpaGradients {
            q: shaped(dq, [b, h, l, f.dk_h])?,
            k: shaped(dk, self.k_shape)?,
            v: shaped(dv, self.v_shape)?,
            relative_bias,
        })
    }

    /// Each query row's log-sum-exp `ln Σ_j exp(s_ij)` of its scores
    /// `s_ij = scale·q_i·k_j + mask_ij`, `(batch, heads, L)`, as the forward saved it (read
    /// back from the device); `-inf` for a row with nothing to attend to (PyTorch's
    /// `logsumexp` of nothing).
    ///
    /// # Errors
    /// A `SdpaSaved` from another [`Context`]; GPU errors.
    pub(crate) fn log_sum_exp(&self, ctx: &Context) -> Result<Array3<f32>> {
        if ctx.id() != self.ctx_id {
            return Err(Error::invalid(
                "log_sum_exp",
                "this SdpaSaved was made on another Context",
            ));
        }
        let [b, h, l, _] = self.out_shape;
        let values = ctx.scoped(|| readback::read_as(ctx, &self.stats, b * h * l, false))?;
        let natural = values
            .into_iter()
            .map(|x| {
                if x >= 1.0e38 {
                    f32::NEG_INFINITY
                } else {
                    x / std::f32::consts::LOG2_E
                }
            })
            .collect();
        Array3::from_shape_vec((b, h, l), natural).map_err(|e| Error::shape(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::kernels::queries_fit_textures;
    use super::*;
    use crate::attention::call::Given;
    use crate::context::test_context;
    use crate::kernels::flash_backward_dot::BackwardTiles;
    use crate::mask::Mask;
    use crate::modifiers::Preset;
    use crate::reference;
    use crate::variant::FlashVariant;

    #[test]
    fn long_queries_past_the_texture_limit_take_the_storage_backward() {
        let shape = Shape {
            batch: 2,
            heads: 8,
            kv_heads: 8,
            n_q: 1 << 22,
            n_kv: 64,
            d_k: 512,
            d_v: 512,
            heads_first: false,
        };
        let f = shape.flash(false, 1.0, false, false).unwrap();
        assert!(!queries_fit_textures(16384, &f));
        let short = Shape { n_q: 1000, ..shape }
            .flash(false, 1.0, false, false)
            .unwrap();
        assert!(queries_fit_textures(16384, &short));
    }

    /// The storage backward with a GPU's tiles (several threads per key and per row, sums
    /// of partial scores through workgroup memory; E = 72 splits a key over 5 threads), run
    /// here on whatever adapter the tests have, against the f64 reference: GQA, causal, a
    /// mask, key lengths, odd sizes, and score and mask modifiers (soft-capping, ALiBi, a
    /// window).
    #[test]
    fn gpu_tiles_match_the_reference() {
        let ctx = test_context();
        let f = |salt: f32| {
            move |(a, b, c, d): (usize, usize, usize, usize)| {
                ((a * 31 + b * 17 + c * 7 + d) as f32 * salt).sin()
            }
        };
        let keep = ndarray::Array2::from_shape_fn((37, 45), |(i, j)| (i + 2 * j) % 7 != 0);
        let mods = crate::modifiers::Modifiers::new()
            .preset(Preset::Alibi(Preset::alibi_slopes(4)))
            .preset(Preset::Softcap(1.5))
            .preset(Preset::Window { left: 20, right: 0 });
        let mask = Mask::boolean(keep.view().into_dyn()).with_kv_lengths(&[45, 30]);
        let with_mods = mask.clone().with_modifiers(&mods);
        let op = Attention::new()
            .causal(true)
            .save_for_backward(true)
            .options(
                crate::Options::default()
                    .nan_fill(true)
                    .flash_variant(FlashVariant::Blocked { rows: 32, keys: 32 }),
            );
        let odd = BackwardTiles {
            owners: 8,
            split: 3,
            tile: 5,
        };
        for (e, ev, tiles, mask) in [
            (20, 12, BackwardTiles::GPU, &mask),
            (20, 12, odd, &mask),
            (72, 9, BackwardTiles::GPU, &mask),
            (20, 12, odd, &with_mods),
            (72, 9, BackwardTiles::GPU, &with_mods),
        ] {
            let q = Array4::from_shape_fn((2, 4, 37, e), f(0.13));
            let k = Array4::from_shape_fn((2, 2, 45, e), f(0.29));
            let v = Array4::from_shape_fn((2, 2, 45, ev), f(0.41));
            let d_o = Array4::from_shape_fn((2, 4, 37, ev), f(0.07));
            let want =
                reference::sdpa_backward(&op, q.view(), k.view(), v.view(), d_o.view(), mask)
                    .unwrap();
            let values = [q.view(), k.view(), v.view()].map(|a| Values::Array(a.into_dyn()));
            let call = Call::new(&op, ctx, Given::Qkv(values.clone()), mask).unwrap();
            let (_, mut saved) = forward(ctx, &call, &values).unwrap();
            saved.kernels.tiles = tiles;
            let g = saved.backward(ctx, d_o.view()).unwrap();
            for (got, want) in [(&g.q, &want.q), (&g.k, &want.k), (&g.v, &want.v)] {
                let got = got.clone().into_dyn();
                let (rel, _) = reference::compare(&got, &want.clone().into_dyn());
                let mods = mask.modifiers().is_some();
                assert!(rel < 1e-5, "E={e} {tiles:?} modifiers={mods}: {rel:e}");
            }
        }
    }
}
