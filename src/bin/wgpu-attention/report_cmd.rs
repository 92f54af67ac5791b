//! `wgpu-attention report --out DIR`: the tables the docs show, measured in one run on this
//! machine's adapter and written as `DIR/results.md` (a dated page) and `DIR/results.json`
//! (every row): the forward against the one-thread f32 ndarray CPU path (and PyTorch's CPU
//! SDPA where `python3` has `torch`), the fused backward, KV-cache decoding, the matmul, and
//! a fresh process's first call. Each section calls the measuring code of the `bench`
//! subcommands ([`crate::bench_cmd::attention_at`], [`crate::bench_backward::measure`],
//! [`crate::bench_decode::measure`], [`crate::bench_cmd::matmul_record`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use ndarray::{Array2, Array3};
use serde::{Deserialize, Serialize};
use wgpu_attention::bench;
use wgpu_attention::{
    Attention, Context, Dims, Dtype, Error, Inputs, Kernels, Profiling, Projections, Result,
};

use crate::bench_backward::{Outcome, TorchPeer, TorchRow};
use crate::bench_cmd::Record;
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
    /// Forward: sequence lengths, and the width d (one head, batch 1).
    forward_n: Vec<usize>,
    d: usize,
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
    fn new(quick: bool) -> Self {
        if quick {
            Sizes {
                forward_n: vec![32, 96],
                d: 16,
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

/// The adapter as `results.json` names it.
#[derive(Serialize)]
struct AdapterJson {
    name: String,
    backend: String,
    device_type: String,
    driver: String,
    driver_info: String,
    vendor: u32,
    device: u32,
}

#[derive(Serialize)]
struct CpuJson {
    model: String,
    threads: usize,
}

#[derive(Serialize)]
struct TorchJson {
    available: bool,
    version: Option<String>,
    /// Why there is no PyTorch column, when there is none.
    note: Option<String>,
}

#[derive(Serialize)]
struct ForwardJson {
    d: usize,
    heads: usize,
    batch: usize,
    causal: bool,
    rows: Vec<Record>,
    skipped: Vec<String>,
    /// Families left out at larger sizes for the time a call would take.
    not_timed: Vec<String>,
    pytorch: Vec<TorchRow>,
}

#[derive(Serialize)]
struct BackwardJson {
    d: usize,
    heads: usize,
    batch: usize,
    causal: bool,
    rows: Vec<crate::bench_backward::Row>,
    skipped: Vec<String>,
    not_timed: Vec<String>,
    pytorch: Vec<TorchRow>,
}

#[derive(Serialize)]
struct DecodeJson {
    heads: usize,
    d: usize,
    dtype: String,
    rows: Vec<crate::bench_decode::Row>,
}

#[derive(Serialize)]
struct MatmulJson {
    sizes: Vec<usize>,
    rows: Vec<Record>,
    /// Families left out at larger sizes for the time a call would take.
    not_timed: Vec<String>,
}

/// One call timed twice in a fresh process, with its first time's phases.
#[derive(Serialize, Deserialize)]
struct CallTime {
    call: String,
    first_ms: f64,
    second_ms: f64,
    compile_ms: f64,
    pipelines: usize,
    tune_ms: f64,
    dispatch_ms: f64,
}

/// A fresh process's `Context::new` and first call, under one state of the caches.
#[derive(Serialize, Deserialize)]
struct FirstCall {
    caches: String,
    context_new_ms: f64,
    #[serde(flatten)]
    call: CallTime,
}

#[derive(Serialize)]
struct Report {
    generator: &'static str,
    crate_version: &'static str,
    /// `git rev-parse HEAD` of the source tree at run time, `-dirty` with changes to tracked
    /// files; `None` outside a git checkout.
    git_commit: Option<String>,
    build_profile: &'static str,
    date_utc: String,
    quick: bool,
    warmup: usize,
    repeats: usize,
    timing: String,
    /// The family `Kernels::Auto` picks for the largest forward call.
    auto_family: String,
    max_call_ms: f64,
    duration_s: f64,
    /// The 1-minute load average (`/proc/loadavg`) when the report started and ended: above
    /// the CPU's threads, other work shared the machine.
    load_average: [Option<f64>; 2],
    adapter: AdapterJson,
    cpu: CpuJson,
    pytorch: TorchJson,
    fma_peak_gflops: f64,
    matmul: MatmulJson,
    forward: ForwardJson,
    backward: BackwardJson,
    decode: DecodeJson,
    first_call: Vec<FirstCall>,
}

const WARMUP: usize = 1;

pub fn report_cmd(args: &ReportArgs) -> Result<bool> {
    if let Some(which) = args.first_call_child {
        return first_call_child(args, which);
    }
    let Some(out) = &args.out else {
        return Err(Error::invalid("--out", "a directory is required"));
    };
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, format!("cannot create: {e}")))?;
    let started = Instant::now();
    let load_at_start = load_average();
    let sizes = Sizes::new(args.quick);
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

    // The first calls run in processes of their own before this one sets up anything: they
    // are a user's first call, with the tuner's usual budget.
    progress.set_length(2 * FIRST_CALLS as u64);
    progress.set_message("first call, caches as found");
    let first_call = first_calls(args, out, &progress)?;
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

    let fwd_sweep = crate::bench_cmd::Sweep {
        d: sizes.d,
        heads: 1,
        batch: 1,
        causal: false,
        warmup: WARMUP,
        repeats,
        fused_only: false,
        resident: false,
        no_cpu: false,
    };
    let decode_points = sizes.decode_n.len() * sizes.decode_batch.len();
    // At most: families dropped by the budget take their steps off as they go.
    let steps = 2 * FIRST_CALLS
        + 1
        + sizes.matmul.len() * families.len()
        + sizes.forward_n.len() * fwd_sweep.steps(families.len())
        + sizes.backward_n.len() * families.len()
        + 2 * usize::from(torch)
        + 3 * decode_points;
    progress.set_length(steps as u64);
    let drop_steps = |k: usize| {
        let len = progress.length().unwrap_or(0);
        progress.set_length(len.saturating_sub(k as u64));
    };

    progress.set_message("FMA ceiling");
    let peak = bench::fma_peak(&ctx)?;
    progress.inc(1);

    let mut budget = Budget::new(auto, args.max_call_ms, 3);
    let mut matmul = MatmulJson {
        sizes: sizes.matmul.clone(),
        rows: Vec::new(),
        not_timed: Vec::new(),
    };
    for &m in &sizes.matmul {
        let timed = budget.families(&families, m);
        drop_steps(families.len() - timed.len());
        for family in timed {
            let r = crate::bench_cmd::matmul_record(
                &ctx,
                family,
                m,
                (WARMUP, repeats),
                peak,
                &progress,
            )?;
            budget.saw(family, m, r.stats.median_ms);
            matmul.rows.push(r);
        }
    }
    matmul.not_timed = budget.dropped;
    say(format!("matmul: done ({})", elapsed(started)));

    let mut forward = ForwardJson {
        d: sizes.d,
        heads: 1,
        batch: 1,
        causal: false,
        rows: Vec::new(),
        skipped: Vec::new(),
        not_timed: Vec::new(),
        pytorch: Vec::new(),
    };
    let mut budget = Budget::new(auto, args.max_call_ms, 2);
    // The families the forward timed at each n: the backward times those.
    let mut timed_at: Vec<(usize, Vec<Kernels>)> = Vec::new();
    let per_family = fwd_sweep.steps(1) - fwd_sweep.steps(0);
    for &n in &sizes.forward_n {
        let timed = budget.families(&families, n);
        drop_steps((families.len() - timed.len()) * per_family);
        let (rows, skipped) =
            crate::bench_cmd::attention_at(&ctx, &fwd_sweep, n, &timed, peak, &progress)?;
        for &family in &timed {
            let prefix = format!("gpu {family} ");
            let slowest = rows
                .iter()
                .filter(|r| r.path.starts_with(&prefix))
                .map(|r| r.stats.median_ms)
                .fold(0.0, f64::max);
            budget.saw(family, n, slowest);
        }
        timed_at.push((n, timed));
        forward.rows.extend(rows);
        forward.skipped.extend(skipped);
    }
    forward.not_timed = budget.dropped;
    let mut torch_info = TorchJson {
        available: false,
        version: None,
        note: Some("left out (--no-torch)".into()),
    };
    if torch {
        progress.set_message("PyTorch forward");
        let peer = crate::bench_backward::torch_peer(
            &sizes.forward_n,
            (1, sizes.d, 1),
            (false, true),
            repeats,
        );
        progress.inc(1);
        torch_info = match peer {
            TorchPeer::Rows(version, rows) => {
                forward.pytorch = rows;
                TorchJson {
                    available: true,
                    version: Some(version),
                    note: None,
                }
            }
            TorchPeer::Unavailable(why) => TorchJson {
                available: false,
                version: None,
                note: Some(if why.contains("no torch") {
                    "not available (no torch)".into()
                } else {
                    format!("not available ({why})")
                }),
            },
            TorchPeer::Failed(line) => TorchJson {
                available: false,
                version: None,
                note: Some(format!("failed: {line}")),
            },
        };
    }
    say(format!("forward: done ({})", elapsed(started)));

    let mut backward = BackwardJson {
        d: sizes.d,
        heads: 1,
        batch: 1,
        causal: false,
        rows: Vec::new(),
        skipped: Vec::new(),
        not_timed: Vec::new(),
        pytorch: Vec::new(),
    };
    for &n in &sizes.backward_n {
        // The forward's families at this n (or at the largest n it timed below this one).
        let timed = timed_at
            .iter()
            .rev()
            .find(|(m, _)| *m <= n)
            .map_or_else(|| families.clone(), |(_, f)| f.clone());
        drop_steps(families.len() - timed.len());
        for f in families.iter().filter(|f| !timed.contains(f)) {
            backward.not_timed.push(format!(
                "{f} at n = {n} (not timed by the forward at this size)"
            ));
        }
        let bwd_sweep = crate::bench_backward::Sweep {
            n: &[n],
            d: sizes.d,
            heads: 1,
            batch: 1,
            causal: false,
            warmup: WARMUP,
            repeats,
        };
        progress.set_message(format!("backward n={n}"));
        let outcomes = crate::bench_backward::measure(&ctx, &bwd_sweep, &timed, |_| {
            progress.inc(1);
        })?;
        for o in outcomes {
            match o {
                Outcome::Row(r) => backward.rows.push(r),
                Outcome::Skipped(family, n, e) => {
                    backward.skipped.push(format!("{family} n={n}: {e}"));
                }
            }
        }
    }
    if torch && torch_info.available {
        progress.set_message("PyTorch backward");
        if let TorchPeer::Rows(_, rows) = crate::bench_backward::torch_peer(
            &sizes.backward_n,
            (1, sizes.d, 1),
            (false, false),
            repeats,
        ) {
            backward.pytorch = rows;
        }
    }
    if torch {
        progress.inc(1);
    }
    say(format!("backward: done ({})", elapsed(started)));

    let decode_bench = crate::bench_decode::DecodeBench {
        lengths: &sizes.decode_n,
        batches: &sizes.decode_batch,
        heads: sizes.decode_heads,
        d: sizes.decode_d,
        block: None,
        dtype: Dtype::F32,
        warmup: WARMUP,
        repeats,
        no_cpu: false,
    };
    progress.set_message("decode");
    let decode_rows = crate::bench_decode::measure(&ctx, &decode_bench, |r| {
        progress.set_message(format!("decode batch {} S={}", r.batch, r.cache_len));
        progress.inc(1);
    })?;
    let decode = DecodeJson {
        heads: sizes.decode_heads,
        d: sizes.decode_d,
        dtype: Dtype::F32.to_string(),
        rows: decode_rows,
    };
    say(format!("decode: done ({})", elapsed(started)));
    progress.finish_and_clear();

    let report = Report {
        generator: "wgpu-attention report",
        crate_version: env!("CARGO_PKG_VERSION"),
        git_commit: git_commit(),
        build_profile: if cfg!(debug_assertions) {
            "dev"
        } else {
            "release"
        },
        date_utc: utc_now(),
        quick: args.quick,
        warmup: WARMUP,
        repeats,
        timing: timing.to_string(),
        auto_family: auto.to_string(),
        max_call_ms: args.max_call_ms,
        duration_s: started.elapsed().as_secs_f64(),
        load_average: [load_at_start, load_average()],
        adapter: AdapterJson {
            name: info.name.clone(),
            backend: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            driver: info.driver.clone(),
            driver_info: info.driver_info.clone(),
            vendor: info.vendor,
            device: info.device,
        },
        cpu: CpuJson {
            model: bench::cpu_model(),
            threads: bench::cpu_threads(),
        },
        pytorch: torch_info,
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
    std::fs::write(&md_path, markdown(&report)).map_err(|e| Error::io(&md_path, e))?;
    println!(
        "wrote {} and {} in {}",
        md_path.display(),
        json_path.display(),
        elapsed(started)
    );
    Ok(true)
}

/// Which kernel families to time at each size of a sweep: `auto`'s family always; another
/// while its time at the size before, scaled by `(size / that size)^power`, stays under
/// `max_ms` per call (once over, it is left out of the larger sizes, and `dropped` says so).
struct Budget {
    auto: Kernels,
    max_ms: f64,
    power: i32,
    /// Each family's last (size, ms per call).
    last: Vec<(Kernels, usize, f64)>,
    dropped: Vec<String>,
}

impl Budget {
    fn new(auto: Kernels, max_ms: f64, power: i32) -> Self {
        Budget {
            auto,
            max_ms,
            power,
            last: Vec::new(),
            dropped: Vec::new(),
        }
    }

    /// The families of `all` to time at `size`.
    fn families(&mut self, all: &[Kernels], size: usize) -> Vec<Kernels> {
        let mut timed = Vec::new();
        for &family in all {
            let last = self.last.iter().find(|(f, _, _)| *f == family);
            match last {
                Some(&(_, at, ms)) if family != self.auto => {
                    let projected = ms * (size as f64 / at as f64).powi(self.power);
                    if projected <= self.max_ms {
                        timed.push(family);
                    } else {
                        // Dropped for good: forget it, and say so once.
                        self.last.retain(|(f, _, _)| *f != family);
                        self.dropped.push(format!(
                            "{family} from {size} on: {} ms a call at {at} projects to {} ms \
                             (over {} ms)",
                            sig(ms),
                            sig(projected),
                            sig(self.max_ms)
                        ));
                    }
                }
                None if family != self.auto
                    && self
                        .dropped
                        .iter()
                        .any(|d| d.starts_with(&format!("{family} "))) => {}
                _ => timed.push(family),
            }
        }
        timed
    }

    /// Notes `family`'s time per call at `size`.
    fn saw(&mut self, family: Kernels, size: usize, ms: f64) {
        self.last.retain(|(f, _, _)| *f != family);
        self.last.push((family, size, ms));
    }
}

/// `1 min 05 s` or `12.3 s` since `t`.
fn elapsed(t: Instant) -> String {
    duration(t.elapsed())
}

fn duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 60.0 {
        format!("{s:.1} s")
    } else {
        format!("{} min {:02} s", (s / 60.0) as u64, s as u64 % 60)
    }
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// The first-call problems: 0, the README's example; 1, a fused `(1, n, d)` call.
const FIRST_CALLS: usize = 2;

/// Runs each first-call problem in a process of its own, with the caches as this machine has
/// them, then with the tuning, pipeline and shader caches pointed at an empty directory under
/// `out` (removed after).
fn first_calls(args: &ReportArgs, out: &Path, progress: &ProgressBar) -> Result<Vec<FirstCall>> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::invalid("report", format!("cannot find this binary: {e}")))?;
    let cold_dir = out.join(".first-call-caches");
    let mut runs = Vec::new();
    for cold in [false, true] {
        for which in 0..FIRST_CALLS {
            let mut cmd = Command::new(&exe);
            cmd.args(["report", "--first-call-child", &which.to_string()]);
            if args.quick {
                cmd.arg("--quick");
            }
            if let Some(b) = args.adapter.adapter.backend {
                cmd.args(["--backend", &b.to_string()]);
            }
            if let Some(a) = &args.adapter.adapter.adapter {
                cmd.args(["--adapter", a]);
            }
            if let Some(f) = args.adapter.f16_arithmetic {
                cmd.args(["--f16-arithmetic", &f.to_string()]);
            }
            if cold {
                progress.set_message("first call, cold caches");
                let _ = std::fs::remove_dir_all(&cold_dir);
                // Mesa creates no parent directories for its cache.
                std::fs::create_dir_all(cold_dir.join("mesa"))
                    .map_err(|e| Error::io(&cold_dir, format!("cannot create: {e}")))?;
                cmd.env("WGPU_ATTENTION_TUNE_CACHE", cold_dir.join("tune.json"))
                    .env("MESA_SHADER_CACHE_DIR", cold_dir.join("mesa"))
                    .env("__GL_SHADER_DISK_CACHE_PATH", cold_dir.join("nvidia"));
            }
            let result = cmd.output();
            if cold {
                let _ = std::fs::remove_dir_all(&cold_dir);
            }
            let output =
                result.map_err(|e| Error::invalid("report", format!("cannot run: {e}")))?;
            if !output.status.success() {
                let err = String::from_utf8_lossy(&output.stderr);
                return Err(Error::invalid(
                    "report",
                    format!(
                        "the first-call process failed: {}",
                        err.lines().last().unwrap_or("")
                    ),
                ));
            }
            let mut run: FirstCall = serde_json::from_slice(&output.stdout)
                .map_err(|e| Error::invalid("report", format!("first-call output: {e}")))?;
            run.caches = if cold {
                "cold (empty tuning, pipeline and shader caches)".into()
            } else {
                "as found".into()
            };
            runs.push(run);
            progress.inc(1);
        }
    }
    Ok(runs)
}

