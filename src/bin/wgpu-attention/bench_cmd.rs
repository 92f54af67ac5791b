//! `wgpu-attention bench`: GPU against CPU, side by side in one run.

use std::path::PathBuf;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use ndarray::Array3;
use serde::Serialize;
use wgpu_attention::bench::{self, Stats};
use wgpu_attention::plot;
use wgpu_attention::Profiling;
use wgpu_attention::{reference, Attention, Dims, Error, Inputs, Kernels, Options, Result};

use crate::bench_backward::Shape;
use crate::GpuArgs;

#[derive(Args)]
pub struct BenchArgs {
    /// Sequence lengths to sweep, comma-separated [default: 256,1024,4096].
    #[arg(long, value_delimiter = ',', default_value = "256,1024,4096", hide_default_value = true, value_parser = crate::args::at_least_one, allow_negative_numbers = true)]
    n: Vec<usize>,
    /// Model width d (Q = K = V = X, so d_k = d_v = d; projections excluded).
    #[arg(long, default_value_t = 64, value_parser = crate::args::at_least_one, allow_negative_numbers = true)]
    d: usize,
    /// Heads (d must divide by it).
    #[arg(long, default_value_t = 1, value_parser = crate::args::at_least_one, allow_negative_numbers = true)]
    heads: usize,
    /// Batch size.
    #[arg(long, default_value_t = 1, value_parser = crate::args::at_least_one, allow_negative_numbers = true)]
    batch: usize,
    /// Causal mask (FLOP counts stay those of the full problem).
    #[arg(long)]
    causal: bool,
    /// Timed runs per measurement (the median is reported); at least 1.
    #[arg(long, default_value_t = 5, value_parser = crate::args::at_least_one, allow_negative_numbers = true)]
    repeats: usize,
    /// Untimed runs first (lavapipe compiles each kernel at its first dispatch).
    #[arg(long, default_value_t = 1, value_parser = crate::args::count, allow_negative_numbers = true)]
    warmup: usize,
    /// Kernel family: auto, storage, subgroup, or all (every family the adapter has).
    #[arg(long, default_value = "auto", value_parser = crate::args::family_or_all)]
    kernels: String,
    /// Only the fused path (no attention weights), not the weights path too.
    #[arg(long)]
    fused_only: bool,
    /// Also time the fused kernels alone: X already on the device as a tensor, the result
    /// left there (no upload, no readback), GPU timestamps where the adapter has them.
    #[arg(long)]
    resident: bool,
    /// Also time the fused backward beside the fused forward (sdpa, the same shapes), with
    /// GFLOP/s (backward counted as 2.5× the forward's FLOP) and the ratio backward/forward.
    #[arg(long)]
    backward: bool,
    /// Skip the CPU baseline.
    #[arg(long)]
    no_cpu: bool,
    /// Size of the square matmul to time on each family (0 skips it).
    #[arg(long, default_value_t = 1024, value_parser = crate::args::count, allow_negative_numbers = true)]
    matmul: usize,
    /// Instead of the sweep: a 2-layer causal model (W_Q, W_K, W_V, W_O of d × d; --batch,
    /// the first --n, --d, --heads) called --repeats times, through the array API, with
    /// resident layers and tensors, and on the CPU, side by side.
    #[arg(long)]
    model: bool,
    /// Also write every measurement as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also draw GFLOP/s against n, one line per path (GPU and CPU), into this .svg or .png.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Seconds each section (the matmul, each n of the sweep) may take: measurements past
    /// it are skipped, each with a line that says so, so that no size stalls the rest.
    #[arg(long, default_value_t = 60.0, value_parser = crate::args::non_negative)]
    section_budget: f64,
    /// Instead of the sweep: the host side of a whole call on Q, K, V arrays of (--batch,
    /// --heads, n, --d) for each --n, f32 and f16: call, kernels, host (= call − kernels),
    /// its upload, record and readback phases, beside a plain copy of the same bytes timed
    /// in this process.
    #[arg(long)]
    host: bool,
    /// Token-by-token decoding instead: a growing KV cache (at the cache lengths --n) against
    /// the same step as a whole-call sdpa and a one-thread CPU decode.
    #[arg(long)]
    decode: bool,
    /// Heads (= K/V heads) for --decode; d is --d.
    #[arg(long, default_value_t = 8, value_parser = crate::args::at_least_one, allow_negative_numbers = true)]
    decode_heads: usize,
    /// Batch sizes for --decode, comma-separated [default: 1,8].
    #[arg(long, value_delimiter = ',', default_value = "1,8", hide_default_value = true, value_parser = crate::args::at_least_one, allow_negative_numbers = true)]
    decode_batch: Vec<usize>,
    /// Keys per block of the decode kernel's split (default: chosen per step).
    #[arg(long, value_parser = crate::args::at_least_one, allow_negative_numbers = true)]
    decode_block: Option<usize>,
    /// How the --decode cache stores K and V: f32, or f16 (half the memory and bandwidth).
    #[arg(long, default_value = "f32")]
    decode_dtype: wgpu_attention::Dtype,
    /// Operand type of the GPU paths of the sweep and of --backward: f32, or f16 (needs
    /// SHADER_F16; arithmetic as `--dtype f16` everywhere). The CPU baselines stay f32;
    /// PyTorch's peer on a GPU runs in the same dtype.
    #[arg(long, default_value = "f32")]
    dtype: wgpu_attention::Dtype,
    /// Block sparsity instead: at each --n, the causal fused forward alone and with a mask
    /// modifier that empties most key tiles (a 512-key window, documents of 2,048 tokens),
    /// side by side (--d, --heads, --batch; --kernels auto, storage or subgroup).
    #[arg(long)]
    sparse: bool,
    #[command(flatten)]
    adapter: GpuArgs,
}

