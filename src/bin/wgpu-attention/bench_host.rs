//! `bench --host`: where a whole call on Q, K, V arrays spends its time besides the kernels,
//! beside a plain copy of the same bytes timed in the same process. For each length and dtype:
//! the call's wall time (median), its kernels' time (GPU timestamps, or each kernel alone),
//! `host` = call − kernels, the host phases (upload, record, readback), and the plain copy of
//! the call's input and output bytes into fresh memory (what any one-pass program pays, page
//! faults of first touch included) and into memory already touched (bandwidth alone).

use std::time::{Duration, Instant};

use ndarray::Array4;
use wgpu_attention::{Attention, Context, Dtype, Inputs, Result};

/// What `bench --host` sweeps.
pub struct HostSweep<'a> {
    pub n: &'a [usize],
    pub width: usize,
    pub heads: usize,
    pub batch: usize,
    pub repeats: usize,
    pub warmup: usize,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The copy a one-pass call makes of `arrays` (inputs, and the output's size): into fresh
/// memory, then again into the same memory (warm). Milliseconds.
fn plain_copies(arrays: &[&[f32]], bytes_per_value: usize) -> (f64, f64) {
    let start = Instant::now();
    let mut copies: Vec<Vec<u8>> = arrays
        .iter()
        .map(|a| bytemuck::cast_slice::<f32, u8>(a)[..a.len() * bytes_per_value].to_vec())
        .collect();
    let fresh = ms(start.elapsed());
    let start = Instant::now();
    for (copy, a) in copies.iter_mut().zip(arrays) {
        copy.copy_from_slice(&bytemuck::cast_slice::<f32, u8>(a)[..a.len() * bytes_per_value]);
    }
    let warm = ms(start.elapsed());
    std::hint::black_box(&copies);
    (fresh, warm)
}

/// Runs the sweep and prints its table.
///
/// # Errors
/// As the calls.
pub fn run(ctx: &Context, sweep: &HostSweep<'_>) -> Result<bool> {
    println!(
        "host side of a call on Q, K, V arrays: batch {}, heads {}, width {}, causal, context only",
        sweep.batch, sweep.heads, sweep.width
    );
    println!(
        "{:>6} {:>4} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "n",
        "type",
        "call ms",
        "kernels",
        "host",
        "upload",
        "record",
        "readback",
        "copy ms",
        "warm copy",
        "u+r+r/c",
        "u+r+r/w"
    );
    let f16_ok = ctx.require_f16().is_ok();
    for &n in sweep.n {
        let shape = (sweep.batch, sweep.heads, n, sweep.width);
        let make = |salt: usize| {
            Array4::from_shape_fn(shape, |(b, h, i, c)| {
                (((b * 31 + h * 17 + i * 7 + c * 3 + salt) % 97) as f32 / 97.0 - 0.5) * 2.0
            })
        };
        let (q, k, v) = (make(1), make(2), make(3));
        for dtype in [Dtype::F32, Dtype::F16] {
            if dtype == Dtype::F16 && !f16_ok {
                continue;
            }
            let op = Attention::new()
                .causal(true)
                .return_weights(false)
                .dtype(dtype);
            let call = || op.run(ctx, Inputs::qkv(&q, &k, &v));
            for _ in 0..sweep.warmup {
                call()?;
            }
            let mut walls = Vec::new();
            let mut phases = Vec::new();
            let mut out = None;
            for _ in 0..sweep.repeats {
                let before = ctx.phase_times();
                let start = Instant::now();
                out = Some(call()?);
                walls.push(ms(start.elapsed()));
                phases.push(ctx.phase_times().since(&before));
            }
            ctx.set_profiling(true);
            call()?;
            let kernels: f64 = ctx.kernel_times().iter().map(|t| t.ms).sum();
            ctx.set_profiling(false);
            let wall = median(walls);
            let phase = |f: fn(&wgpu_attention::PhaseTimes) -> Duration| {
                median(phases.iter().map(|p| ms(f(p))).collect())
            };
            let out = out.expect("at least one repeat");
            let bytes = if dtype == Dtype::F16 { 2 } else { 4 };
            let context = out.context.as_slice().unwrap_or_default();
            let arrays = [
                q.as_slice().unwrap_or_default(),
                k.as_slice().unwrap_or_default(),
                v.as_slice().unwrap_or_default(),
                context,
            ];
            let (fresh, warm) = plain_copies(&arrays, bytes);
            let (upload, record, readback) = (
                phase(|p| p.upload),
                phase(|p| p.record),
                phase(|p| p.readback),
            );
            let moved = upload + record + readback;
            println!(
                "{:>6} {:>4} {:>9.2} {:>9.2} {:>8.2} {:>8.2} {:>8.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
                n,
                dtype.to_string(),
                wall,
                kernels,
                wall - kernels,
                upload,
                record,
                readback,
                fresh,
                warm,
                moved / fresh,
                moved / warm
            );
        }
    }
    println!(
        "\nhost: the call's wall time less its kernels' (from a separate profiled run: noisy). \
         copy: the call's input and output bytes (as the call stores them, f32 or f16) copied \
         once in this process into fresh memory; warm copy: into the same memory again. \
         u+r+r/c, u+r+r/w: upload + record + readback over the copy, over the warm copy."
    );
    Ok(true)
}