/// One first-call measurement (`report --first-call-child WHICH`) in this fresh process:
/// `Context::new`, then the call twice; prints [`FirstCall`] as JSON.
fn first_call_child(args: &ReportArgs, which: usize) -> Result<bool> {
    let t = Instant::now();
    let ctx = args.adapter.open()?;
    let context_new_ms = ms_since(t);
    let call = if which == 0 {
        let x = Array2::from_shape_fn((6, 16), |(i, j)| ((i * 16 + j) as f32).sin());
        let w_q = Array2::from_elem((16, 24), 0.1f32);
        let w_k = Array2::from_elem((16, 24), 0.2f32);
        let w_v = Array2::from_elem((16, 28), 0.3f32);
        let proj = Projections::new(w_q.view(), w_k.view(), w_v.view());
        let op = Attention::new().heads(4).causal(true);
        time_call(
            &ctx,
            "the README's example: X 6 × 16 projected to 24, 24, 28, 4 heads, causal, weights \
             returned",
            || op.run(&ctx, Inputs::x(&x).projections(&proj)).map(drop),
        )?
    } else {
        let (n, d) = Sizes::new(args.quick).first_call;
        let x = Array3::from_shape_fn((1, n, d), |(_, i, j)| {
            ((i * 7 + j * 13) as f32 * 0.01).sin()
        });
        let op = Attention::new().return_weights(false);
        let mut call = time_call(&ctx, "", || op.run(&ctx, Inputs::x(&x)).map(drop))?;
        // The plan's family, for the row's name (after the calls: planning may compile).
        let plan = op.plan(&ctx, &Dims::new(&op, &Inputs::x(&x))?)?;
        call.call = format!("X 1 × {n} × {d}, one head, fused ({})", plan.family());
        call
    };
    let run = FirstCall {
        caches: String::new(),
        context_new_ms,
        call,
    };
    let text = serde_json::to_string(&run).map_err(|e| Error::invalid("report", e.to_string()))?;
    println!("{text}");
    Ok(true)
}