/// One measured line.
#[derive(Serialize)]
pub struct Record {
    pub kind: &'static str,
    pub path: String,
    pub n: usize,
    pub d: usize,
    pub heads: usize,
    pub batch: usize,
    pub causal: bool,
    pub flop: f64,
    #[serde(flatten)]
    pub stats: Stats,
    pub gflops: f64,
    pub gpu_over_cpu_speedup: Option<f64>,
    pub gpu_over_reference_speedup: Option<f64>,
    pub share_of_fma_peak: Option<f64>,
    pub kernels_ms: Vec<(String, f64)>,
}

#[derive(Serialize)]
struct Report<'a> {
    adapter: String,
    backend: String,
    driver: String,
    cpu: String,
    fma_peak_gflops: Option<f64>,
    records: &'a [Record],
}

/// What one n of the attention sweep measures (`bench`'s flags that shape it): the problem
/// and its timing, and which paths.
pub struct Sweep {
    pub shape: Shape,
    /// Only the fused path, not the weights path too.
    pub fused_only: bool,
    /// Also the fused kernels on a resident tensor.
    pub resident: bool,
    /// No CPU baselines (f32 ndarray, f64 reference).
    pub no_cpu: bool,
    /// What one n may take before its remaining measurements are skipped (`None`: no
    /// limit).
    pub budget: Option<std::time::Duration>,
    /// The CPU baselines only up to this many FLOP a call (`None`: always).
    pub cpu_flop_max: Option<f64>,
}

impl Sweep {
    fn of(args: &BenchArgs) -> Self {
        Sweep {
            shape: Shape {
                d: args.d,
                heads: args.heads,
                batch: args.batch,
                causal: args.causal,
                dtype: args.dtype,
                warmup: args.warmup,
                repeats: args.repeats,
            },
            fused_only: args.fused_only,
            resident: args.resident,
            no_cpu: args.no_cpu,
            budget: Some(std::time::Duration::from_secs_f64(args.section_budget)),
            cpu_flop_max: None,
        }
    }

    /// Whether a section that started at `start` has spent its budget; if so, `what` goes
    /// into `skipped` with the reason.
    fn spent(&self, start: std::time::Instant, what: &str, skipped: &mut Vec<String>) -> bool {
        let Some(budget) = self.budget.filter(|&b| start.elapsed() > b) else {
            return false;
        };
        skipped.push(format!(
            "{what:<39} skipped: this size's budget of {:.0} s is spent (--section-budget)",
            budget.as_secs_f64()
        ));
        true
    }

    /// The progress steps of one n on `families`.
    pub fn steps(&self, families: usize) -> usize {
        let ways = 1 + usize::from(!self.fused_only) + usize::from(self.resident);
        families * ways + usize::from(!self.no_cpu) * 2
    }

