//! Timing, in one place: per-kernel GPU times while profiling (timestamp queries around each
//! compute pass on GPUs, each kernel submitted alone and timed by the wall clock on CPU
//! adapters, whose timestamps do not bracket a pass's work), and the wall-clock measurements
//! the tuner and the benchmarks share ([`timed_submit`], [`measure`], [`Stats`]).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
#[cfg(not(target_arch = "wasm32"))]
use std::time::Instant;
// The browser has no `std::time::Instant` (it panics there): `performance.now()` instead.
#[cfg(target_arch = "wasm32")]
use web_time::Instant;

use serde::Serialize;

use super::Gpu;
use crate::error::Result;
use crate::gpu::readback::{self, Pending};

/// Passes one forward pass can time.
const CAPACITY: u32 = 64;

/// The time one compute pass took on the GPU.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct KernelTime {
    /// The kernel's file name.
    pub kernel: &'static str,
    /// Milliseconds between the pass's start and end timestamps.
    pub ms: f64,
}

/// How per-kernel times are taken while profiling ([`crate::Context::set_profiling`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profiling {
    /// Not profiling.
    Off = 0,
    /// Timestamp queries around each compute pass.
    Timestamps = 1,
    /// Each kernel submitted alone and timed with the wall clock.
    WallClock = 2,
}

/// A context's profiling state: the mode, the timestamps of the submission being recorded,
/// and the times of the last one.
#[derive(Default)]
pub(crate) struct Timing {
    mode: AtomicU8,
    profiler: Mutex<Option<Profiler>>,
    times: Mutex<Vec<KernelTime>>,
}

impl Timing {
    /// Sets the mode: timestamps where `timestamps` (the device has them and they bracket
    /// the work), else the wall clock.
    pub(crate) fn set(&self, on: bool, timestamps: bool) -> Profiling {
        let mode = match (on, timestamps) {
            (false, _) => Profiling::Off,
            (true, true) => Profiling::Timestamps,
            (true, false) => Profiling::WallClock,
        };
        self.mode.store(mode as u8, Ordering::Relaxed);
        mode
    }

    /// The current mode.
    pub(crate) fn mode(&self) -> Profiling {
        match self.mode.load(Ordering::Relaxed) {
            1 => Profiling::Timestamps,
            2 => Profiling::WallClock,
            _ => Profiling::Off,
        }
    }

    /// The times of the last submission's passes, in order.
    pub(crate) fn times(&self) -> Vec<KernelTime> {
        self.times.lock().map(|t| t.clone()).unwrap_or_default()
    }

    fn push(&self, time: KernelTime) {
        if let Ok(mut t) = self.times.lock() {
            t.push(time);
        }
    }
}

/// Starts timing the passes recorded from now on, when profiling is on.
pub(crate) fn begin(ctx: &Gpu) {
    let timing = &ctx.timing;
    if let Ok(mut t) = timing.times.lock() {
        t.clear();
    }
    if timing.mode() == Profiling::Timestamps {
        if let Ok(mut p) = timing.profiler.lock() {
            *p = Some(Profiler::new(ctx));
        }
    }
}

/// Records the resolve of the timestamps taken since [`begin`]: what to read back and the
/// passes' labels.
pub(crate) fn end(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
) -> Option<(Pending, Vec<&'static str>)> {
    let profiler = ctx.timing.profiler.lock().ok()?.take()?;
    profiler.resolve(ctx, encoder)
}

