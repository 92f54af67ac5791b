//! What each kernel of a call would spend on a GPU, counted on the CPU (`wgpu-attention
//! profile`): the call is planned as a GPU of the chosen subgroup width plans it (the
//! sanitizer's device), its dispatches are captured instead of run
//! (`kernels::capture`), and each is run again by the WGSL sanitizer's interpreter with
//! counters on, on a sample of its workgroups ([`wgsl_sanitizer::Counters`]); then the
//! occupancy and the time [`model`] on a [`DeviceSpec`].
//!
//! The buffers start as zeros (the inputs' values change no address in these kernels), or as
//! the host wrote them where the capture knows it (a block map made on the host); what a
//! dispatch writes is kept for the dispatches after it in the same call (a block map made
//! by one kernel is read by the next), where the writer ran whole.

mod d646ab0;
mod device;
pub mod model;
pub mod sample;

pub use d646ab0::Era;
use d646ab0::{d646ab0_source, D646AB0_BLOCKED};

use std::collections::HashMap;

use ndarray::Array4;
use wgsl_sanitizer::{Counters, Dispatch, Resource, Sample, Shader};

pub use device::DeviceSpec;
pub use model::{occupancy, predict, Bottleneck, Occupancy, Prediction};
pub use sample::{CausalOrder, Tiles};

use crate::error::{Error, Result};
use crate::gpu::sanitizer::Sanitize;
use crate::kernels::flash_blocked::BlockedOptions;
use crate::kernels::Captured;
use crate::modifiers::{Modifiers, Preset};
use crate::variant::FlashVariant;
use crate::{Attention, Context, Dtype, Inputs, Mask, Options};

/// A dispatch with at most this many workgroups runs whole, larger ones on a sample (the
/// fused kernel, whose key tiles per workgroup the host knows, on its chosen lightest ones
/// whatever its size).
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
    /// The fused kernel's key tiles per workgroup, where the host knows them.
    pub tiles: Option<Tiles>,
}

/// How a large dispatch is sampled: its key tiles per workgroup where the host knows them
/// ([`sample::choose`]), else a stratified sample of `k` workgroups.
struct Sampling<'a> {
    tiles: Option<&'a Tiles>,
    /// `None`: every workgroup.
    k: Option<u32>,
}

/// Counts one captured dispatch on `buffers` (by buffer id: created zeroed, updated with
/// what a dispatch run whole writes), at `lanes` lanes, sampling a large grid as `how` says.
/// Returns the counters, the workgroup memory and, with tiles known, the instructions each
/// workgroup of the grid would issue (fitted on the chosen ones: fixed + per tile).
///
/// # Errors
/// [`Error::Sanitizer`] when the interpreter cannot run it.
fn count(
    c: &Captured,
    buffers: &mut HashMap<u64, Vec<u8>>,
    lanes: u32,
    how: &Sampling<'_>,
) -> Result<(Counters, u64, Option<Vec<f64>>)> {
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
    // The block map's kernel runs whole whatever its size (one workgroup per query block,
    // cheap): the fused kernel after it reads the map it writes.
    let whole = match (how.k, how.tiles) {
        (None, _) => true,
        (Some(_), Some(_)) => c.label == "block_map.wgsl",
        (Some(_), None) => total <= WHOLE_UP_TO || c.label == "block_map.wgsl",
    };
    d.bind(0, 0, Resource::Buffer(c.params.clone()));
    for b in &c.buffers {
        if let Some((width, height, format)) = b.texture {
            // Zeros, as the buffers (a texture's values change no address either).
            let format = crate::gpu::sanitizer::texel_format(format)?;
            let data = vec![0; (width * height) as usize * format.bytes()];
            let texture = wgsl_sanitizer::Texture {
                width,
                height,
                format,
                data,
            };
            d.bind(b.group, b.binding, Resource::Texture(texture));
            continue;
        }
        // Zeros, or what the host wrote (a block map made on the host).
        let bytes = buffers
            .entry(b.id)
            .or_insert_with(|| {
                let mut bytes = vec![0; b.bytes as usize];
                if let Some((_, w)) = c.written.iter().find(|(id, _)| *id == b.id) {
                    let n = w.len().min(bytes.len());
                    bytes[..n].copy_from_slice(&w[..n]);
                }
                bytes
            })
            .clone();
        d.bind(b.group, b.binding, Resource::Buffer(bytes));
    }
    let no_counters = || Error::Sanitizer {
        kernel: c.label.to_string(),
        message: "profile: no counters".into(),
    };
    let (counters, per_wg) = match (whole, how.tiles, how.k) {
        (false, Some(tiles), Some(k)) => {
            // The chosen workgroups, weighted; each one's own counts fit the per-tile cost.
            d.sample = Sample::Chosen(sample::choose(tiles, k as usize));
            let report = shader.run(&mut d).map_err(fail)?;
            let fit: Vec<(u32, f64)> = report
                .workgroup_counters
                .iter()
                .map(|(i, one)| (tiles.visits[*i as usize], one.instructions as f64))
                .collect();
            let counters = report.counters.ok_or_else(no_counters)?;
            (counters, Some(sample::per_workgroup(tiles, &fit)))
        }
        _ => {
            d.sample = match (whole, how.k) {
                (false, Some(k)) => Sample::Workgroups(k),
                _ => Sample::All,
            };
            let report = shader.run(&mut d).map_err(fail)?;
            (report.counters.ok_or_else(no_counters)?, None)
        }
    };
    if whole {
        for b in &c.buffers {
            if let Some(bytes) = d.buffer(b.group, b.binding) {
                buffers.insert(b.id, bytes.to_vec());
            }
        }
    }
    Ok((counters, shader.workgroup_memory_bytes(), per_wg))
}