    /// An attention measurement of `n`, without ratios or kernel times yet.
    fn record(&self, n: usize, flop: f64, path: String, stats: Stats) -> Record {
        Record {
            kind: "attention",
            path,
            n,
            d: self.shape.d,
            heads: self.shape.heads,
            batch: self.shape.batch,
            causal: self.shape.causal,
            flop,
            stats,
            gflops: flop / (stats.median_ms * 1e6),
            gpu_over_cpu_speedup: None,
            gpu_over_reference_speedup: None,
            share_of_fma_peak: None,
            kernels_ms: Vec::new(),
        }
    }
}

/// The f64 reference is timed up to this n (it holds n × n f64 weights per head).
const REFERENCE_MAX_N: usize = 4096;

const HEADER: &str = "path                              n     median ms   spread (min-max)   GFLOP/s  vs f32  vs f64  % peak  time per kernel (ms)";

fn line(r: &Record) -> String {
    format!(
        "{:<32} {:>6} {:>11.2}   {:>8.2}-{:<8.2} {:>8.2}  {:>6}  {:>6}  {:>6}  {}",
        r.path,
        r.n,
        r.stats.median_ms,
        r.stats.min_ms,
        r.stats.max_ms,
        r.gflops,
        r.gpu_over_cpu_speedup
            .map_or("-".into(), |s| format!("{s:.2}x")),
        r.gpu_over_reference_speedup
            .map_or("-".into(), |s| format!("{s:.2}x")),
        r.share_of_fma_peak
            .map_or("-".into(), |s| format!("{:.0}%", 100.0 * s)),
        crate::bench_backward::kernels(&r.kernels_ms)
    )
}

/// The attention records as one series per path (GPU families and CPU baselines), in the
/// order the paths first appear.
fn throughput_series(records: &[Record]) -> Vec<plot::Series> {
    let mut series: Vec<plot::Series> = Vec::new();
    for r in records.iter().filter(|r| r.kind == "attention") {
        let point = (r.n, r.gflops);
        match series.iter_mut().find(|s| s.name == r.path) {
            Some(s) => s.points.push(point),
            None => series.push(plot::Series {
                name: r.path.clone(),
                points: vec![point],
            }),
        }
    }
    series
}

