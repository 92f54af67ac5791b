//! Measurement, shared by `wgpu-attention bench` and the criterion benches: the GPU forward
//! pass on each kernel family, a CPU f32 ndarray attention to compare with in the same run,
//! standalone matmuls, and the adapter's arithmetic ceiling. Times are medians over repeated
//! runs after warm-up (the first dispatch of a kernel compiles it on lavapipe); per-kernel
//! times come from timestamp queries where the adapter has them.

use std::time::Instant;

use ndarray::{s, Array2, Array3, ArrayView3, Axis};
use serde::Serialize;

use crate::attention::{Attention, Dims, Kernels};
use crate::context::{Context, Profiling};
use crate::error::{Error, Result};
use crate::gpu::pipeline::KernelId;
use crate::gpu::timing::KernelTime;
use crate::gpu::{buffer, readback};
use crate::kernels::matmul::{Matmul, MatmulVariant, Strides};
use crate::kernels::{record, u32_of};

/// Median and spread of repeated timings, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stats {
    /// The median.
    pub median_ms: f64,
    /// The fastest run.
    pub min_ms: f64,
    /// The slowest run.
    pub max_ms: f64,
    /// How many runs.
    pub runs: usize,
}

impl Stats {
    /// The statistics of `samples` (milliseconds); `None` when empty.
    pub fn of(samples: &[f64]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        let median = if v.len() % 2 == 1 {
            v[mid]
        } else {
            0.5 * (v[mid - 1] + v[mid])
        };
        Some(Stats {
            median_ms: median,
            min_ms: v[0],
            max_ms: v[v.len() - 1],
            runs: v.len(),
        })
    }
}

/// Runs `f` `warmup` times untimed, then `repeats` times timed; returns the wall-clock
/// statistics and, per run, whatever `f` returned.
///
/// # Errors
/// The first error of `f`.
pub fn measure<T>(
    warmup: usize,
    repeats: usize,
    mut f: impl FnMut() -> Result<T>,
) -> Result<(Stats, Vec<T>)> {
    for _ in 0..warmup {
        f()?;
    }
    let mut times = Vec::with_capacity(repeats);
    let mut outs = Vec::with_capacity(repeats);
    for _ in 0..repeats.max(1) {
        let t = Instant::now();
        outs.push(f()?);
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok((Stats::of(&times).expect("at least one run"), outs))
}

/// The median GPU time per kernel over several runs' [`KernelTime`]s, passes of the same
/// kernel within one run added up; in first-seen order.
pub fn kernel_medians(runs: &[Vec<KernelTime>]) -> Vec<(String, f64)> {
    let mut names: Vec<&'static str> = Vec::new();
    for t in runs.iter().flatten() {
        if !names.contains(&t.kernel) {
            names.push(t.kernel);
        }
    }
    names
        .into_iter()
        .filter_map(|name| {
            let per_run: Vec<f64> = runs
                .iter()
                .map(|r| r.iter().filter(|t| t.kernel == name).map(|t| t.ms).sum())
                .collect();
            Stats::of(&per_run).map(|s| (name.trim_end_matches(".wgsl").to_string(), s.median_ms))
        })
        .collect()
}

/// Self-attention with `Q = K = V = x` on the CPU in f32 with ndarray (matrixmultiply's
/// GEMM, one thread): the honest CPU baseline for `bench`. Rows are processed in blocks, so
/// memory stays O(block · n) at any n. Heads split the last axis as in [`Attention`].
pub fn cpu_attention_f32(x: ArrayView3<'_, f32>, heads: usize, causal: bool) -> Array3<f32> {
    const BLOCK: usize = 256;
    let (batch, n, d) = x.dim();
    let dh = d / heads.max(1);
    let scale = 1.0 / (dh as f32).sqrt();
    let mut out = Array3::<f32>::zeros((batch, n, d));
    for b in 0..batch {
        for h in 0..heads {
            let xh = x.slice(s![b, .., h * dh..(h + 1) * dh]);
            let kt = xh.t();
            for r0 in (0..n).step_by(BLOCK) {
                let r1 = (r0 + BLOCK).min(n);
                // Keys past the block's last row are all masked when causal.
                let kv = if causal { r1 } else { n };
                let q = xh.slice(s![r0..r1, ..]);
                let mut sc: Array2<f32> = q.dot(&kt.slice(s![.., ..kv]));
                for (i, mut row) in sc.axis_iter_mut(Axis(0)).enumerate() {
                    let visible = if causal { r0 + i + 1 } else { kv };
                    softmax_f32(
                        row.as_slice_mut().expect("rows are contiguous"),
                        visible,
                        scale,
                    );
                }
                let ctx = sc.dot(&xh.slice(s![..kv, ..]));
                out.slice_mut(s![b, r0..r1, h * dh..(h + 1) * dh])
                    .assign(&ctx);
            }
        }
    }
    out
}

/// `row[..visible] ← softmax(scale · row[..visible])`, zeros after.
fn softmax_f32(row: &mut [f32], visible: usize, scale: f32) {
    let m = row[..visible]
        .iter()
        .fold(f32::NEG_INFINITY, |a, &v| a.max(v * scale));
    let mut sum = 0.0;
    for v in &mut row[..visible] {
        *v = (*v * scale - m).exp();
        sum += *v;
    }
    for v in &mut row[..visible] {
        *v /= sum;
    }
    row[visible..].fill(0.0);
}

/// Submits what `f` records, waits, and returns the wall time in milliseconds and the
/// kernels' GPU times (empty without profiling).
///
/// # Errors
/// Whatever `f` or the GPU returns.
pub fn timed_submit(
    ctx: &Context,
    f: impl FnOnce(&mut wgpu::CommandEncoder) -> Result<()>,
) -> Result<(f64, Vec<KernelTime>)> {
    ctx.scoped(|| {
        let t = Instant::now();
        let mut encoder = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("bench"),
            });
        ctx.begin_timing();
        f(&mut encoder)?;
        let timing = ctx.end_timing(&mut encoder);
        let (pending, labels) = match timing {
            Some((p, labels)) => (vec![p], Some(labels)),
            None => (Vec::new(), None),
        };
        let submission = ctx.queue.submit([encoder.finish()]);
        let words = readback::finish(ctx, submission, pending)?;
        let wall = t.elapsed().as_secs_f64() * 1e3;
        if let (Some(labels), Some(w)) = (labels, words.first()) {
            ctx.store_times(w, &labels);
        }
        Ok((wall, ctx.kernel_times()))
    })
}

