//! `bench --backward`: the fused backward beside the fused forward on the same shapes.

use ndarray::Array4;
use serde::Serialize;
use wgpu_attention::bench::{self, Stats};
use wgpu_attention::{Attention, Context, Error, Inputs, Kernels, Options, Result};

use crate::torch_peer::{torch_peer, TorchPeer};

/// An attention problem and how to time it, as `bench`'s flags give them: width `d` split
/// over `heads` (per-head width `d / heads`), `batch`, `causal`, and `warmup` untimed then
/// `repeats` timed runs per measurement. `bench`'s forward sweep, its `--backward` table and
/// `report` share it.
#[derive(Clone, Copy)]
pub struct Shape {
    pub d: usize,
    pub heads: usize,
    pub batch: usize,
    pub causal: bool,
    /// The GPU paths' operand type (the CPU's stay f32).
    pub dtype: wgpu_attention::Dtype,
    pub warmup: usize,
    pub repeats: usize,
}

/// The problems to time: `shape` at each of `n` keys and queries.
pub struct Sweep<'a> {
    pub n: &'a [usize],
    pub shape: Shape,
}

/// Kernel times as `name ms, name ms, …`, the column every `bench` table prints.
pub fn kernels(k: &[(String, f64)]) -> String {
    let parts: Vec<String> = k.iter().map(|(k, ms)| format!("{k} {ms:.2}")).collect();
    parts.join(", ")
}

/// One family's fused forward and backward at one `n`.
#[derive(Serialize)]
pub struct Row {
    pub family: String,
    pub n: usize,
    /// The forward's FLOP (2·n²·(d_k + d_v)·batch); the backward is counted as 2.5× that.
    pub forward_flop: f64,
    pub forward: Stats,
    pub forward_gflops: f64,
    pub backward: Stats,
    pub backward_gflops: f64,
    /// Backward median over forward median (wall clock).
    pub backward_over_forward: f64,
    /// The same ratio in CPU time of every thread of the process ([`cpu_ratio`]).
    pub cpu_backward_over_forward: Option<f64>,
    pub backward_kernels_ms: Vec<(String, f64)>,
}

/// What one (n, family) of a [`Sweep`] gave: a row, or why it was skipped.
pub enum Outcome {
    Row(Row),
    /// Past the device's limits: the family, n and the error.
    Skipped(Kernels, usize, Error),
}

/// Measures, per n and family, the fused forward's and the backward's median times, their
/// GFLOP/s (forward: 2·n²·(d_k + d_v) per batch index; backward: 2.5× that, as
/// FlashAttention's papers count it), the ratio backward / forward, and the same ratio of
/// CPU time (every thread of the process; on lavapipe the kernels' work, steadier than the
/// wall clock when other processes share the machine). `each` sees every outcome as it is
/// measured.
///
/// # Errors
/// GPU errors; a problem past the device's limits is an [`Outcome::Skipped`].
pub fn measure(
    ctx: &Context,
    sweep: &Sweep<'_>,
    families: &[Kernels],
    mut each: impl FnMut(&Outcome),
) -> Result<Vec<Outcome>> {
    let shape = &sweep.shape;
    let e = shape.d / shape.heads;
    let mut outcomes = Vec::new();
    for &n in sweep.n {
        let array_shape = (shape.batch, shape.heads, n, e);
        let wave = |salt: usize| {
            Array4::from_shape_fn(array_shape, move |(b, h, i, j)| {
                ((((b * 31 + h * 11 + i * 7 + j * 13) * salt) % 23) as f32 / 23.0 - 0.5) * 2.0
            })
        };
        let (q, k, v, d_o) = (wave(1), wave(2), wave(3), wave(5));
        let flop = 2.0 * (n * n * 2 * shape.d * shape.batch) as f64;
        for &family in families {
            let op = Attention::new()
                .causal(shape.causal)
                .dtype(shape.dtype)
                .options(Options::default().kernels(family));
            let arrays = [q.view(), k.view(), v.view(), d_o.view()];
            let outcome =
                match bench::gpu_forward_backward(ctx, &op, arrays, shape.warmup, shape.repeats) {
                    Ok([(fwd, _), (bwd, bwd_kernels)]) => {
                        let gflops = |f: f64, s: &Stats| f / (s.median_ms * 1e6);
                        Outcome::Row(Row {
                            family: family.to_string(),
                            n,
                            forward_flop: flop,
                            forward: fwd,
                            forward_gflops: gflops(flop, &fwd),
                            backward: bwd,
                            backward_gflops: gflops(2.5 * flop, &bwd),
                            backward_over_forward: bwd.median_ms / fwd.median_ms,
                            cpu_backward_over_forward: cpu_ratio(ctx, &op, arrays, shape.repeats)?,
                            backward_kernels_ms: bwd_kernels,
                        })
                    }
                    Err(e @ Error::LimitExceeded { .. }) => Outcome::Skipped(family, n, e),
                    Err(e) => return Err(e),
                };
            each(&outcome);
            outcomes.push(outcome);
        }
    }
    Ok(outcomes)
}