/// `call` twice: the first's time and phases, the second's time.
fn time_call(ctx: &Context, name: &str, mut call: impl FnMut() -> Result<()>) -> Result<CallTime> {
    ctx.reset_phase_times();
    let t = Instant::now();
    call()?;
    let first_ms = ms_since(t);
    let phases = ctx.phase_times();
    let t = Instant::now();
    call()?;
    let second_ms = ms_since(t);
    Ok(CallTime {
        call: name.to_string(),
        first_ms,
        second_ms,
        compile_ms: phases.compile.as_secs_f64() * 1e3,
        pipelines: phases.pipelines,
        tune_ms: phases.tune.as_secs_f64() * 1e3,
        dispatch_ms: phases.dispatch.as_secs_f64() * 1e3,
    })
}

/// The 1-minute load average from `/proc/loadavg`, where there is one.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `git rev-parse HEAD` of the crate's source tree, with `-dirty` where tracked files have
/// changes; `None` where there is no git or no checkout.
fn git_commit() -> Option<String> {
    let dir = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
    };
    let head = git(&["rev-parse", "HEAD"])?;
    let mut commit = String::from_utf8_lossy(&head.stdout).trim().to_string();
    if git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|o| !o.stdout.is_empty())
    {
        commit.push_str("-dirty");
    }
    Some(commit)
}