/// The adapter's f32 arithmetic ceiling in GFLOP/s: `fma_peak.wgsl` on enough invocations
/// to fill the device, best of a few runs (GPU time where timestamps exist, else wall time).
///
/// # Errors
/// GPU errors.
pub fn fma_peak(ctx: &Context) -> Result<f64> {
    let cpu = ctx.adapter_info().device_type == wgpu::DeviceType::Cpu;
    // Enough work to dwarf launch costs: ~2 GFLOP on a CPU adapter, ~1 TFLOP on a GPU.
    let (invocations, iters): (u32, u32) = if cpu {
        (16_384, 2_048)
    } else {
        (1 << 22, 4_096)
    };
    #[repr(C)]
    #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
    struct Params {
        iters: u32,
        invocations: u32,
        _pad: [u32; 2],
    }
    let params = Params {
        iters,
        invocations,
        _pad: [0; 2],
    };
    let out = buffer::output(ctx, "fma peak", invocations as usize, false)?;
    let flops = f64::from(invocations) * f64::from(iters) * 64.0;
    let mut best = 0.0f64;
    for _ in 0..4 {
        let (wall, times) = timed_submit(ctx, |enc| {
            record(
                ctx,
                enc,
                KernelId::FmaPeak,
                &params,
                &[(&out).into()],
                u64::from(invocations.div_ceil(64)),
            )
        })?;
        let ms = times.first().map_or(wall, |t| t.ms);
        best = best.max(flops / (ms * 1e6));
    }
    Ok(best)
}