pub fn bench_cmd(args: &BenchArgs) -> Result<bool> {
    bench::check_sizes("--n", &args.n)?;
    bench::check_sizes("--d", &[args.d])?;
    bench::check_sizes("--batch", &[args.batch])?;
    crate::say_build_profile();
    if args.decode {
        return decode(args);
    }
    if args.sparse {
        return sparse(args);
    }
    if args.host {
        let ctx = args.adapter.open()?;
        let sweep = crate::bench_host::HostSweep {
            n: &args.n,
            width: args.d,
            heads: args.heads,
            batch: args.batch,
            repeats: args.repeats,
            warmup: args.warmup,
        };
        return crate::bench_host::run(&ctx, &sweep);
    }
    if let Some(path) = &args.plot {
        plot::Format::from_path(path)?;
    }
    // Heads that do not divide d are caught by Attention::dims, like everywhere else. The
    // family `auto` resolves to is that of the sweep's largest call (a tiny call, under
    // TINY_ROWS rows, plans the kernels cheapest to compile instead: not what a sweep times).
    let rows = args.n.iter().max().copied().unwrap_or(1) * args.batch;
    // Dims::new takes inputs, not a shape: X is one zero broadcast to the shape (no copy).
    let zero = ndarray::arr1(&[0.0f32]);
    let rows = rows.max(wgpu_attention::internals::TINY_ROWS + 1);
    let x = zero
        .broadcast((rows, args.d))
        .ok_or_else(|| Error::shape("cannot broadcast one zero to X's shape"))?;
    let head_dims = Dims::new(&Attention::new().heads(args.heads), &Inputs::x(x))?;
    let choice = match args.kernels.as_str() {
        "all" => None,
        k => Some(k.parse::<Kernels>()?),
    };
    // A benchmark times what the tuner finds best, whatever that costs to find.
    crate::tune_cmd::measure_every_candidate();
    let ctx = args.adapter.open()?;
    if args.model {
        let model = crate::model_bench::Model {
            batch: args.batch,
            n: args.n[0],
            d: args.d,
            heads: args.heads,
            calls: args.repeats,
            warmup: args.warmup,
        };
        crate::model_bench::run(&ctx, &model)?;
        return Ok(true);
    }
    let families = bench::families(&ctx, choice, &head_dims)?;
    let info = ctx.adapter_info();
    let timing = ctx.set_profiling(true);
    let cpu = bench::cpu_name();
    println!(
        "adapter: {} ({:?}, {:?}, driver {} {})",
        info.name, info.backend, info.device_type, info.driver, info.driver_info
    );
    println!("cpu:     {cpu}; CPU baseline = f32 ndarray (matrixmultiply GEMM, one thread)");
    println!(
        "timing:  median of {} runs after {} warm-up; wall clock per call (upload, kernels, \
         readback){}",
        args.repeats,
        args.warmup,
        match timing {
            Profiling::Timestamps => "; per-kernel GPU time from timestamp queries",
            _ => "; per-kernel time: each kernel submitted alone, wall clock",
        }
    );

    let mut steps = Sweep::of(args).steps(families.len()) * args.n.len();
    steps += usize::from(args.matmul > 0) * families.len() + 1;
    let progress = ProgressBar::new(steps as u64);
    progress.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let say = |s: String| progress.suspend(|| println!("{s}"));
    let _heartbeat = crate::heartbeat::Heartbeat::start("bench", &progress);

    progress.set_message("FMA ceiling");
    let peak = bench::fma_peak(&ctx)?;
    progress.inc(1);
    say(format!("FMA ceiling (fma_peak.wgsl): {peak:.1} GFLOP/s\n"));
    let mut records = Vec::new();

    if args.matmul > 0 {
        let m = args.matmul;
        say(format!(
            "matmul {m}x{m}x{m}{} (operands on the GPU; subgroup family includes packing):",
            match args.dtype {
                wgpu_attention::Dtype::F16 => ", f16 operands, f32 accumulation",
                wgpu_attention::Dtype::F32 => "",
            }
        ));
        say(HEADER.to_string());
        for &family in &families {
            let r = matmul_record(
                &ctx,
                (family, args.dtype),
                m,
                (args.warmup, args.repeats),
                peak,
                &progress,
            )?;
            say(line(&r));
            records.push(r);
        }
        say(String::new());
    }

    say(format!(
        "attention, Q = K = V = X, d = {}, heads = {}, batch = {}{} (FLOP = 2·n²·(d_k+d_v)·batch):",
        args.d,
        args.heads,
        args.batch,
        if args.causal { ", causal" } else { "" }
    ));
    say(HEADER.to_string());
    let sweep = Sweep::of(args);
    for &n in &args.n {
        let (here, skipped) = attention_at(&ctx, &sweep, n, &families, peak, &progress)?;
        for s in skipped {
            say(s);
        }
        for r in &here {
            say(line(r));
        }
        records.extend(here);
    }
    progress.finish_and_clear();
    if info.device_type != wgpu_attention::wgpu::DeviceType::Cpu {
        crate::torch_peer::on_the_gpu(&args.n, &sweep.shape, &records);
    }
    if args.backward {
        let sweep = crate::bench_backward::Sweep {
            n: &args.n,
            shape: sweep.shape,
        };
        crate::bench_backward::table(&ctx, &sweep, &families)?;
    }
    println!(
        "\nvs f32 / vs f64: the CPU baseline's (f32 ndarray) or the f64 reference's median over \
         this row's (above 1: this row is faster). % peak: FLOP over the kernels' time, against \
         the FMA ceiling."
    );

    if let Some(path) = &args.json {
        let report = Report {
            adapter: info.name.clone(),
            backend: format!("{:?}", info.backend),
            driver: format!("{} {}", info.driver, info.driver_info),
            cpu,
            fma_peak_gflops: Some(peak),
            records: &records,
        };
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| Error::invalid("--json", e.to_string()))?;
        std::fs::write(path, text).map_err(|e| Error::io(path, e))?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &args.plot {
        let title = format!(
            "attention on {}: d = {}, heads = {}, batch = {}{}",
            info.name,
            args.d,
            args.heads,
            args.batch,
            if args.causal { ", causal" } else { "" }
        );
        plot::throughput(path, &title, &throughput_series(&records))?;
        println!("wrote {}", path.display());
    }
    Ok(true)
}

