//! `wgpu-attention report --out DIR`: the tables the docs show, measured in one run on this
//! machine's adapter and written as `DIR/results.md` (a dated page) and `DIR/results.json`
//! (every row): the forward against the one-thread f32 ndarray CPU path (and PyTorch's CPU
//! SDPA where `python3` has `torch`), the fused backward, KV-cache decoding, the matmul, and
//! a fresh process's first call. This module holds the command and runs it start to end:
//! [`first_call`] first, in fresh processes, then [`measure`]'s sections with [`torch`]'s
//! PyTorch rows beside the forward and the backward, gathered into a [`json::Report`] that
//! is written as `results.json` and rendered by [`markdown`] as `results.md`.

mod first_call;
mod json;
mod markdown;
mod measure;
mod torch;

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use ndarray::Array3;
use wgpu_attention::bench;
use wgpu_attention::{Attention, Dims, Error, Inputs, Kernels, Profiling, Result};

use crate::bench_backward::Shape;
use crate::GpuArgs;

#[derive(Args)]
pub struct ReportArgs {
    /// Directory to write results.md and results.json into (created if missing).
    #[arg(long, required_unless_present = "first_call_child")]
    out: Option<PathBuf>,
    /// Small sizes and one timed run each: checks that every section runs (seconds), not a
    /// measurement.
    #[arg(long)]
    quick: bool,
    /// Timed runs per measurement, the median reported (default 5; 1 with --quick).
    #[arg(long, value_parser = crate::args::at_least_one, allow_negative_numbers = true)]
    repeats: Option<usize>,
    /// Leave PyTorch out even where python3 has torch.
    #[arg(long)]
    no_torch: bool,
    /// Kernel families other than the one `auto` picks are timed at a size only while their
    /// time at the size before projects under this many ms per call (n² for attention, m³
    /// for the matmul); `auto`'s family is timed at every size.
    #[arg(long, default_value_t = 1000.0)]
    max_call_ms: f64,
    /// Internal: one first-call measurement (0: the README's example, 1: a fused call), run
    /// by the report in a process of its own; prints JSON.
    #[arg(long, hide = true)]
    first_call_child: Option<usize>,
    #[command(flatten)]
    adapter: GpuArgs,
}

/// The sizes of each section.
struct Sizes {
    /// Forward: sequence lengths, the width d over all heads, the heads and the batch.
    forward_n: Vec<usize>,
    d: usize,
    heads: usize,
    batch: usize,
    /// The CPU peers (ndarray, the f64 reference, PyTorch's CPU SDPA) only where a
    /// forward's FLOP stay under this (GPU-sized problems would take them minutes).
    cpu_flop_max: Option<f64>,
    /// The adapter is a GPU: PyTorch runs on its GPU (CUDA, ROCm, MPS) where it has one.
    gpu: bool,
    /// Backward: sequence lengths (width d, one head, batch 1).
    backward_n: Vec<usize>,
    /// Decode: cache lengths, batches, heads, width per head.
    decode_n: Vec<usize>,
    decode_batch: Vec<usize>,
    decode_heads: usize,
    decode_d: usize,
    /// The square matmul's sizes.
    matmul: Vec<usize>,
    /// The first call's second problem: X of (1, n, d), fused.
    first_call: (usize, usize),
}

impl Sizes {
    /// `--quick`'s, a GPU's (`gpu`: the default adapter is not a CPU) or a CPU adapter's.
    fn new(quick: bool, gpu: bool) -> Self {
        if !quick && gpu {
            // What a GPU is used for: batch 4 × 16 heads of width 64, up to 16,384 tokens.
            return Sizes {
                forward_n: vec![1024, 4096, 16384],
                d: 16 * 64,
                heads: 16,
                batch: 4,
                cpu_flop_max: Some(crate::torch_peer::CPU_FLOP_MAX),
                gpu,
                backward_n: vec![1024, 4096],
                decode_n: vec![1024, 4096],
                decode_batch: vec![1, 8],
                decode_heads: 32,
                decode_d: 128,
                matmul: vec![1024, 4096],
                first_call: (4096, 64),
            };
        }
        if quick {
            Sizes {
                forward_n: vec![32, 96],
                d: 16,
                heads: 1,
                batch: 1,
                cpu_flop_max: None,
                gpu,
                backward_n: vec![32],
                decode_n: vec![8, 24],
                decode_batch: vec![1, 2],
                decode_heads: 2,
                decode_d: 8,
                matmul: vec![32, 64],
                first_call: (128, 16),
            }
        } else {
            Sizes {
                forward_n: vec![256, 1024, 4096],
                d: 64,
                heads: 1,
                batch: 1,
                cpu_flop_max: None,
                gpu,
                backward_n: vec![1024, 4096],
                decode_n: vec![256, 1024, 4096],
                decode_batch: vec![1, 8],
                decode_heads: 8,
                decode_d: 64,
                matmul: vec![256, 1024],
                first_call: (1024, 64),
            }
        }
    }
}