/// Now in UTC as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A number with about three significant figures (`0.0891`, `5.68`, `47.3`, `1028`).
fn sig(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a >= 0.1 {
        format!("{v:.3}")
    } else {
        format!("{v:.4}")
    }
}

/// A ratio as `2.07×`.
fn times(v: f64) -> String {
    format!("{}×", sig(v))
}

/// Thousands separated by commas: `1,414`.
fn thousands(v: f64) -> String {
    let s = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A Markdown table row.
fn row(cells: &[String]) -> String {
    format!("| {} |\n", cells.join(" | "))
}

fn header(cells: &[&str]) -> String {
    let cells: Vec<String> = cells.iter().map(|c| (*c).to_string()).collect();
    row(&cells) + &row(&vec!["---".to_string(); cells.len()])
}

/// `results.md`: the page, dated and self-describing.
fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let date = r.date_utc.get(..10).unwrap_or(&r.date_utc);
    let _ = writeln!(s, "# Results\n");
    let _ = writeln!(
        s,
        "Measured by `wgpu-attention report --out DIR{}` on {date} at {} UTC: the sections \
         Forward to First call are that command's output (it writes every row to \
         `DIR/results.json` too).{}\n",
        if r.quick { " --quick" } else { "" },
        r.date_utc.get(11..16).unwrap_or(""),
        if r.quick {
            " **A `--quick` run: small sizes, one timed run each. It checks that every \
             section runs; its numbers are not measurements.**"
        } else {
            ""
        }
    );
    let a = &r.adapter;
    let _ = writeln!(
        s,
        "- Adapter: **{}** ({}, {}; driver {} {})",
        a.name, a.backend, a.device_type, a.driver, a.driver_info
    );
    let _ = writeln!(s, "- CPU: **{}**, {} threads", r.cpu.model, r.cpu.threads);
    let _ = writeln!(
        s,
        "- Build: wgpu-attention {}{}, {} profile",
        r.crate_version,
        r.git_commit
            .as_ref()
            .map_or(String::new(), |c| format!(" at commit `{c}`")),
        r.build_profile
    );
    let torch_threads = r
        .forward
        .pytorch
        .first()
        .or(r.backward.pytorch.first())
        .map_or(0, |t| t.threads);
    let _ = writeln!(
        s,
        "- PyTorch (CPU): {}",
        match (&r.pytorch.version, &r.pytorch.note) {
            (Some(v), _) => format!("{v}, {torch_threads} threads"),
            (None, Some(note)) => note.clone(),
            (None, None) => "not available".into(),
        }
    );
    let _ = writeln!(
        s,
        "- FMA ceiling (`fma_peak.wgsl`, the adapter's f32 multiply-add rate): {} GFLOP/s",
        sig(r.fma_peak_gflops)
    );
    let _ = writeln!(
        s,
        "- Timing: median of {} run{} after {} warm-up, wall clock per call unless said; {}",
        r.repeats,
        if r.repeats == 1 { "" } else { "s" },
        r.warmup,
        r.timing
    );
    let _ = writeln!(
        s,
        "- The whole report took {}{}\n",
        duration(Duration::from_secs_f64(r.duration_s)),
        match r.load_average {
            [Some(a), Some(b)] => format!(
                "; load average (1 min) {a:.1} at its start, {b:.1} at its end{}",
                if a.max(b) > r.cpu.threads as f64 + 0.5 {
                    " (over the CPU's threads: other work shared the machine, so read the \
                     ratios, measured side by side, more than the absolute times)"
                } else {
                    ""
                }
            ),
            _ => String::new(),
        }
    );

    forward_md(&mut s, r);
    backward_md(&mut s, r);
    decode_md(&mut s, r);
    matmul_md(&mut s, r);
    first_call_md(&mut s, r);
    s
}