/// Stores the timestamps read back for `labels` as the last submission's times.
pub(crate) fn store(ctx: &Gpu, words: &[f32], labels: &[&'static str]) {
    let t = times(words, labels, ctx.queue.get_timestamp_period());
    if let Ok(mut times) = ctx.timing.times.lock() {
        *times = t;
    }
}

/// Finishes `encoder` with the resolve of the timestamps taken since [`begin`] (if any),
/// submits it, waits, stores the kernels' times and returns the contents of `pending`, in
/// order: the readback of every timed call.
///
/// # Errors
/// As [`readback::finish_async`].
pub(crate) async fn submit_and_read_async(
    ctx: &Gpu,
    encoder: wgpu::CommandEncoder,
    pending: Vec<readback::Pending>,
) -> Result<Vec<Vec<f32>>> {
    let read = submit_and_read_scanned_async(ctx, encoder, pending).await?;
    Ok(read.into_iter().map(|(values, _)| values).collect())
}

/// [`submit_and_read_async`] with the index of each result's first NaN or infinity, found
/// while copying it out ([`readback::finish_scanned_async`]).
///
/// # Errors
/// As [`readback::finish_async`].
pub(crate) async fn submit_and_read_scanned_async(
    ctx: &Gpu,
    mut encoder: wgpu::CommandEncoder,
    mut pending: Vec<readback::Pending>,
) -> Result<Vec<(Vec<f32>, Option<usize>)>> {
    let labels = end(ctx, &mut encoder).map(|(p, labels)| {
        pending.push(p);
        labels
    });
    let submission = ctx.queue.submit([encoder.finish()]);
    let mut results = readback::finish_scanned_async(ctx, submission, pending).await?;
    if let Some(labels) = labels {
        store(ctx, &results.pop().unwrap_or_default().0, &labels);
    }
    Ok(results)
}

/// [`submit_and_read_async`], blocking.
///
/// # Errors
/// As [`submit_and_read_async`].
pub(crate) fn submit_and_read(
    ctx: &Gpu,
    encoder: wgpu::CommandEncoder,
    pending: Vec<readback::Pending>,
) -> Result<Vec<Vec<f32>>> {
    crate::gpu::oneshot::block_on(submit_and_read_async(ctx, encoder, pending))
}

/// Records one compute pass labelled `label`, with `body` setting its pipeline and dispatch:
/// bracketed by timestamps, or submitted alone and timed by the wall clock, when profiling.
///
/// # Errors
/// GPU errors while waiting (wall-clock mode).
pub(crate) fn pass(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    label: &'static str,
    body: impl FnOnce(&mut wgpu::ComputePass<'_>),
) -> Result<()> {
    let wall_clock = ctx.timing.mode() == Profiling::WallClock;
    let started = if wall_clock {
        // Finish what came before, so the clock sees this kernel alone.
        submit_and_wait(ctx, encoder)?;
        Some(Instant::now())
    } else {
        None
    };
    {
        let mut profiler = ctx
            .timing
            .profiler
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(label),
            timestamp_writes: profiler.as_mut().and_then(|p| p.next(label)),
        });
        body(&mut pass);
    }
    if let Some(t) = started {
        submit_and_wait(ctx, encoder)?;
        ctx.timing.push(KernelTime {
            kernel: label,
            ms: t.elapsed().as_secs_f64() * 1e3,
        });
    }
    Ok(())
}

/// Submits what `encoder` holds so far, waits for it, and leaves a fresh encoder in its place
/// (wall-clock profiling).
fn submit_and_wait(ctx: &Gpu, encoder: &mut wgpu::CommandEncoder) -> Result<()> {
    let fresh = ctx
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("profiled"),
        });
    let done = std::mem::replace(encoder, fresh);
    let submission = ctx.queue.submit([done.finish()]);
    readback::wait(ctx, submission)
}

/// Submits what `f` records, waits, and returns the wall time in milliseconds and the
/// kernels' GPU times (empty without profiling).
///
/// # Errors
/// Whatever `f` or the GPU returns.
pub(crate) fn timed_submit(
    ctx: &Gpu,
    f: impl FnOnce(&mut wgpu::CommandEncoder) -> Result<()>,
) -> Result<(f64, Vec<KernelTime>)> {
    ctx.scoped(|| {
        let _open = ctx.pool.open();
        let t = Instant::now();
        let mut encoder = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("timed"),
            });
        begin(ctx);
        f(&mut encoder)?;
        submit_and_read(ctx, encoder, Vec::new())?;
        let wall = t.elapsed().as_secs_f64() * 1e3;
        Ok((wall, ctx.timing.times()))
    })
}