impl Sizes {
    /// `args`' sizes: GPU-sized problems where the adapter a context would open is a GPU
    /// (its own type, not the stand-in's: the stand-in is for tests).
    fn of(args: &ReportArgs) -> Self {
        let gpu = args
            .adapter
            .adapter
            .device_type()
            .is_some_and(|t| t != wgpu_attention::wgpu::DeviceType::Cpu);
        Sizes::new(args.quick, gpu)
    }

    /// The lengths of `n` PyTorch is asked for: on a GPU adapter all of them (torch takes its
    /// GPU where it has one, and on its CPU leaves out what is past the CPU's share itself:
    /// `benches/torch_peer.py --cpu-flop-max`), else [`Sizes::cpu_sized`].
    fn torch_sized(&self, n: &[usize]) -> Vec<usize> {
        match self.gpu {
            true => n.to_vec(),
            false => self.cpu_sized(n),
        }
    }

    /// The lengths of `n` at which the CPU peers run (a forward of Q = K = V = X: 4·n²·d
    /// FLOP a batch index under [`Sizes::cpu_flop_max`]).
    fn cpu_sized(&self, n: &[usize]) -> Vec<usize> {
        let flop = |n: usize| 4.0 * (n * n) as f64 * self.d as f64 * self.batch as f64;
        n.iter()
            .copied()
            .filter(|&n| self.cpu_flop_max.is_none_or(|max| flop(n) <= max))
            .collect()
    }
}

/// Untimed runs before each measurement's timed ones.
const WARMUP: usize = 1;