fn forward_md(s: &mut String, r: &Report) {
    let f = &r.forward;
    let _ = writeln!(s, "## Forward\n");
    let _ = writeln!(
        s,
        "Self-attention with Q = K = V = X, d = {}, one head, batch 1, not causal, through the \
         array API (`Attention::run` on `Inputs::x`: upload, kernels, readback); GPU columns \
         fused (no weights) and with the attention weights returned. A cell is the median \
         time, GFLOP/s (2·n²·(d_k+d_v)) and the one-thread f32 ndarray CPU path's time over \
         the cell's (above 1×: faster than that CPU path). PyTorch: \
         `F.scaled_dot_product_attention` under `torch.inference_mode()`, every CPU thread.\n",
        f.d
    );
    let mut paths: Vec<&str> = Vec::new();
    for rec in &f.rows {
        if !paths.contains(&rec.path.as_str()) {
            paths.push(&rec.path);
        }
    }
    let mut head = vec!["n".to_string()];
    head.extend(paths.iter().map(|p| column_name(p)));
    head.push(match f.pytorch.first() {
        Some(t) => format!("PyTorch CPU SDPA, {} threads", t.threads),
        None => "PyTorch CPU SDPA".into(),
    });
    let head: Vec<&str> = head.iter().map(String::as_str).collect();
    s.push_str(&header(&head));
    let mut ns: Vec<usize> = f.rows.iter().map(|r| r.n).collect();
    ns.dedup();
    for &n in &ns {
        let cpu_ms = f
            .rows
            .iter()
            .find(|x| x.n == n && x.path == "cpu f32 ndarray")
            .map(|x| x.stats.median_ms);
        let mut cells = vec![n.to_string()];
        for p in &paths {
            cells.push(match f.rows.iter().find(|x| x.n == n && x.path == *p) {
                Some(x) if x.path == "cpu f32 ndarray" => {
                    format!("{} ms, {} GFLOP/s", sig(x.stats.median_ms), sig(x.gflops))
                }
                Some(x) => format!(
                    "{} ms, {}{}",
                    sig(x.stats.median_ms),
                    sig(x.gflops),
                    cpu_ms.map_or(String::new(), |c| format!(
                        ", {}",
                        times(c / x.stats.median_ms)
                    ))
                ),
                None if p.starts_with("cpu f64") => "not timed".into(),
                None if f.skipped.iter().any(|l| l.starts_with(*p)) => {
                    "skipped (device limits)".into()
                }
                None => "not timed".into(),
            });
        }
        cells.push(match f.pytorch.iter().find(|t| t.n == n) {
            Some(t) => format!(
                "{} ms, {}{}",
                sig(t.forward_ms),
                sig(2.0 * (n * n * 2 * f.d) as f64 / (t.forward_ms * 1e6)),
                cpu_ms.map_or(String::new(), |c| format!(", {}", times(c / t.forward_ms)))
            ),
            None => r
                .pytorch
                .note
                .clone()
                .unwrap_or_else(|| "not available".into()),
        });
        s.push_str(&row(&cells));
    }
    // The fused kernels' share of the FMA ceiling at the largest n.
    if let Some(&n) = ns.last() {
        let shares: Vec<String> = f
            .rows
            .iter()
            .filter(|x| x.n == n && x.path.ends_with(" fused"))
            .filter_map(|x| {
                x.share_of_fma_peak
                    .map(|p| format!("{} {:.0} %", x.path.trim_start_matches("gpu "), 100.0 * p))
            })
            .collect();
        if !shares.is_empty() {
            let _ = writeln!(
                s,
                "\nAt n = {n} the fused kernels alone (their own time) reach of the FMA \
                 ceiling: {}.",
                shares.join(", ")
            );
        }
    }
    for line in &f.skipped {
        let _ = writeln!(s, "\nSkipped: `{}`", line.trim());
    }
    not_timed_md(s, &f.not_timed, r.max_call_ms);
    s.push('\n');
}