/// How the fused kernel's grid is laid out, for its tiles per workgroup.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// Its blocks, rows × keys (`flash_blocked`).
    blocks: Option<(u32, u32)>,
    window: Option<u32>,
    order: CausalOrder,
    /// `flash_blocked`'s registers where its text is not today's (d646ab0's).
    blocked_registers: Option<u32>,
}

/// Profiles the dispatches of one call on `dev`: counts, occupancy, prediction.
///
/// # Errors
/// As [`count`].
fn profile_dispatches(
    captured: &[Captured],
    dev: &DeviceSpec,
    d: usize,
    sample: Option<u32>,
    layout: Layout,
) -> Result<Vec<KernelProfile>> {
    profile_scaled(captured, dev, d, sample, layout, 1)
}

/// [`profile_dispatches`] of a call that stands for `times` such calls side by side (a
/// decode step counted on a part of its batch: every count, workgroup and byte times
/// `times`).
///
/// # Errors
/// As [`count`].
fn profile_scaled(
    captured: &[Captured],
    dev: &DeviceSpec,
    d: usize,
    sample: Option<u32>,
    layout: Layout,
    times: u64,
) -> Result<Vec<KernelProfile>> {
    let mut buffers = HashMap::new();
    let mut out = Vec::new();
    for c in captured {
        let tiles = layout.blocks.and_then(|(rows, keys)| {
            let map_keys = crate::kernels::block_map::MapShape::keys_for(keys);
            sample::flash_blocked_tiles(c, rows, keys, layout.window, map_keys, layout.order)
        });
        let how = Sampling {
            tiles: tiles.as_ref(),
            k: sample,
        };
        let (mut counters, shared_bytes, per_wg) = count(c, &mut buffers, dev.lanes, &how)?;
        if times > 1 {
            let mut all = Counters {
                subgroup_size: counters.subgroup_size,
                workgroups: counters.workgroups * times,
                workgroups_counted: counters.workgroups_counted,
                ..Counters::default()
            };
            all.add_scaled(&counters, times as f64);
            all.shared_max_ways = counters.shared_max_ways;
            counters = all;
        }
        let threads = (counters.invocations / counters.workgroups.max(1)) as u32;
        let (registers, registers_from) = match layout.blocked_registers {
            Some(r) if c.label == "flash_blocked.wgsl" => (r, "RDNA3 VGPRs of d646ab0's text"),
            _ => model::registers(c.label, &c.variant, d),
        };
        let occ = occupancy(dev, threads, registers, shared_bytes);
        // Textures are bound memory too (the decode cache): DRAM delivers them at most once.
        let mut texture_bytes = 0;
        for (w, h, f) in c.buffers.iter().filter_map(|b| b.texture) {
            let bytes = crate::gpu::sanitizer::texel_format(f)?.bytes() as u64;
            texture_bytes += u64::from(w) * u64::from(h) * bytes;
        }
        let footprint: u64 =
            (c.buffers.iter().map(|b| b.bytes).sum::<u64>() + texture_bytes) * times;
        let prediction = predict(dev, &counters, &occ, footprint, per_wg.as_deref());
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
            tiles,
        });
    }
    Ok(out)
}

