//! `profile --measure`: the call the profile predicted, run on the adapter at hand and timed
//! per kernel (GPU timestamps where the adapter has them), printed beside the prediction so
//! that every run on a real GPU checks the model (`tools/gpu-check --bench` does it).

use ndarray::Array4;
use wgpu_attention::bench::{self, Timed};
use wgpu_attention::internals::{FlashVariant, MatmulVariant};
use wgpu_attention::profile::{self, KernelProfile, Problem};
use wgpu_attention::{Context, Decoder, Dtype, Mask, Result};

/// Warm-up runs and timed runs of each measurement.
#[derive(Debug, Clone, Copy)]
pub struct Repeats {
    pub warmup: usize,
    pub repeats: usize,
}

/// Values that are not all alike (the timing does not depend on them, but a constant input
/// would let a clever driver skip nothing either way: plain sines).
fn values(shape: (usize, usize, usize, usize), salt: usize) -> Array4<f32> {
    Array4::from_shape_fn(shape, |(i, j, k, m)| {
        (((i * 31 + j * 17 + k * 7 + m) * (salt + 2)) as f32 * 0.013).sin()
    })
}

/// One forward call of `p` with the fused kernel forced to `variant`, timed on `ctx`.
///
/// # Errors
/// Planning and GPU errors (a variant the adapter cannot run, sizes past its limits).
pub fn flash(ctx: &Context, p: &Problem, variant: FlashVariant, r: Repeats) -> Result<Timed> {
    let shape = (p.batch, p.heads, p.n, p.d);
    let (q, k, v) = (values(shape, 1), values(shape, 2), values(shape, 3));
    let (op, mods) = profile::forward(p, variant);
    let mask = match &mods {
        Some(m) => Mask::none().with_modifiers(m),
        None => Mask::none(),
    };
    bench::gpu_masked(
        ctx,
        &op,
        [q.view(), k.view(), v.view()],
        &mask,
        r.warmup,
        r.repeats,
    )
}

/// One decoding step (one query row per head) on a full cache of `cache` tokens, timed on
/// `ctx`: the step alone, the cache filled once before.
///
/// # Errors
/// Planning and GPU errors, a cache past the device's limits.
pub fn decode(
    ctx: &Context,
    (batch, heads, cache, d): (usize, usize, usize, usize),
    dtype: Dtype,
    r: Repeats,
) -> Result<Timed> {
    let tokens = values((batch, heads, cache, d), 4);
    let kv = profile::full_cache(ctx, tokens.view(), dtype)?;
    let q = values((batch, heads, 1, d), 5);
    let dec = Decoder::new();
    bench::timed(ctx, r.warmup, r.repeats, || {
        dec.step(ctx, &kv, q.view())?;
        Ok(ctx.kernel_times())
    })
}

/// An `m × m × m` matmul on cooperative matrices (f16 operands), timed on `ctx`.
///
/// # Errors
/// An adapter without cooperative matrices; GPU errors.
pub fn coop_matmul(ctx: &Context, m: usize, r: Repeats) -> Result<Timed> {
    bench::matmul(
        ctx,
        (MatmulVariant::Coop, Dtype::F16),
        (m, m, m),
        r.warmup,
        r.repeats,
    )
}

/// Prints the measurement beside the prediction: the whole (wall clock, and the kernels'
/// sum), then each kernel's predicted and measured time and their ratio, one
/// `model-check:` line each (what a run on a real GPU greps for).
pub fn print(what: &str, adapter: &str, predicted: &[KernelProfile], timed: &Result<Timed>) {
    let (stats, kernels) = match timed {
        Ok(t) => t,
        Err(e) => {
            println!("  measured on {adapter}: not measured: {e}");
            return;
        }
    };
    let sum: f64 = kernels.iter().map(|(_, ms)| ms).sum();
    println!(
        "  measured on {adapter}: {:.3} ms a call (median, wall clock), kernels {:.3} ms",
        stats.median_ms, sum
    );
    // Each kernel's dispatches summed on both sides (a split runs one kernel several times).
    let mut names: Vec<&str> = predicted.iter().map(|k| k.kernel).collect();
    names.dedup();
    for name in names {
        let short = name.trim_end_matches(".wgsl");
        let p: f64 = predicted
            .iter()
            .filter(|k| k.kernel == name)
            .map(|k| k.prediction.time * 1e3)
            .sum();
        let m: Option<f64> = kernels
            .iter()
            .filter(|(k, _)| k.as_str() == short)
            .map(|(_, ms)| *ms)
            .reduce(|a, b| a + b);
        match m {
            Some(m) => println!(
                "  model-check: {what} {short} predicted {p:.3} ms measured {m:.3} ms ratio {:.2}",
                m / p
            ),
            None => println!(
                "  model-check: {what} {short} predicted {p:.3} ms measured - (not dispatched there)"
            ),
        }
    }
    // What ran there that the prediction has not (the adapter planned another kernel: a CPU
    // adapter's decode, say).
    for (name, m) in kernels {
        if !predicted
            .iter()
            .any(|k| k.kernel.trim_end_matches(".wgsl") == name)
        {
            println!(
                "  model-check: {what} {name} predicted - measured {m:.3} ms (not in the prediction)"
            );
        }
    }
}
