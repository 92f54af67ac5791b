//! A call whose buffers fit the device, start to end: the plan, then one encoder with the
//! upload, the dispatch sequence and the copies out, one submit, the readback, and the
//! outputs shaped as the caller's API returns them ([`Attention::run_whole`]). A call on X
//! and one on Q, K, V differ only in where Q, K and V come from ([`Source`]) and in the
//! layout they return.

use ndarray::{ArrayD, ArrayView4, IxDyn};

use super::dispatch::Shape;
use super::plan::Plan;
use super::shape::Dims;
use super::upload::{MaskBuffer, Source};
use super::weights::DeviceWeights;
use super::{Attention, Output};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::gpu::buffer::Buf;
use crate::gpu::timing;
use crate::modifiers::Modifiers;

/// The flat context `(batch, n_q, width)` and weights `(batch, heads, n_q, n_kv)` read back.
type Flat = (Vec<f32>, Option<Vec<f32>>);

impl Attention {
    /// A checked call whose buffers fit the device, start to end, on X or on Q, K, V from the
    /// host (`source`; Q, K, V as they are, arrays or opened files, the kernels reading them
    /// and writing the context heads-first through their strides): planned (or with `given`,
    /// a split part's: the whole call's plan; [`Attention::whole_plan`]), then inside error
    /// scopes one encoder with upload → projections → attention → output projection →
    /// copies out ([`Attention::record_call`], on the storage kernels past the textures'
    /// limit: [`Attention::with_storage_fallback`]), one submit, the readback, and the
    /// outputs shaped as the caller's ([`shaped`]). `dims` are the call's
    /// ([`Attention::dims`], [`Attention::sdpa_dims`]).
    pub(super) async fn run_whole(
        &self,
        ctx: &Context,
        dims: &Dims,
        source: Source<'_, '_>,
        (bias, mods): (Option<ArrayView4<'_, f32>>, Option<&Modifiers>),
        given: Option<Plan>,
    ) -> Result<Output> {
        let (shape, [context_shape, weights_shape]) = match &source {
            Source::Qkv { values, .. } => {
                let (b, h, l, s_len) = (dims.batch, dims.heads, dims.n, values[1].shape()[2]);
                let shape = Shape::sdpa(dims, [b, h, dims.kv_heads, l, s_len]).heads_first();
                (shape, [vec![b, h, l, dims.d_v / h], vec![b, h, l, s_len]])
            }
            _ => (
                Shape::self_attention(dims),
                [dims.context_shape(), dims.weights_shape()],
            ),
        };
        let masking = (bias.as_ref(), mods);
        let (mut plan, flash) = self.whole_plan(ctx, dims, shape, &source, masking, given)?;
        let call = async {
            // Declared first, dropped last: the call's buffers are reused only after it ends.
            let _open = ctx.pool.open();
            let record = |plan: &Plan| {
                let mut encoder =
                    ctx.device
                        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                            label: Some("attention"),
                        });
                timing::begin(ctx);
                let out =
                    self.record_call(ctx, &mut encoder, plan, dims, shape, &source, masking)?;
                Ok((encoder, out))
            };
            let fallback = (dims, &flash, mods.is_some());
            let (encoder, out) = self.with_storage_fallback(ctx, fallback, &mut plan, record)?;
            let rows = shape.batch * shape.n_q;
            let weights = out.weights.as_ref().map(|w| (w, out.weights_len));
            self.read_back(ctx, encoder, &out.output, rows * out.width, weights)
                .await
        };
        let flat = ctx.scoped_async(call).await?;
        shaped(flat, [&context_shape, &weights_shape])
    }

    /// The plan of a call that fits the device, run on the device's buffers or recorded on
    /// tensors (`given`: a split call's, else planned here): the block-sparse kernel when it
    /// costs less, the fused kernel that really runs (logged), and the call's pipelines
    /// prepared; with the fused kernel's problem, for [`Attention::with_storage_fallback`].
    pub(super) fn whole_plan(
        &self,
        ctx: &Context,
        dims: &Dims,
        shape: Shape,
        source: &Source<'_, '_>,
        (bias, mods): (Option<&ArrayView4<'_, f32>>, Option<&Modifiers>),
        given: Option<Plan>,
    ) -> Result<(Plan, crate::kernels::flash_tiled::Flash)> {
        let mut plan = match given {
            Some(plan) => plan,
            None => self.plan(ctx, dims)?,
        };
        plan.flash = self.sparse_flash(ctx, &plan, dims, shape, source, (bias, mods));
        let op = self.fused_op(shape, dims.scale)?;
        let plan = self.resolved(ctx, plan, &op, mods.is_some())?;
        log::info!(
            "attention batch={} n={} n_kv={} d_k={} d_v={} heads={} kv_heads={} causal={}: {plan}",
            shape.batch,
            shape.n_q,
            shape.n_kv,
            shape.d_k,
            shape.d_v,
            shape.heads,
            shape.kv_heads,
            dims.causal
        );
        self.prepare_pipelines(ctx, &plan, dims, shape, source, (bias, mods))?;
        Ok((plan, op))
    }

    /// The fused kernel of a block-sparse call (mask presets whose host block map leaves
    /// part of the keys): the plan's, or one that costs less to compile and run this call
    /// ([`tune::sparse_flash`]), its pipelines made already when a call of the same kind
    /// ran it before. The plan's when a variant is forced, with the weights, or dense.
    ///
    /// [`tune::sparse_flash`]: crate::tune::sparse_flash
    fn sparse_flash(
        &self,
        ctx: &Context,
        plan: &Plan,
        dims: &Dims,
        shape: Shape,
        source: &Source<'_, '_>,
        (bias, mods): (Option<&ArrayView4<'_, f32>>, Option<&Modifiers>),
    ) -> crate::variant::FlashVariant {
        let density =
            mods.and_then(|m| m.preset_density(shape.batch, (shape.n_q, shape.n_kv), dims.causal));
        let Some(density) = density.filter(|_| self.flash.is_none() && plan.fused) else {
            return plan.flash;
        };
        // Made already when a call of this kind ran it before (`prepare_pipelines` notes
        // each kind).
        let built = |flash| {
            let kind = self.call_kind(&Plan { flash, ..*plan }, dims, source, (bias, mods));
            ctx.pipelines.seen(&kind)
        };
        let widths = (dims.d_k / dims.heads, dims.d_v / dims.heads);
        let groups = (dims.batch * dims.heads, dims.n);
        crate::tune::sparse_flash(
            ctx,
            (&self.families(ctx), self.dtype),
            (widths, groups),
            plan.flash,
            density,
            built,
        )
    }

    /// What tells a call's kind apart (the op, its plan, widths, heads, mask, modifiers' code
    /// and source): calls of one kind use the same pipelines.
    fn call_kind(
        &self,
        plan: &Plan,
        dims: &Dims,
        source: &Source<'_, '_>,
        (bias, mods): (Option<&ArrayView4<'_, f32>>, Option<&Modifiers>),
    ) -> String {
        format!(
            "{self:?} {plan:?} d={} d_k={} d_v={} d_out={} heads={}/{} mask={} mods={:?} {}",
            dims.d,
            dims.d_k,
            dims.d_v,
            dims.d_out,
            dims.heads,
            dims.kv_heads,
            bias.is_some(),
            mods.map(|m| &m.kernel_code().wgsl),
            source.kind()
        )
    }

    /// On the first call of its kind (the op, its plan, widths, heads, mask and source), compiles
    /// every pipeline the call will use side by side first ([`PipelineCache::prepare`]): a dry
    /// run of the recording, with [`record`](crate::kernels::record) only noting the kernels,
    /// says which. Drivers that compile when a pipeline is made (most GPU drivers; lavapipe
    /// compiles at the first dispatch instead, in its queue thread) then compile a cold
    /// call's kernels in parallel. Errors of the dry run are left to the call itself, which
    /// meets them again inside its error scopes.
    ///
    /// [`PipelineCache::prepare`]: crate::gpu::pipeline::PipelineCache::prepare
    fn prepare_pipelines(
        &self,
        ctx: &Context,
        plan: &Plan,
        dims: &Dims,
        shape: Shape,
        source: &Source<'_, '_>,
        (bias, mods): (Option<&ArrayView4<'_, f32>>, Option<&Modifiers>),
    ) -> Result<()> {
        // Under the WGSL sanitizer no pipeline is compiled.
        if cfg!(target_arch = "wasm32") || ctx.sanitized_lanes().is_some() {
            return Ok(());
        }
        let signature = self.call_kind(plan, dims, source, (bias, mods));
        if !ctx.pipelines.first_time(signature) {
            return Ok(());
        }
        let dry_run = crate::kernels::collect_keys(|| {
            let _open = ctx.pool.open();
            let mut encoder = ctx.device.create_command_encoder(&Default::default());
            self.record_call(ctx, &mut encoder, plan, dims, shape, source, (bias, mods))
                .map(drop)
        });
        match dry_run {
            Ok(keys) => ctx.pipelines.prepare(ctx, &keys),
            Err(_) => Ok(()),
        }
    }

    /// Records one call into `encoder`: upload → projections → attention → output
    /// projection. The results stay on the device.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn record_call(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        plan: &Plan,
        dims: &Dims,
        shape: Shape,
        source: &Source<'_, '_>,
        (bias, mods): (Option<&ArrayView4<'_, f32>>, Option<&Modifiers>),
    ) -> Result<Recorded> {
        let rows = shape.batch * shape.n_q;
        // The projections' weights: the layer's, on the device already, or uploaded now.
        let uploaded;
        let projection = match source.weights() {
            Some(w) => Some(w),
            None => match source.projections() {
                Some(p) => {
                    uploaded = DeviceWeights::upload(ctx, p, self.f16())?;
                    Some(&uploaded)
                }
                None => None,
            },
        };
        let operands = self.upload(ctx, encoder, plan, (rows, dims.d), source, projection)?;
        let mask = MaskBuffer::upload(ctx, bias, mods)?;
        let (context, weights) = self.record_attention(
            ctx,
            encoder,
            plan,
            shape,
            dims.scale,
            &operands,
            mask.as_ref(),
        )?;
        let (output, width) = self
            .record_output_projection(ctx, encoder, plan, (rows, shape.d_v), &context, projection)?
            .unwrap_or((context, shape.d_v));
        Ok(Recorded {
            output,
            width,
            weights_len: shape.batch * shape.heads * shape.n_q * shape.n_kv,
            weights,
        })
    }
}

/// The flat results read back as the caller's arrays: the context of `context`'s shape, the
/// weights (if read) of `weights`'.
fn shaped(
    (context, weights): Flat,
    [context_shape, weights_shape]: [&[usize]; 2],
) -> Result<Output> {
    let shape_err = |e: ndarray::ShapeError| Error::shape(e.to_string());
    let context = ArrayD::from_shape_vec(IxDyn(context_shape), context).map_err(shape_err)?;
    let weights = weights
        .map(|w| ArrayD::from_shape_vec(IxDyn(weights_shape), w))
        .transpose()
        .map_err(shape_err)?;
    Ok(Output::new(context, weights))
}

/// What [`Attention::record_call`] leaves on the device: the output `(rows, width)` and the
/// weights `(batch, heads, n_q, n_kv)` unless the plan is fused.
pub(super) struct Recorded {
    pub output: Buf,
    pub width: usize,
    pub weights: Option<Buf>,
    pub weights_len: usize,
}