/// The context the profile plans on: the sanitizer's device at `lanes` (a discrete GPU of
/// that subgroup width, cooperative matrices of 16 × 16; lavapipe holds the buffers), with
/// `era`'s options of the fused kernel.
///
/// # Errors
/// No adapter.
pub fn context(lanes: u32, era: Era) -> Result<Context> {
    let ctx = Context::new()?.with_sanitizer(Sanitize::Lanes(lanes));
    Ok(match era {
        Era::Today => ctx,
        Era::D646ab0 => ctx.with_blocked_options(BlockedOptions {
            vector_loads: Some(false),
            resident_queries: Some(false),
            ..BlockedOptions::default()
        }),
    })
}

/// The fused kernel's variants the tuner may pick for `p` on `ctx`, and `flash-coop` where
/// the device has cooperative matrices whether or not the tuner trusts them yet
/// ([`crate::tune::COOP_TUNED`]): what it would spend once it does.
pub fn flash_variants(ctx: &Context, p: &Problem) -> Vec<FlashVariant> {
    let w4 = p.d.div_ceil(4) as u32;
    let families = [crate::Kernels::Storage, crate::Kernels::Coop];
    let mut variants = crate::tune::flash_candidates(ctx, &families, w4, w4, p.dtype);
    if ctx.coop_shape().is_some() && !variants.contains(&FlashVariant::Coop) {
        variants.push(FlashVariant::Coop);
    }
    variants
}

/// The forward call of `p` with the fused kernel forced to `variant` (no weights), and the
/// window's modifiers where `p` has one: what the profile counts and `--measure` times.
pub fn forward(p: &Problem, variant: FlashVariant) -> (Attention, Option<Modifiers>) {
    let op = forward_op(p).options(Options {
        flash_variant: Some(variant),
        ..Options::default()
    });
    (op, window(p))
}

/// The dispatches of one forward call of `p` with the fused kernel forced to `variant`.
///
/// # Errors
/// Whatever planning the call returns.
fn capture_flash(ctx: &Context, p: &Problem, variant: FlashVariant) -> Result<Vec<Captured>> {
    let shape = (p.batch, p.heads, p.n, p.d);
    let zeros = Array4::<f32>::zeros(shape);
    let (op, mods) = forward(p, variant);
    let mask = match &mods {
        Some(m) => Mask::none().with_modifiers(m),
        None => Mask::none(),
    };
    crate::kernels::capture(|| {
        let inputs = Inputs::qkv(zeros.view(), zeros.view(), zeros.view()).mask(&mask);
        op.run(ctx, inputs).map(|_| ())
    })
}

/// The forward call of `p`: no weights, causal and dtype as `p` says.
fn forward_op(p: &Problem) -> Attention {
    Attention::new()
        .return_weights(false)
        .causal(p.causal)
        .dtype(p.dtype)
}

/// `p`'s window as modifiers, for [`Mask::with_modifiers`].
fn window(p: &Problem) -> Option<Modifiers> {
    p.window
        .map(|left| Modifiers::new().preset(Preset::Window { left, right: 0 }))
}