/// `gpu subgroup +weights` → `GPU subgroup, + weights`, and so on.
fn column_name(path: &str) -> String {
    match path {
        "cpu f32 ndarray" => "CPU f32 ndarray, 1 thread".into(),
        "cpu f64 reference" => "CPU f64 reference".into(),
        p => p
            .replacen("gpu ", "GPU ", 1)
            .replace(" +weights", ", + weights")
            .replace(" fused", ", fused"),
    }
}

fn backward_md(s: &mut String, r: &Report) {
    let b = &r.backward;
    let _ = writeln!(s, "## Backward\n");
    let _ = writeln!(
        s,
        "`sdpa` on Q, K, V of (1, 1, n, {}), not causal: the fused forward (no weights, \
         `Inputs::qkv`) and `Saved::backward` on a forward saved once (dO's upload, the \
         backward kernels, the gradients' readback). GFLOP/s counts the forward as \
         2·n²·(d_k+d_v) and the backward as 2.5× that; the CPU-time ratio is backward over \
         forward in CPU time of every thread of the process (on a CPU adapter the kernels' \
         own work). PyTorch: `F.scaled_dot_product_attention` with autograd, then \
         `.backward(dO)`, every CPU thread.\n",
        b.d
    );
    s.push_str(&header(&[
        "path",
        "n",
        "forward",
        "backward",
        "backward / forward",
        "CPU-time ratio",
    ]));
    let flop = |n: usize| 2.0 * (n * n * 2 * b.d) as f64;
    for x in &b.rows {
        s.push_str(&row(&[
            format!("GPU {}", x.family),
            x.n.to_string(),
            format!(
                "{} ms, {} GFLOP/s",
                sig(x.forward.median_ms),
                sig(x.forward_gflops)
            ),
            format!(
                "{} ms, {} GFLOP/s",
                sig(x.backward.median_ms),
                sig(x.backward_gflops)
            ),
            times(x.backward_over_forward),
            x.cpu_backward_over_forward.map_or("-".into(), times),
        ]));
    }
    for t in &b.pytorch {
        let Some(bwd) = t.backward_ms else { continue };
        s.push_str(&row(&[
            format!("PyTorch CPU, {} threads", t.threads),
            t.n.to_string(),
            format!(
                "{} ms, {} GFLOP/s",
                sig(t.forward_ms),
                sig(flop(t.n) / (t.forward_ms * 1e6))
            ),
            format!(
                "{} ms, {} GFLOP/s",
                sig(bwd),
                sig(2.5 * flop(t.n) / (bwd * 1e6))
            ),
            times(bwd / t.forward_ms),
            "-".into(),
        ]));
    }
    if b.pytorch.is_empty() {
        let _ = writeln!(
            s,
            "\nPyTorch: {}.",
            r.pytorch.note.clone().unwrap_or_else(|| "no rows".into())
        );
    }
    for line in &b.skipped {
        let _ = writeln!(s, "\nSkipped: {line}");
    }
    if !b.not_timed.is_empty() {
        let _ = writeln!(s, "\nNot timed: {}.", b.not_timed.join("; "));
    }
    s.push('\n');
}

