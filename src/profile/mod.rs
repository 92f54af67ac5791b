//! What each kernel of a call would spend on a GPU, counted on the CPU (`wgpu-attention
//! profile`): the call is planned as a GPU of the chosen subgroup width plans it (the
//! sanitizer's device), its dispatches are captured instead of run
//! (`kernels::capture`), and each is run again by the WGSL sanitizer's interpreter with
//! counters on, on a sample of its workgroups ([`wgsl_sanitizer::Counters`]); then the
//! occupancy and the time [`model`] on a [`DeviceSpec`].
//!
//! The buffers start as zeros (the inputs' values change no address in these kernels); what
//! a dispatch writes is kept for the dispatches after it in the same call (a block map made
//! by one kernel is read by the next), where the writer ran whole.

mod device;
pub mod model;

use std::collections::HashMap;

use ndarray::Array4;
use wgsl_sanitizer::{Counters, Dispatch, Resource, Sample, Shader};

pub use device::DeviceSpec;
pub use model::{occupancy, predict, Bottleneck, Occupancy, Prediction};

use crate::error::{Error, Result};
use crate::gpu::sanitizer::Sanitize;
use crate::kernels::Captured;
use crate::modifiers::{Modifiers, Preset};
use crate::variant::FlashVariant;
use crate::{Attention, Context, Dtype, Inputs, Mask, Options};

/// A dispatch with at most this many workgroups runs whole; larger ones on a sample.
pub const WHOLE_UP_TO: u64 = 64;

/// An attention problem to profile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Problem {
    pub batch: usize,
    pub heads: usize,
    pub n: usize,
    /// Per-head width.
    pub d: usize,
    pub dtype: Dtype,
    pub causal: bool,
    /// Keys left of the diagonal a query sees besides its own (`Some(511)`: Mistral's
    /// window of 512 with causal).
    pub window: Option<u32>,
}

/// One dispatch's counts, occupancy and predicted time.
#[derive(Debug, Clone)]
pub struct KernelProfile {
    /// The kernel file.
    pub kernel: &'static str,
    /// Its variant (constants).
    pub variant: String,
    pub workgroups: u64,
    pub threads: u32,
    pub shared_bytes: u64,
    pub registers: u32,
    /// Where the register count comes from.
    pub registers_from: &'static str,
    pub counters: Counters,
    pub occupancy: Occupancy,
    pub prediction: Prediction,
    /// Bytes of the buffers it binds.
    pub footprint: u64,
}

/// Counts one captured dispatch on `buffers` (by buffer id: created zeroed, updated with
/// what a dispatch run whole writes), at `lanes` lanes, sampling `sample` workgroups of a
/// large grid.
///
/// # Errors
/// [`Error::Sanitizer`] when the interpreter cannot run it.
fn count(
    c: &Captured,
    buffers: &mut HashMap<u64, Vec<u8>>,
    lanes: u32,
    sample: u32,
) -> Result<(Counters, u64)> {
    let fail = |e: wgsl_sanitizer::Error| Error::Sanitizer {
        kernel: c.label.to_string(),
        message: format!("profile: {e}"),
    };
    let shader = Shader::parse(&c.source).map_err(fail)?;
    let mut d = Dispatch::new(c.entry, c.workgroups);
    d.subgroup_size = lanes;
    d.counters = true;
    d.zero_workgroup_memory = true;
    d.check_non_finite = false;
    let total: u64 = c.workgroups.iter().map(|&x| u64::from(x)).product();
    let whole = total <= WHOLE_UP_TO;
    d.sample = match whole {
        true => Sample::All,
        false => Sample::Workgroups(sample),
    };
    d.bind(0, 0, Resource::Buffer(c.params.clone()));
    for b in &c.buffers {
        let bytes = buffers
            .entry(b.id)
            .or_insert_with(|| vec![0; b.bytes as usize])
            .clone();
        d.bind(b.group, b.binding, Resource::Buffer(bytes));
    }
    let report = shader.run(&mut d).map_err(fail)?;
    if whole {
        for b in &c.buffers {
            if let Some(bytes) = d.buffer(b.group, b.binding) {
                buffers.insert(b.id, bytes.to_vec());
            }
        }
    }
    let counters = report.counters.ok_or_else(|| Error::Sanitizer {
        kernel: c.label.to_string(),
        message: "profile: no counters".into(),
    })?;
    Ok((counters, shader.workgroup_memory_bytes()))
}