/// Profiles the fused backward of `p` (`Saved::backward` of a forward saved for it: the
/// kernels after the forward, which is captured and not counted) on `dev`, on about
/// `sample` workgroups of each large dispatch (first, last, one per stratum between).
///
/// # Errors
/// Planning errors; [`Error::Sanitizer`] when the interpreter cannot run a kernel.
pub fn profile_backward(
    ctx: &Context,
    dev: &DeviceSpec,
    p: &Problem,
    sample: u32,
) -> Result<Vec<KernelProfile>> {
    let op = forward_op(p).save_for_backward(true);
    let zeros = Array4::<f32>::zeros((p.batch, p.heads, p.n, p.d));
    let mods = window(p);
    let mask = mods
        .as_ref()
        .map_or_else(Mask::none, |m| Mask::none().with_modifiers(m));
    let mut saved = None;
    crate::kernels::capture(|| {
        let inputs = Inputs::qkv(zeros.view(), zeros.view(), zeros.view()).mask(&mask);
        saved = op.run(ctx, inputs)?.saved;
        Ok(())
    })?;
    let saved = saved.ok_or_else(|| Error::Sanitizer {
        kernel: "backward".into(),
        message: "profile: the forward saved nothing for the backward".into(),
    })?;
    let captured = crate::kernels::capture(|| saved.backward(ctx, zeros.view()).map(|_| ()))?;
    let layout = Layout {
        blocks: None,
        window: None,
        order: CausalOrder::HeaviestFirst,
        blocked_registers: None,
    };
    profile_dispatches(&captured, dev, p.d, Some(sample), layout)
}

/// Profiles one forward call of `p` with the fused kernel forced to `variant` on `dev`,
/// counting at `ctx`'s subgroup width on about `sample` workgroups of each large dispatch
/// (the fused kernel's lightest, weighted by its tiles; `None`: every workgroup of every
/// dispatch), the kernels of `era` (`ctx` from [`context`] with the same).
///
/// # Errors
/// Planning errors; [`Error::Sanitizer`] when the interpreter cannot run a kernel.
pub fn profile_flash(
    ctx: &Context,
    dev: &DeviceSpec,
    p: &Problem,
    variant: FlashVariant,
    sample: Option<u32>,
    era: Era,
) -> Result<Vec<KernelProfile>> {
    let mut order = CausalOrder::HeaviestFirst;
    let mut captured = capture_flash(ctx, p, variant)?;
    if let (Era::D646ab0, FlashVariant::Blocked { rows, keys }) = (era, variant) {
        // d646ab0 walked a causal grid in grid order, lightest blocks first.
        order = CausalOrder::LightestFirst;
        for c in captured
            .iter_mut()
            .filter(|c| c.label == "flash_blocked.wgsl")
        {
            // d646ab0 split a call's keys by the same rule (fewer than 2 · 64 workgroups),
            // into its split variant, which is not kept.
            if c.variant.contains("split: 1") {
                return Err(Error::Sanitizer {
                    kernel: c.label.into(),
                    message: format!(
                        "profile --d646ab0: {} workgroups split their keys, and d646ab0's \
                         split text is not kept (only the H100 run's unsplit grids)",
                        c.workgroups.iter().product::<u32>()
                    ),
                });
            }
            c.source = d646ab0_source(&c.source, p, (rows, keys))?;
        }
    }
    let layout = Layout {
        blocks: match variant {
            FlashVariant::Blocked { rows, keys } => Some((rows, keys)),
            _ => None,
        },
        window: p.window,
        order,
        blocked_registers: match (era, variant) {
            (Era::D646ab0, FlashVariant::Blocked { rows, keys }) => D646AB0_BLOCKED
                .iter()
                .find(|(shape, ..)| *shape == (rows, keys))
                .map(|(.., vgprs)| *vgprs),
            _ => None,
        },
    };
    profile_dispatches(&captured, dev, p.d, sample, layout)
}

/// A KV cache of `dtype` holding `tokens` (batch, heads, length, d) as both its keys and its
/// values, filled to its capacity: what a decoding step is profiled and measured on.
///
/// # Errors
/// A cache past the device's limits.
pub fn full_cache(
    ctx: &Context,
    tokens: ndarray::ArrayView4<'_, f32>,
    dtype: Dtype,
) -> Result<crate::KvCache> {
    let (batch, heads, cache, d) = tokens.dim();
    let spec = crate::KvCacheSpec {
        capacity: cache,
        batch,
        kv_heads: heads,
        d_k: d,
        d_v: d,
        dtype,
    };
    let mut kv = crate::KvCache::new(ctx, spec)?;
    match dtype {
        Dtype::F32 => kv.append(ctx, tokens, tokens)?,
        Dtype::F16 => {
            let t = tokens.mapv(half::f16::from_f32);
            kv.append(ctx, t.view(), t.view())?;
        }
    }
    Ok(kv)
}