fn decode_md(s: &mut String, r: &Report) {
    let d = &r.decode;
    let _ = writeln!(s, "## Decode\n");
    let _ = writeln!(
        s,
        "One new token per sequence per step with a growing KV cache: {} heads (= K/V heads), \
         d = {}, {} K and V; the cache length grows by one per step up to S. GPU KV-cache \
         decode: append the token's K and V to the device's `KvCache`, `Decoder::step` its \
         query, read the output back; whole-call `sdpa`: the same step as one call over the \
         prefix (Q, K, V uploaded each time); CPU: a one-thread f32 decode (`decode::cpu`). \
         ms per step, tokens/s = batch / step time; the ratios are the other path's time over \
         the GPU decode's.\n",
        d.heads, d.d, d.dtype
    );
    s.push_str(&header(&[
        "batch",
        "cache S",
        "GPU KV-cache decode",
        "whole-call `sdpa`",
        "CPU f32, one thread",
        "decode vs whole-call",
        "decode vs CPU",
    ]));
    let mut points: Vec<(usize, usize)> = d.rows.iter().map(|x| (x.batch, x.cache_len)).collect();
    points.dedup();
    for (batch, len) in points {
        let find = |p: &str| {
            d.rows
                .iter()
                .find(|x| x.batch == batch && x.cache_len == len && x.path == p)
        };
        let (Some(gpu), whole, cpu) = (
            find("gpu kv-cache decode"),
            find("gpu whole-call sdpa"),
            find("cpu f32 one thread"),
        ) else {
            continue;
        };
        let ms = |x: Option<&crate::bench_decode::Row>| {
            x.map_or("-".into(), |x| format!("{} ms", sig(x.stats.median_ms)))
        };
        s.push_str(&row(&[
            batch.to_string(),
            len.to_string(),
            format!(
                "{} ms, {} tok/s",
                sig(gpu.stats.median_ms),
                thousands(gpu.tokens_per_s)
            ),
            ms(whole),
            ms(cpu),
            gpu.vs_whole.map_or("-".into(), times),
            gpu.vs_cpu.map_or("-".into(), times),
        ]));
    }
    s.push('\n');
}

