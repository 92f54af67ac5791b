//! `bench --backward`: the fused backward beside the fused forward on the same shapes.

use ndarray::Array4;
use serde::Serialize;
use wgpu_attention::bench::{self, Stats};
use wgpu_attention::{Attention, Context, Error, Inputs, Kernels, Options, Result};

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
            let op = Attention::new().causal(shape.causal).options(Options {
                kernels: family,
                ..Options::default()
            });
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
        "\nbackward (sdpa, {} heads of width {e}, batch {}{}; forward FLOP = 2·n²·(d_k+d_v)·batch, \
         backward FLOP = 2.5× forward; wall clock per call, median of {}):",
        shape.heads,
        shape.batch,
        if shape.causal { ", causal" } else { "" },
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

/// PyTorch's SDPA on one n: forward and autograd backward medians, the device it ran on and
/// its CPU thread count.
#[derive(Serialize)]
pub struct TorchRow {
    pub n: usize,
    pub forward_ms: f64,
    /// `None` when only the forward was timed.
    pub backward_ms: Option<f64>,
    pub threads: usize,
    /// `CPU`, or the GPU: `CUDA NVIDIA H100 80GB HBM3`, `MPS Apple GPU`.
    pub device: String,
}

impl TorchRow {
    /// `PyTorch CPU SDPA, 2 threads` or `PyTorch CUDA … SDPA`: `what` after the device.
    pub fn label(&self, what: &str) -> String {
        match self.device.as_str() {
            "CPU" => format!("PyTorch CPU {what}, {} threads", self.threads),
            gpu => format!("PyTorch {gpu} {what}"),
        }
    }
}

/// What `benches/torch_peer.py` gave.
pub enum TorchPeer {
    /// PyTorch's version, and a row per n.
    Rows(String, Vec<TorchRow>),
    /// No `python3`, or no `torch` in it: why.
    Unavailable(String),
    /// The script failed: its last line of stderr.
    Failed(String),
}

/// PyTorch's SDPA at each of `n` on `shape` (its heads, their width, batch, mask and
/// `repeats` timed calls after one untimed one; `shape.warmup` is not used), when `python3`
/// has `torch` (`benches/torch_peer.py`): the forward with autograd recording and the
/// backward, or with `forward_only` the forward alone under `torch.inference_mode()`. With
/// `gpu` (our adapter is a GPU) on torch's GPU where it has one (CUDA, ROCm, MPS), so that
/// a ratio compares the same kind of device; else on the CPU.
pub fn torch_peer(n: &[usize], shape: &Shape, forward_only: bool, gpu: bool) -> TorchPeer {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/torch_peer.py");
    let n: Vec<String> = n.iter().map(|n| n.to_string()).collect();
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(script)
        .args(["--n", &n.join(",")])
        .args(["--heads", &shape.heads.to_string()])
        .args(["--e", &(shape.d / shape.heads).to_string()])
        .args(["--batch", &shape.batch.to_string()])
        .args(["--repeats", &shape.repeats.to_string()]);
    if shape.causal {
        cmd.arg("--causal");
    }
    if forward_only {
        cmd.arg("--forward-only");
    }
    cmd.args(["--device", if gpu { "auto" } else { "cpu" }]);
    if gpu {
        // GPU-sized problems on a torch without a GPU: only what the CPU finishes.
        cmd.args(["--cpu-flop-max", "2e10"]);
    }
    let out = match cmd.output() {
        Ok(out) if out.status.success() => out,
        Ok(out) if out.status.code() == Some(3) => {
            return TorchPeer::Unavailable("python3 has no torch".into());
        }
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            return TorchPeer::Failed(err.lines().last().unwrap_or("").to_string());
        }
        Err(e) => return TorchPeer::Unavailable(e.to_string()),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let version = stdout
        .lines()
        .find_map(|l| l.strip_prefix("# torch "))
        .unwrap_or("?")
        .trim()
        .to_string();
    let device = stdout
        .lines()
        .find_map(|l| l.strip_prefix("# device "))
        .map_or("CPU".to_string(), |d| {
            let (kind, name) = d.trim().split_once(' ').unwrap_or((d.trim(), ""));
            match kind {
                "cpu" => "CPU".to_string(),
                other => format!("{} {}", other.to_uppercase(), name.replace('_', " ")),
            }
        });
    let rows = stdout
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [n, fwd, bwd, threads] = f[..] else {
                return None;
            };
            Some(TorchRow {
                n: n.parse().ok()?,
                forward_ms: fwd.parse().ok()?,
                backward_ms: bwd.parse().ok(),
                threads: threads.parse().ok()?,
                device: device.clone(),
            })
        })
        .collect();
    TorchPeer::Rows(version, rows)
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