/// A matmul `m × k` by `k × n` with `variant`: wall-clock statistics of the dispatch
/// (operands already on the GPU) and, when profiling is on, the kernels' median times.
///
/// # Errors
/// Size limits and GPU errors.
pub fn matmul(
    ctx: &Context,
    variant: MatmulVariant,
    (m, n, k): (usize, usize, usize),
    warmup: usize,
    repeats: usize,
) -> Result<(Stats, Vec<(String, f64)>)> {
    let a: Vec<f32> = (0..m * k).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| ((i % 13) as f32 - 6.0) / 6.0).collect();
    let a_buf = buffer::upload(ctx, "A", &a)?;
    let b_buf = buffer::upload(ctx, "B", &b)?;
    let c_buf = buffer::output(ctx, "C", m * n, false)?;
    let mm = Matmul {
        m,
        n,
        k,
        batch: 1,
        heads: 1,
        a: Strides::row_major(u32_of("k", k)?, 0, 0),
        b: Strides::row_major(u32_of("n", n)?, 0, 0),
        c: Strides::row_major(u32_of("n", n)?, 0, 0),
        flags: 0,
        b_ratio: 1,
        f16: 0,
    };
    let run = || {
        timed_submit(ctx, |enc| {
            mm.record(ctx, enc, variant, &a_buf, &b_buf, &a_buf, &c_buf)
        })
        .map(|(_, t)| t)
    };
    profiled(ctx, warmup, repeats, run)
}

/// One GPU forward pass of self-attention (`Q = K = V = x`) with `op`, returning the
/// wall-clock statistics and, when profiling is on, the kernels' median times.
///
/// # Errors
/// Whatever the forward pass returns.
pub fn gpu_attention(
    ctx: &Context,
    op: &Attention,
    x: ArrayView3<'_, f32>,
    warmup: usize,
    repeats: usize,
) -> Result<(Stats, Vec<(String, f64)>)> {
    let x = x.into_dyn();
    profiled(ctx, warmup, repeats, || {
        op.forward(ctx, x.view(), None)?;
        Ok(ctx.kernel_times())
    })
}

/// Times `run` with profiling off (the headline figure: nothing serialized or added), then
/// runs it `repeats` more times with profiling on for the per-kernel medians.
fn profiled(
    ctx: &Context,
    warmup: usize,
    repeats: usize,
    mut run: impl FnMut() -> Result<Vec<KernelTime>>,
) -> Result<(Stats, Vec<(String, f64)>)> {
    let mode = ctx.profiling();
    ctx.set_profiling(false);
    let timed = measure(warmup, repeats, &mut run);
    ctx.set_profiling(mode != Profiling::Off);
    let (stats, _) = timed?;
    let runs = if mode == Profiling::Off {
        Vec::new()
    } else {
        measure(0, repeats, run)?.1
    };
    Ok((stats, kernel_medians(&runs)))
}

/// The kernel families to benchmark for `choice` on `ctx` (`None`: every family it has;
/// [`Kernels::Auto`]: the one it resolves to for `dims`).
///
/// # Errors
/// As [`Attention::plan`].
pub fn families(ctx: &Context, choice: Option<Kernels>, dims: &Dims) -> Result<Vec<Kernels>> {
    match choice {
        Some(k) => Ok(vec![Attention::new().kernels(k).plan(ctx, dims)?.family()]),
        None => Ok(Kernels::available(ctx)),
    }
}

/// The CPU's model name (from `/proc/cpuinfo` where there is one) and its thread count.
pub fn cpu_name() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{model}, {threads} threads")
}

/// Rejects benchmark sizes that are empty.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the flag.
pub fn check_sizes(what: &str, sizes: &[usize]) -> Result<()> {
    if sizes.is_empty() || sizes.contains(&0) {
        return Err(Error::invalid(
            what,
            format!("sizes must be at least 1, got {sizes:?}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_take_the_median_and_spread() {
        let s = Stats::of(&[3.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!(
            (s.median_ms, s.min_ms, s.max_ms, s.runs),
            (2.5, 1.0, 10.0, 4)
        );
        assert!(Stats::of(&[]).is_none());
    }

    #[test]
    fn cpu_f32_attention_matches_the_f64_reference() {
        let x = Array3::from_shape_fn((2, 300, 8), |(b, i, j)| {
            ((b * 7 + i * 3 + j) as f32 * 0.37).sin()
        });
        for causal in [false, true] {
            let op = Attention::new().heads(2).causal(causal);
            let r = crate::reference::attention(&op, x.view().into_dyn(), None).unwrap();
            let c = cpu_attention_f32(x.view(), 2, causal).into_dyn();
            let (rel, _) = crate::reference::compare(&c, &r.context);
            assert!(rel < 1e-5, "causal={causal}: rel {rel}");
        }
    }
}