/// `bench --decode`.
fn decode(args: &BenchArgs) -> Result<bool> {
    bench::check_sizes("--decode-batch", &args.decode_batch)?;
    let ctx = args.adapter.open()?;
    let info = ctx.adapter_info();
    println!(
        "adapter: {} ({:?}, {:?}, driver {} {})",
        info.name, info.backend, info.device_type, info.driver, info.driver_info
    );
    println!("cpu:     {}", bench::cpu_name());
    crate::bench_decode::run(
        &ctx,
        &crate::bench_decode::DecodeBench {
            lengths: &args.n,
            batches: &args.decode_batch,
            heads: args.decode_heads,
            d: args.d,
            block: args.decode_block,
            dtype: args.decode_dtype,
            warmup: args.warmup,
            repeats: args.repeats,
            no_cpu: args.no_cpu,
        },
    )?;
    Ok(true)
}

/// `bench --sparse`.
fn sparse(args: &BenchArgs) -> Result<bool> {
    let kernels = match args.kernels.as_str() {
        "all" => Kernels::Auto,
        k => k.parse::<Kernels>()?,
    };
    crate::tune_cmd::measure_every_candidate();
    let ctx = args.adapter.open()?;
    let info = ctx.adapter_info();
    println!(
        "adapter: {} ({:?}, {:?}, driver {} {})",
        info.name, info.backend, info.device_type, info.driver, info.driver_info
    );
    ctx.set_profiling(true);
    crate::bench_sparse::run(
        &ctx,
        &crate::bench_sparse::SparseBench {
            lengths: &args.n,
            d: args.d,
            heads: args.heads,
            batch: args.batch,
            kernels,
            warmup: args.warmup,
            repeats: args.repeats,
        },
    )?;
    Ok(true)
}

/// What a measured path's name ends in for its operands' type: ` f16`, or nothing for f32.
fn f16_tag(dtype: wgpu_attention::Dtype) -> &'static str {
    match dtype {
        wgpu_attention::Dtype::F16 => " f16",
        wgpu_attention::Dtype::F32 => "",
    }
}

/// Times the square matmul `m × m × m` on operands of `dtype` with the variant the tuner
/// picks in `family`; the share of the FMA ceiling `peak` from the matmul kernel's own time
/// where there is one.
///
/// # Errors
/// Size limits and GPU errors.
pub fn matmul_record(
    ctx: &wgpu_attention::Context,
    (family, dtype): (Kernels, wgpu_attention::Dtype),
    m: usize,
    (warmup, repeats): (usize, usize),
    peak: f64,
    progress: &ProgressBar,
) -> Result<Record> {
    let variant = bench::tuned_matmul(ctx, (&[family], dtype), m)?;
    progress.set_message(format!("{variant}"));
    let flop = 2.0 * (m * m * m) as f64;
    let (stats, kernels_ms) = bench::matmul(ctx, (variant, dtype), (m, m, m), warmup, repeats)?;
    progress.inc(1);
    // The kernel's own share, from its GPU time where there is one.
    let kernel_ms = kernels_ms
        .iter()
        .find(|(k, _)| k.starts_with("matmul"))
        .map_or(stats.median_ms, |(_, ms)| *ms);
    Ok(Record {
        kind: "matmul",
        path: format!("{variant}{}", f16_tag(dtype)),
        n: m,
        d: m,
        heads: 1,
        batch: 1,
        causal: false,
        flop,
        stats,
        gflops: flop / (stats.median_ms * 1e6),
        gpu_over_cpu_speedup: None,
        gpu_over_reference_speedup: None,
        share_of_fma_peak: Some(flop / (kernel_ms * 1e6) / peak),
        kernels_ms,
    })
}