/// How long one submission of `f`'s passes took, as the tuner compares candidates: the sum
/// of the passes' GPU timestamps where the device takes timestamps that bracket the work (a
/// GPU with `TIMESTAMP_QUERY`: profiling is turned on for this submission if it was off),
/// else the wall clock around its submit and wait (what a CPU adapter's work costs, and on a
/// GPU without timestamps the best there is).
///
/// # Errors
/// As [`timed_submit`].
pub(crate) fn gpu_time(
    ctx: &Gpu,
    f: impl FnOnce(&mut wgpu::CommandEncoder) -> Result<()>,
) -> Result<f64> {
    let before = ctx.timing.mode();
    let stamped = match before {
        Profiling::Timestamps => true,
        Profiling::WallClock => false,
        Profiling::Off => {
            // Timestamps, or nothing: the wall-clock mode submits each pass on its own.
            let on = ctx.set_profiling(true) == Profiling::Timestamps;
            if !on {
                ctx.set_profiling(false);
            }
            on
        }
    };
    let timed = timed_submit(ctx, f);
    if before == Profiling::Off && stamped {
        ctx.set_profiling(false);
    }
    let (wall, times) = timed?;
    let gpu: f64 = times.iter().map(|t| t.ms).sum();
    Ok(if stamped && gpu > 0.0 { gpu } else { wall })
}

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
    let stats = Stats::of(&times).unwrap_or(Stats {
        median_ms: 0.0,
        min_ms: 0.0,
        max_ms: 0.0,
        runs: 0,
    });
    Ok((stats, outs))
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

/// Timestamp queries for the passes of one submission.
struct Profiler {
    set: wgpu::QuerySet,
    labels: Vec<&'static str>,
}

impl Profiler {
    fn new(ctx: &Gpu) -> Self {
        let set = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("kernel timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: 2 * CAPACITY,
        });
        Profiler {
            set,
            labels: Vec::new(),
        }
    }

    /// Timestamp writes for the next pass, `None` once the set is full.
    fn next(&mut self, label: &'static str) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        let i = self.labels.len() as u32;
        if i >= CAPACITY {
            return None;
        }
        self.labels.push(label);
        Some(wgpu::ComputePassTimestampWrites {
            query_set: &self.set,
            beginning_of_pass_write_index: Some(2 * i),
            end_of_pass_write_index: Some(2 * i + 1),
        })
    }

    /// Records the resolve and the copy out; returns what to read back and the labels.
    fn resolve(
        self,
        ctx: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
    ) -> Option<(Pending, Vec<&'static str>)> {
        let count = 2 * self.labels.len() as u32;
        if count == 0 {
            return None;
        }
        let bytes = u64::from(count) * 8;
        let resolved = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("resolved timestamps"),
            size: bytes,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        encoder.resolve_query_set(&self.set, 0..count, &resolved, 0);
        // Read as f32 words; `times` puts the u64 ticks back together.
        let pending = readback::copy_out(
            ctx,
            encoder,
            &crate::gpu::pool::Buf::unpooled(resolved),
            2 * count as usize,
        );
        Some((pending, self.labels))
    }
}

/// Pairs of u64 ticks (read back as f32 words) into milliseconds per pass.
fn times(words: &[f32], labels: &[&'static str], period_ns: f32) -> Vec<KernelTime> {
    let ticks: Vec<u64> = words
        .chunks_exact(2)
        .map(|w| u64::from(w[0].to_bits()) | (u64::from(w[1].to_bits()) << 32))
        .collect();
    labels
        .iter()
        .zip(ticks.chunks_exact(2))
        .map(|(&kernel, t)| KernelTime {
            kernel,
            ms: t[1].saturating_sub(t[0]) as f64 * f64::from(period_ns) * 1e-6,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_reassemble_from_words() {
        let begin: u64 = 5_000_000_000;
        let end: u64 = begin + 2_500_000;
        let words: Vec<f32> = [begin, end]
            .iter()
            .flat_map(|t| [f32::from_bits(*t as u32), f32::from_bits((*t >> 32) as u32)])
            .collect();
        let t = times(&words, &["k"], 1.0);
        assert_eq!(t.len(), 1);
        assert!((t[0].ms - 2.5).abs() < 1e-9);
    }

    #[test]
    fn stats_take_the_median_and_spread() {
        let s = Stats::of(&[3.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!(
            (s.median_ms, s.min_ms, s.max_ms, s.runs),
            (2.5, 1.0, 10.0, 4)
        );
        assert!(Stats::of(&[]).is_none());
    }
}