/// Prints [`measure`]'s table, then PyTorch's CPU SDPA on the same shapes ([`torch_peer`]).
///
/// # Errors
/// As [`measure`].
pub fn table(ctx: &Context, sweep: &Sweep<'_>, families: &[Kernels]) -> Result<()> {
    let shape = &sweep.shape;
    let e = shape.d / shape.heads;
    println!(
        "\nbackward (sdpa, {} heads of width {e}, batch {}{}{}; forward FLOP = 2·n²·(d_k+d_v)·batch, \
         backward FLOP = 2.5× forward; wall clock per call, median of {}):",
        shape.heads,
        shape.batch,
        if shape.causal { ", causal" } else { "" },
        match shape.dtype {
            wgpu_attention::Dtype::F16 => ", f16 operands",
            wgpu_attention::Dtype::F32 => "",
        },
        shape.repeats
    );
    println!(
        "family      n   forward ms  GFLOP/s   backward ms  GFLOP/s   bwd/fwd  cpu bwd/fwd   backward kernels (ms)"
    );
    measure(ctx, sweep, families, |outcome| match outcome {
        Outcome::Row(r) => {
            let cpu = match r.cpu_backward_over_forward {
                Some(r) => format!("{r:.2}x"),
                None => "-".into(),
            };
            println!(
                "{:<9} {:>6} {:>10.2} {:>8.2} {:>12.2} {:>8.2} {:>8.2}x {cpu:>11}   {}",
                r.family,
                r.n,
                r.forward.median_ms,
                r.forward_gflops,
                r.backward.median_ms,
                r.backward_gflops,
                r.backward_over_forward,
                kernels(&r.backward_kernels_ms)
            );
        }
        Outcome::Skipped(family, n, e) => println!("{family:<9} {n:>6}   skipped: {e}"),
    })?;
    let gpu = ctx.adapter_info().device_type != wgpu_attention::wgpu::DeviceType::Cpu;
    print_torch_peer(sweep, gpu);
    Ok(())
}

/// CPU seconds that every thread of this process has run so far (lavapipe's worker threads
/// included), from `/proc/self/task/*/schedstat` (nanoseconds); `None` where that is not
/// readable (not Linux).
fn process_cpu_seconds() -> Option<f64> {
    let mut ns = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        ns += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(ns as f64 * 1e-9)
}

/// The backward's CPU time over the forward's (`repeats` calls each after one untimed,
/// every thread of the process counted): on a CPU adapter (lavapipe) the work itself, which
/// other processes on a shared machine slow far less than the wall clock. `None` where CPU
/// time cannot be read or a side took none.
///
/// # Errors
/// GPU errors.
fn cpu_ratio(
    ctx: &Context,
    op: &Attention,
    [q, k, v, d_o]: [ndarray::ArrayView4<'_, f32>; 4],
    repeats: usize,
) -> Result<Option<f64>> {
    let op = op.return_weights(false);
    let timed = |run: &mut dyn FnMut() -> Result<()>| -> Result<Option<f64>> {
        run()?;
        let start = process_cpu_seconds();
        for _ in 0..repeats.max(1) {
            run()?;
        }
        Ok(start.zip(process_cpu_seconds()).map(|(a, b)| b - a))
    };
    let fwd = timed(&mut || op.run(ctx, Inputs::qkv(q, k, v)).map(drop))?;
    let saved = op
        .save_for_backward(true)
        .run(ctx, Inputs::qkv(q, k, v))?
        .saved
        .ok_or_else(|| Error::invalid("saved forward", "nothing saved"))?;
    let bwd = timed(&mut || saved.backward(ctx, d_o).map(drop))?;
    Ok(match (fwd, bwd) {
        (Some(f), Some(b)) if f > 0.0 && b > 0.0 => Some(b / f),
        _ => None,
    })
}

/// Prints [`torch_peer`] on `sweep`'s shapes as rows of the backward table, or a line saying
/// why there are none.
fn print_torch_peer(sweep: &Sweep<'_>, gpu: bool) {
    let rows = match torch_peer(sweep.n, &sweep.shape, false, gpu) {
        TorchPeer::Rows(_, rows) => rows,
        TorchPeer::Unavailable(why) => {
            println!("pytorch: not available ({why})");
            return;
        }
        TorchPeer::Failed(line) => {
            println!("pytorch: failed: {line}");
            return;
        }
    };
    for r in rows {
        let Some(bwd) = r.backward_ms else { continue };
        let (n, fwd) = (r.n as f64, r.forward_ms);
        let flop = 2.0 * n * n * 2.0 * sweep.shape.d as f64 * sweep.shape.batch as f64;
        let name = match r.device.as_str() {
            "CPU" => "torch-cpu".to_string(),
            gpu => format!(
                "torch-{}",
                gpu.split(' ').next().unwrap_or("gpu").to_lowercase()
            ),
        };
        println!(
            "{name:<9} {n:>6} {fwd:>10.2} {:>8.2} {bwd:>12.2} {:>8.2} {:>8.2}x {:>11}   {}, autograd",
            flop / (fwd * 1e6),
            2.5 * flop / (bwd * 1e6),
            bwd / fwd,
            "-",
            r.label("SDPA")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_counts_work_done() {
        let Some(start) = process_cpu_seconds() else {
            return; // not Linux
        };
        let mut x = 1.0f64;
        let t = std::time::Instant::now();
        while t.elapsed().as_millis() < 50 {
            x = std::hint::black_box(x * 1.000_000_1 + 1e-9);
        }
        let spent = process_cpu_seconds().unwrap() - start;
        assert!(spent > 0.005 && spent < 10.0, "{spent} s");
    }
}