/// Measures self-attention (`Q = K = V = X`) at `n` under `sweep`: the CPU baselines (f32
/// ndarray, then the f64 reference up to [`REFERENCE_MAX_N`]) unless `no_cpu`, then per
/// family the fused path, the weights path (unless `fused_only`) and the resident path (with
/// `resident`), each with its ratios to the CPU baselines and its share of the FMA ceiling
/// `peak`. One `progress` step each. Returns the records and a line for each path skipped
/// for the device's limits.
///
/// # Errors
/// GPU errors other than the device's limits.
pub fn attention_at(
    ctx: &wgpu_attention::Context,
    sweep: &Sweep,
    n: usize,
    families: &[Kernels],
    peak: f64,
    progress: &ProgressBar,
) -> Result<(Vec<Record>, Vec<String>)> {
    let shape = &sweep.shape;
    let x = Array3::from_shape_fn((shape.batch, n, shape.d), |(b, i, j)| {
        (((b * 31 + i * 7 + j * 13) % 23) as f32 / 23.0 - 0.5) * 2.0
    });
    let dims = Dims::new(&Attention::new().heads(shape.heads), &Inputs::x(&x))?;
    let flop = dims.attention_flops();
    let (mut here, mut skipped) = (Vec::new(), Vec::new());
    let start = std::time::Instant::now();
    let cpu_too_big = sweep.cpu_flop_max.is_some_and(|max| flop > max);
    if cpu_too_big && !sweep.no_cpu {
        skipped.push(format!(
            "{:<32} {n:>6} left out: {:.0} GFLOP a call, minutes on one CPU thread",
            "cpu baselines",
            flop / 1e9
        ));
        progress.inc(2);
    }
    let cpu_ms = if sweep.no_cpu || cpu_too_big {
        None
    } else {
        progress.set_message(format!("cpu n={n}"));
        let (stats, _) = bench::measure(shape.warmup.min(1), shape.repeats, || {
            Ok(bench::cpu_attention_f32(
                x.view(),
                shape.heads,
                shape.causal,
            ))
        })?;
        progress.inc(1);
        here.push(sweep.record(n, flop, "cpu f32 ndarray".into(), stats));
        Some(stats.median_ms)
    };
    // The f64 oracle the tests check against: slower, but the definition.
    let reference_ms = if sweep.no_cpu || cpu_too_big || n > REFERENCE_MAX_N {
        None
    } else if sweep.spent(
        start,
        &format!("{:<32} {n:>6}", "cpu f64 reference"),
        &mut skipped,
    ) {
        progress.inc(1);
        None
    } else {
        progress.set_message(format!("cpu f64 reference n={n}"));
        let op = Attention::new().heads(shape.heads).causal(shape.causal);
        let (stats, _) = bench::measure(0, shape.repeats.min(3), || {
            reference::run(&op, &Inputs::x(x.view()))
        })?;
        progress.inc(1);
        let mut r = sweep.record(n, flop, "cpu f64 reference".into(), stats);
        r.gpu_over_cpu_speedup = cpu_ms.map(|c| c / stats.median_ms);
        here.push(r);
        Some(stats.median_ms)
    };
    for &family in families {
        // (weights returned, inputs resident): the array API fused and with weights, then
        // with --resident the fused kernels alone on a tensor already on the device.
        let ways = [(false, false), (true, false), (false, true)];
        for (weights, resident) in ways {
            if (weights && sweep.fused_only) || (resident && !sweep.resident) {
                continue;
            }
            let op = Attention::new()
                .heads(shape.heads)
                .causal(shape.causal)
                .dtype(shape.dtype)
                .options(Options::default().kernels(family))
                .return_weights(weights);
            let plan = op.plan(ctx, &dims)?;
            let path = format!(
                "gpu {family} {}{}",
                match (weights, resident) {
                    (_, true) => "resident",
                    (true, _) => "+weights",
                    _ => "fused",
                },
                f16_tag(shape.dtype)
            );
            if sweep.spent(start, &format!("{path:<32} {n:>6}"), &mut skipped) {
                progress.inc(1);
                continue;
            }
            progress.set_message(format!("{path} n={n}"));
            let result = if resident {
                let runs = (shape.warmup, shape.repeats);
                bench::gpu_resident(ctx, (&op, shape.dtype), x.view(), runs)
            } else {
                bench::gpu_attention(ctx, &op, x.view(), shape.warmup, shape.repeats)
            };
            progress.inc(1);
            match result {
                Ok((stats, kernels_ms)) => {
                    let kernel_total: f64 = kernels_ms.iter().map(|(_, ms)| ms).sum();
                    let ms = if kernels_ms.is_empty() {
                        stats.median_ms
                    } else {
                        kernel_total
                    };
                    here.push(Record {
                        gpu_over_cpu_speedup: cpu_ms.map(|c| c / stats.median_ms),
                        gpu_over_reference_speedup: reference_ms.map(|c| c / stats.median_ms),
                        share_of_fma_peak: Some(flop / (ms * 1e6) / peak),
                        kernels_ms,
                        ..sweep.record(n, flop, path, stats)
                    });
                }
                Err(e @ Error::LimitExceeded { .. }) => {
                    skipped.push(format!("{path:<32} {n:>6}   skipped ({plan}): {e}"));
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok((here, skipped))
}