/// The K and V bytes a decode profile fills on the host and in lavapipe at most: a larger
/// batch is counted on part of it ([`decode_counted_batch`]).
pub const DECODE_CACHE_BYTES: u64 = 512 << 20;

/// The batch [`profile_decode`] counts for a step of `batch` sequences of `heads` heads of
/// width `d` over a cache of `cache` tokens in `dtype`: the most whose K and V take at most
/// [`DECODE_CACHE_BYTES`] (at least 1). The batch is independent workgroups of the same
/// work, so the counts of the rest are the counted ones' multiple.
pub fn decode_counted_batch(
    (batch, heads, cache, d): (usize, usize, usize, usize),
    dtype: Dtype,
) -> usize {
    let elem = match dtype {
        Dtype::F32 => 4,
        Dtype::F16 => 2,
    };
    let per_sequence = (2 * heads * cache * d.next_multiple_of(4) * elem) as u64;
    let fit = (DECODE_CACHE_BYTES / per_sequence.max(1)).max(1) as usize;
    // A divisor of the batch, so the scale is whole.
    (1..=fit.min(batch).max(1))
        .rev()
        .find(|b| batch.is_multiple_of(*b))
        .unwrap_or(1)
}

/// Profiles one decoding step (`Decoder::step`, one query row per head) on a cache of
/// `cache` tokens, `batch` × `heads` heads of width `d` in `dtype` (the dispatches after the
/// cache is filled), on `dev`. A batch whose cache exceeds [`DECODE_CACHE_BYTES`] is
/// counted on [`decode_counted_batch`] sequences, with the key blocks the whole batch
/// would get, and scaled.
///
/// # Errors
/// Planning errors; [`Error::Sanitizer`] when the interpreter cannot run a kernel.
pub fn profile_decode(
    ctx: &Context,
    dev: &DeviceSpec,
    (batch, heads, cache, d): (usize, usize, usize, usize),
    dtype: Dtype,
    sample: u32,
) -> Result<Vec<KernelProfile>> {
    let counted = decode_counted_batch((batch, heads, cache, d), dtype);
    let times = (batch / counted) as u64;
    // The key blocks of the whole batch (one row per head: one chunk per head).
    let cpu = !ctx.hardware().decide.decode_gpu_kernel;
    let block = crate::kernels::decode_partial::block_for(cache, batch * heads, cpu);
    let batch = counted;
    let tokens = ndarray::Array4::<f32>::zeros((batch, heads, cache, d));
    let kv = full_cache(ctx, tokens.view(), dtype)?;
    let q = ndarray::Array4::<f32>::zeros((batch, heads, 1, d));
    let dec = crate::Decoder::new().block(block);
    let captured = crate::kernels::capture(|| dec.step(ctx, &kv, q.view()).map(|_| ()))?;
    let layout = Layout {
        blocks: None,
        window: None,
        order: CausalOrder::HeaviestFirst,
        blocked_registers: None,
    };
    profile_scaled(&captured, dev, d, Some(sample), layout, times)
}

/// Profiles one `m × m × m` matmul with `variant` on operands of `dtype` on `dev`.
///
/// # Errors
/// Planning errors; [`Error::Sanitizer`] when the interpreter cannot run it.
pub fn profile_matmul(
    ctx: &Context,
    dev: &DeviceSpec,
    m: usize,
    variant: crate::variant::MatmulVariant,
    dtype: Dtype,
    sample: u32,
) -> Result<Vec<KernelProfile>> {
    let problem = crate::tune::MatmulProblem::new(ctx, (m, m, m), dtype)?;
    let captured = crate::kernels::capture(|| problem.run(ctx, variant).map(|_| ()))?;
    let layout = Layout {
        blocks: None,
        window: None,
        order: CausalOrder::HeaviestFirst,
        blocked_registers: None,
    };
    profile_dispatches(&captured, dev, 0, Some(sample), layout)
}