/// Profiles the dispatches of one call on `dev`: counts, occupancy, prediction.
///
/// # Errors
/// As [`count`].
fn profile_dispatches(
    captured: &[Captured],
    dev: &DeviceSpec,
    d: usize,
    sample: u32,
) -> Result<Vec<KernelProfile>> {
    let mut buffers = HashMap::new();
    let mut out = Vec::new();
    for c in captured {
        let (counters, shared_bytes) = count(c, &mut buffers, dev.lanes, sample)?;
        let threads = (counters.invocations / counters.workgroups.max(1)) as u32;
        let (registers, registers_from) = model::registers(c.label, &c.variant, d);
        let occ = occupancy(dev, threads, registers, shared_bytes);
        let footprint: u64 = c.buffers.iter().map(|b| b.bytes).sum();
        let prediction = predict(dev, &counters, &occ, footprint);
        out.push(KernelProfile {
            kernel: c.label,
            variant: c.variant.clone(),
            workgroups: counters.workgroups,
            threads,
            shared_bytes,
            registers,
            registers_from,
            counters,
            occupancy: occ,
            prediction,
            footprint,
        });
    }
    Ok(out)
}

/// The context the profile plans on: the sanitizer's device at `lanes` (a discrete GPU of
/// that subgroup width, cooperative matrices of 16 × 16; lavapipe holds the buffers).
///
/// # Errors
/// No adapter.
pub fn context(lanes: u32) -> Result<Context> {
    Ok(Context::new()?.with_sanitizer(Sanitize::Lanes(lanes)))
}

/// The fused kernel's variants the tuner may pick for `p` on `ctx`.
pub fn flash_variants(ctx: &Context, p: &Problem) -> Vec<FlashVariant> {
    let w4 = p.d.div_ceil(4) as u32;
    let families = [crate::Kernels::Storage, crate::Kernels::Coop];
    crate::tune::flash_candidates(ctx, &families, w4, w4, p.dtype)
}

/// The dispatches of one forward call of `p` with the fused kernel forced to `variant`.
///
/// # Errors
/// Whatever planning the call returns.
fn capture_flash(ctx: &Context, p: &Problem, variant: FlashVariant) -> Result<Vec<Captured>> {
    let shape = (p.batch, p.heads, p.n, p.d);
    let zeros = Array4::<f32>::zeros(shape);
    let op = Attention::new()
        .return_weights(false)
        .causal(p.causal)
        .dtype(p.dtype)
        .options(Options {
            flash_variant: Some(variant),
            ..Options::default()
        });
    let mods = p
        .window
        .map(|left| Modifiers::new().preset(Preset::Window { left, right: 0 }));
    let mask = match &mods {
        Some(m) => Mask::none().with_modifiers(m),
        None => Mask::none(),
    };
    crate::kernels::capture(|| {
        let inputs = Inputs::qkv(zeros.view(), zeros.view(), zeros.view()).mask(&mask);
        op.run(ctx, inputs).map(|_| ())
    })
}

/// Profiles one forward call of `p` with the fused kernel forced to `variant` on `dev`,
/// counting at `ctx`'s subgroup width on about `sample` workgroups of each large dispatch.
///
/// # Errors
/// Planning errors; [`Error::Sanitizer`] when the interpreter cannot run a kernel.
pub fn profile_flash(
    ctx: &Context,
    dev: &DeviceSpec,
    p: &Problem,
    variant: FlashVariant,
    sample: u32,
) -> Result<Vec<KernelProfile>> {
    let captured = capture_flash(ctx, p, variant)?;
    profile_dispatches(&captured, dev, p.d, sample)
}