/// `report`: measures every section and writes `results.json` and `results.md` into `--out`
/// (as `--first-call-child`, one first-call measurement printed as JSON instead).
///
/// # Errors
/// `--out` missing or not writable, a first-call process that fails, GPU errors.
pub fn report_cmd(args: &ReportArgs) -> Result<bool> {
    if let Some(which) = args.first_call_child {
        return first_call::child(args, which);
    }
    let Some(out) = &args.out else {
        return Err(Error::invalid("--out", "a directory is required"));
    };
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, format!("cannot create: {e}")))?;
    crate::say_build_profile();
    let started = Instant::now();
    let load_at_start = json::load_average();
    // GPU-sized problems where the adapter a context would open is a GPU (its own type, not
    // the stand-in's: the stand-in is for tests).
    let sizes = Sizes::of(args);
    let repeats = args
        .repeats
        .unwrap_or(if args.quick { 1 } else { 5 })
        .max(1);

    let progress = ProgressBar::new(0);
    progress.set_style(
        ProgressStyle::with_template("{elapsed:>4} {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let say = |s: String| progress.suspend(|| println!("{s}"));
    let _heartbeat = crate::heartbeat::Heartbeat::start("report", &progress);

    // The first calls run in processes of their own before this one sets up anything: they
    // are a user's first call, with the tuner's usual budget.
    progress.set_length(2 * first_call::CALLS as u64);
    progress.set_message("first call, caches as found");
    let first_call = first_call::measure(args, out, &progress)?;
    say(format!("first call: done ({})", elapsed(started)));

    // A benchmark times what the tuner finds best, whatever that costs to find.
    crate::tune_cmd::measure_every_candidate();
    let ctx = args.adapter.open()?;
    let info = ctx.adapter_info();
    let timing = match ctx.set_profiling(true) {
        Profiling::Timestamps => "per-kernel GPU time from timestamp queries",
        _ => "per-kernel time: each kernel submitted alone, wall clock",
    };
    let families = Kernels::available(&ctx);
    let torch = !args.no_torch;
    let n_max = sizes.forward_n.iter().copied().max().unwrap_or(1);
    let x = Array3::<f32>::zeros((1, n_max, sizes.d));
    let auto = bench::families(
        &ctx,
        Some(Kernels::Auto),
        &Dims::new(&Attention::new(), &Inputs::x(&x))?,
    )?
    .first()
    .copied()
    .unwrap_or(Kernels::Storage);

    let run = measure::Run {
        ctx: &ctx,
        families: &families,
        auto,
        sizes: &sizes,
        shape: Shape {
            d: sizes.d,
            heads: sizes.heads,
            batch: sizes.batch,
            causal: false,
            dtype: wgpu_attention::Dtype::F32,
            warmup: WARMUP,
            repeats,
        },
        max_call_ms: args.max_call_ms,
        progress: &progress,
    };
    // At most: families dropped by the budget take their steps off as they go.
    let steps = 2 * first_call::CALLS + 1 + run.steps() + 2 * usize::from(torch);
    progress.set_length(steps as u64);

    progress.set_message("FMA ceiling");
    let peak = bench::fma_peak(&ctx)?;
    progress.inc(1);

    let matmul = run.matmul(peak)?;
    say(format!("matmul: done ({})", elapsed(started)));

    let (mut forward, timed_at) = run.forward(peak)?;
    let pytorch = if torch {
        let (pytorch, rows) = torch::forward(
            &sizes.torch_sized(&sizes.forward_n),
            (&run.shape, sizes.gpu),
            &progress,
        );
        forward.pytorch = rows;
        pytorch
    } else {
        torch::left_out()
    };
    say(format!("forward: done ({})", elapsed(started)));

    let mut backward = run.backward(&timed_at)?;
    if torch {
        if pytorch.available {
            let n = sizes.torch_sized(&sizes.backward_n);
            backward.pytorch = torch::backward(&n, (&run.shape, sizes.gpu), &progress);
        }
        progress.inc(1);
    }
    say(format!("backward: done ({})", elapsed(started)));

    let decode = run.decode()?;
    say(format!("decode: done ({})", elapsed(started)));
    progress.finish_and_clear();

    let report = json::Report {
        generator: "wgpu-attention report",
        crate_version: env!("CARGO_PKG_VERSION"),
        git_commit: json::git_commit(),
        build_profile: if cfg!(debug_assertions) {
            "dev"
        } else {
            "release"
        },
        date_utc: json::utc_now(),
        quick: args.quick,
        warmup: WARMUP,
        repeats,
        timing: timing.to_string(),
        auto_family: auto.to_string(),
        max_call_ms: args.max_call_ms,
        duration_s: started.elapsed().as_secs_f64(),
        load_average: [load_at_start, json::load_average()],
        adapter: json::AdapterJson::of(&info),
        cpu: json::CpuJson::here(),
        pytorch,
        fma_peak_gflops: peak,
        matmul,
        forward,
        backward,
        decode,
        first_call,
    };
    let json_path = out.join("results.json");
    let text = serde_json::to_string_pretty(&report)
        .map_err(|e| Error::invalid("results.json", e.to_string()))?;
    std::fs::write(&json_path, text + "\n").map_err(|e| Error::io(&json_path, e))?;
    let md_path = out.join("results.md");
    std::fs::write(&md_path, markdown::render(&report)).map_err(|e| Error::io(&md_path, e))?;
    println!(
        "wrote {} and {} in {}",
        md_path.display(),
        json_path.display(),
        elapsed(started)
    );
    Ok(true)
}

/// `1 min 05 s` or `12.3 s` since `t`.
fn elapsed(t: Instant) -> String {
    markdown::duration(t.elapsed())
}

#[cfg(test)]
mod tests {
    use super::Sizes;

    #[test]
    fn a_gpu_gets_gpu_sized_problems_and_the_cpu_peers_only_where_they_finish() {
        let gpu = Sizes::new(false, true);
        assert_eq!((gpu.batch, gpu.heads, gpu.d / gpu.heads), (4, 16, 64));
        assert_eq!(gpu.forward_n.iter().max(), Some(&16384));
        // 4·n²·d·batch: 17 GFLOP at 1024 (timed), 275 at 4096 and more (left out).
        assert_eq!(gpu.cpu_sized(&gpu.forward_n), vec![1024]);
        let cpu = Sizes::new(false, false);
        assert_eq!((cpu.batch, cpu.heads), (1, 1));
        assert_eq!(cpu.cpu_sized(&cpu.forward_n), cpu.forward_n);
        // --quick is quick on any adapter.
        assert_eq!(
            Sizes::new(true, true).forward_n,
            Sizes::new(true, false).forward_n
        );
    }
}