fn matmul_md(s: &mut String, r: &Report) {
    let _ = writeln!(s, "## Matmul\n");
    let _ = writeln!(
        s,
        "Square f32 matmuls (m × m by m × m), operands already on the device, the variant the \
         tuner picks in each kernel family (the subgroup family's time includes packing B); \
         GFLOP/s counts 2·m³; the share of the FMA ceiling uses the matmul kernel's own \
         time.\n"
    );
    s.push_str(&header(&[
        "variant",
        "m",
        "ms",
        "GFLOP/s",
        "kernel's share of the FMA ceiling",
        "kernels (ms)",
    ]));
    for x in &r.matmul.rows {
        s.push_str(&row(&[
            format!("`{}`", x.path),
            x.n.to_string(),
            sig(x.stats.median_ms),
            sig(x.gflops),
            x.share_of_fma_peak
                .map_or("-".into(), |p| format!("{:.0} %", 100.0 * p)),
            crate::bench_backward::kernels(&x.kernels_ms),
        ]));
    }
    not_timed_md(s, &r.matmul.not_timed, r.max_call_ms);
    s.push('\n');
}

/// A line naming the families a section left out at larger sizes, if any.
fn not_timed_md(s: &mut String, not_timed: &[String], max_ms: f64) {
    if !not_timed.is_empty() {
        let _ = writeln!(
            s,
            "\nNot timed (`--max-call-ms {}`): {}.",
            sig(max_ms),
            not_timed.join("; ")
        );
    }
}

fn first_call_md(s: &mut String, r: &Report) {
    let _ = writeln!(s, "## First call\n");
    let _ = writeln!(
        s,
        "Each row a fresh process (this binary, started by the report): `Context::new` \
         (adapter and device), then the call twice; the first call's pipeline creation (compile), tuning \
         and device time (dispatch; on lavapipe the kernels' LLVM compile happens at their \
         first dispatch) from `Context::phase_times`. Caches as found: the tuning, pipeline \
         and Mesa shader caches as this machine had them; cold: all three pointed at an empty \
         directory.\n"
    );
    s.push_str(&header(&[
        "caches",
        "call",
        "`Context::new`",
        "first call",
        "its compile, tune, dispatch (pipelines)",
        "second call",
    ]));
    for f in &r.first_call {
        let c = &f.call;
        s.push_str(&row(&[
            f.caches.clone(),
            c.call.clone(),
            format!("{} ms", sig(f.context_new_ms)),
            format!("{} ms", sig(c.first_ms)),
            format!(
                "{}, {}, {} ms ({})",
                sig(c.compile_ms),
                sig(c.tune_ms),
                sig(c.dispatch_ms),
                c.pipelines
            ),
            format!("{} ms", sig(c.second_ms)),
        ]));
    }
    s.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_454), (2026, 1, 1));
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(sig(0.0891), "0.0891");
        assert_eq!(sig(5.678), "5.68");
        assert_eq!(sig(47.31), "47.3");
        assert_eq!(sig(1028.4), "1028");
        assert_eq!(sig(0.0), "0");
        assert_eq!(thousands(1414.2), "1,414");
        assert_eq!(thousands(250.0), "250");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
        assert_eq!(
            column_name("gpu subgroup +weights"),
            "GPU subgroup, + weights"
        );
        assert_eq!(column_name("gpu storage fused"), "GPU storage, fused");
    }
}
