//! `wgpu-attention profile`: what each kernel of one forward call would spend on a GPU,
//! counted on the CPU by the WGSL sanitizer's interpreter, for every fused-kernel variant
//! the tuner may pick: counters, occupancy, predicted time and its bottleneck on a device
//! description, beside PyTorch's measured H100 time where the notes have one.

use clap::Args;
use wgpu_attention::profile::{self, DeviceSpec, KernelProfile, Problem};
use wgpu_attention::{Dtype, Result};

use crate::profile_measure;

/// Arguments of `profile`.
#[derive(Args)]
pub struct ProfileArgs {
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    #[arg(long, default_value_t = 16)]
    pub heads: usize,
    /// Sequence length (queries = keys).
    #[arg(long, default_value_t = 1024)]
    pub n: usize,
    /// Per-head width.
    #[arg(long, default_value_t = 64)]
    pub d: usize,
    #[arg(long, default_value = "f32")]
    pub dtype: Dtype,
    #[arg(long)]
    pub causal: bool,
    /// A left window of this many keys besides the query's own (with --causal: Mistral's
    /// 511 is a window of 512).
    #[arg(long)]
    pub window: Option<u32>,
    /// The device description: h100, h200, generic, or auto (the adapter at hand's where
    /// one is shipped, else generic).
    #[arg(long, default_value = "h100")]
    pub device: String,
    /// Workgroups counted per large dispatch: of the fused kernel, the lightest this many
    /// (weighted by the key tiles each visits, which the host knows); of others, the first,
    /// the last and one per stratum between.
    #[arg(long, default_value_t = 4)]
    pub sample: u32,
    /// Count the fused kernel as commit d646ab0 ran it on the H100 (its own text, kept for d
    /// 64 f32 and its three block shapes; causal blocks lightest first), beside that run's
    /// measured times.
    #[arg(long)]
    pub d646ab0: bool,
    /// Profile one decoding step instead (`Decoder::step`): batch --batch, --heads heads of
    /// width --d, a cache of --n tokens in --dtype (the H100 run: --decode --batch 1 --heads
    /// 32 --d 128 --n 4096).
    #[arg(long)]
    pub decode: bool,
    /// Profile the fused backward instead (`Saved::backward` of a forward saved for it, on
    /// the same problem: --batch, --heads, --n, --d, --dtype, --causal, --window).
    #[arg(long)]
    pub backward: bool,
    /// Profile an M × M × M matmul on cooperative matrices (f16 operands) instead.
    #[arg(long, value_name = "M")]
    pub coop_matmul: Option<usize>,
    /// Also run each profiled call on the adapter at hand (WGPU_ADAPTER_NAME / WGPU_BACKEND
    /// choose it) and print its kernels' measured times beside the predicted ones, one
    /// `model-check:` line per kernel (GPU timestamps where the adapter has them, else the
    /// wall clock of each kernel submitted alone).
    #[arg(long)]
    pub measure: bool,
    /// Timed runs of each measurement (after two warm-up runs).
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
}

/// The adapter `--measure` times on, opened with profiling on; its name.
fn measuring(args: &ProfileArgs) -> Result<Option<(wgpu_attention::Context, String)>> {
    if !args.measure {
        return Ok(None);
    }
    let ctx = wgpu_attention::Context::new()?;
    ctx.set_profiling(true);
    let name = ctx.adapter_info().name;
    Ok(Some((ctx, name)))
}

/// `--device`: a shipped description by name, or `auto`: the adapter's own where one is
/// shipped (H100, H200), else `generic`.
fn device_spec(args: &ProfileArgs) -> Result<DeviceSpec> {
    if !args.device.eq_ignore_ascii_case("auto") {
        return args.device.parse();
    }
    let adapter = wgpu_attention::Context::new()?.adapter_info().name;
    Ok(DeviceSpec::for_adapter(&adapter).unwrap_or_else(|| {
        println!("profile: no description of {adapter} is shipped: the generic one");
        DeviceSpec::generic()
    }))
}

/// The measuring runs' repeats.
fn repeats(args: &ProfileArgs) -> profile_measure::Repeats {
    profile_measure::Repeats {
        warmup: 2,
        repeats: args.repeats.max(1),
    }
}

/// The H100's measured times of the other kernels (d646ab0, ms): decode_partial_gpu at batch
/// 1, 32 heads, cache 4,096, d 128 f32; coop_matmul 4096³.
const H100_DECODE_MS: f64 = 0.54;
const H100_COOP_MATMUL_MS: f64 = 7.11;

/// `--decode` and `--coop-matmul`: one section of kernels, beside the H100's time.
fn profile_other(
    args: &ProfileArgs,
    dev: &DeviceSpec,
    ctx: &wgpu_attention::Context,
) -> Result<bool> {
    let (what, measured, kernels) = match args.coop_matmul {
        Some(m) => (
            format!("coop_matmul {m}^3 f16"),
            (m == 4096).then_some(H100_COOP_MATMUL_MS),
            profile::profile_matmul(
                ctx,
                dev,
                m,
                wgpu_attention::internals::MatmulVariant::Coop,
                Dtype::F16,
                args.sample,
            )?,
        ),
        None => (
            format!(
                "decode step: batch {}, {} heads, cache {}, d {} {:?}",
                args.batch, args.heads, args.n, args.d, args.dtype
            ),
            (args.batch == 1 && args.heads == 32 && args.n == 4096 && args.d == 128)
                .then_some(H100_DECODE_MS),
            profile::profile_decode(
                ctx,
                dev,
                (args.batch, args.heads, args.n, args.d),
                args.dtype,
                args.sample,
            )?,
        ),
    };
    let total: f64 = kernels.iter().map(|k| k.prediction.time).sum();
    println!("{what} on {}: predicted {:.3} ms", dev.name, total * 1e3);
    if args.coop_matmul.is_none() {
        let shape = (args.batch, args.heads, args.n, args.d);
        let counted = profile::decode_counted_batch(shape, args.dtype);
        let elem = if args.dtype == Dtype::F16 { 2 } else { 4 };
        let cache = 2 * args.batch * args.heads * args.n * args.d.next_multiple_of(4) * elem;
        println!(
            "K/V cache {:.1} MB: {:.2} TB/s at the predicted time{}",
            cache as f64 / 1e6,
            cache as f64 / total / 1e12,
            match counted < args.batch {
                true => format!(
                    " (counted on batch {counted} with the whole batch's key blocks, x{})",
                    args.batch / counted
                ),
                false => String::new(),
            }
        );
    }
    if let Some(ms) = measured {
        println!("measured on the H100 at d646ab0: {ms:.2} ms");
    }
    for k in &kernels {
        print_kernel(k);
    }
    if let Some((real, adapter)) = measuring(args)? {
        let timed = match args.coop_matmul {
            Some(m) => profile_measure::coop_matmul(&real, m, repeats(args)),
            None => profile_measure::decode(
                &real,
                (args.batch, args.heads, args.n, args.d),
                args.dtype,
                repeats(args),
            ),
        };
        profile_measure::print(&what, &adapter, &kernels, &timed);
    }
    Ok(true)
}

/// PyTorch 2.11's SDPA on the H100, ms (the first H100 run, 2026-11-27, in docs/RESULTS.md; batch 4,
/// 16 heads, no window).
fn torch_h100(p: &Problem) -> Option<f64> {
    if p.batch != 4 || p.heads != 16 || p.window.is_some() {
        return None;
    }
    let f16 = p.dtype == Dtype::F16;
    let table: &[(usize, usize, bool, bool, f64)] = &[
        (64, 1024, false, false, 0.550),
        (64, 1024, true, false, 0.365),
        (64, 4096, false, false, 7.852),
        (64, 4096, true, false, 4.268),
        (64, 16384, false, false, 125.961),
        (64, 16384, true, false, 66.232),
        (128, 1024, false, false, 0.796),
        (128, 1024, true, false, 0.490),
        (128, 4096, false, false, 11.631),
        (128, 4096, true, false, 6.014),
        (64, 1024, false, true, 0.058),
        (64, 1024, true, true, 0.046),
        (64, 4096, false, true, 0.590),
        (64, 4096, true, true, 0.342),
        (128, 1024, false, true, 0.080),
        (128, 4096, false, true, 0.834),
        (128, 4096, true, true, 0.495),
    ];
    table
        .iter()
        .find(|r| r.0 == p.d && r.1 == p.n && r.2 == p.causal && r.3 == f16)
        .map(|r| r.4)
}

/// `(batch, heads, n, d) DTYPE[ causal][ window W]`, as the profile's lines name a problem.
fn problem_line(p: &Problem) -> String {
    format!(
        "({}, {}, {}, {}) {:?}{}{}",
        p.batch,
        p.heads,
        p.n,
        p.d,
        p.dtype,
        if p.causal { " causal" } else { "" },
        p.window.map(|w| format!(" window {w}")).unwrap_or_default(),
    )
}

/// Prints the profile of every variant.
pub fn profile_cmd(args: &ProfileArgs) -> Result<bool> {
    let p = Problem {
        batch: args.batch,
        heads: args.heads,
        n: args.n,
        d: args.d,
        dtype: args.dtype,
        causal: args.causal,
        window: args.window,
    };
    let dev = &device_spec(args)?;
    let era = match args.d646ab0 {
        true => profile::Era::D646ab0,
        false => profile::Era::Today,
    };
    let ctx = profile::context(dev.lanes, era)?;
    if args.decode || args.coop_matmul.is_some() {
        return profile_other(args, dev, &ctx);
    }
    if args.backward {
        let began = std::time::Instant::now();
        let kernels = profile::profile_backward(&ctx, dev, &p, args.sample)?;
        let total: f64 = kernels.iter().map(|k| k.prediction.time).sum();
        println!(
            "backward {} on {}: predicted {:.3} ms",
            problem_line(&p),
            dev.name,
            total * 1e3
        );
        for k in &kernels {
            print_kernel(k);
        }
        println!("\n(profiled in {:.1} s)", began.elapsed().as_secs_f64());
        return Ok(true);
    }
    let began = std::time::Instant::now();
    let what = problem_line(&p);
    println!(
        "profile: {what} on {} ({} SMs, {:.2} GHz model clock, {:.1} TFLOP/s f32, {:.2} TB/s); \
         counted at {} lanes on <= {} workgroups per dispatch (+ first, last)",
        dev.name,
        dev.sms,
        dev.clock() / 1e9,
        dev.fma_flops / 1e12,
        dev.dram_bandwidth / 1e12,
        dev.lanes,
        args.sample,
    );
    if let Some(ms) = torch_h100(&p) {
        println!("PyTorch 2.11 SDPA on the H100 (measured): {ms:.3} ms");
    }
    let real = measuring(args)?;
    for variant in profile::flash_variants(&ctx, &p)
        .into_iter()
        .filter(|&v| era.had(v))
    {
        let kernels = match profile::profile_flash(&ctx, dev, &p, variant, Some(args.sample), era) {
            Ok(k) => k,
            Err(e) => {
                println!("\n{variant}: not profiled: {e}");
                continue;
            }
        };
        let total: f64 = kernels.iter().map(|k| k.prediction.time).sum();
        println!("\n{variant}: predicted {:.3} ms", total * 1e3);
        for k in &kernels {
            print_kernel(k);
        }
        if let Some((real, adapter)) = &real {
            let timed = profile_measure::flash(real, &p, variant, repeats(args));
            profile_measure::print(&format!("{what} {variant}"), adapter, &kernels, &timed);
        }
    }
    println!("\n(profiled in {:.1} s)", began.elapsed().as_secs_f64());
    Ok(true)
}

/// Three lines per kernel: counters, occupancy, prediction.
fn print_kernel(k: &KernelProfile) {
    let c = &k.counters;
    let pr = &k.prediction;
    println!(
        "  {} [{}]: {} workgroups of {} threads ({} counted)",
        k.kernel.trim_end_matches(".wgsl"),
        k.variant,
        k.workgroups,
        k.threads,
        c.workgroups_counted
    );
    println!(
        "    {:.3} GFLOP (f32 {:.3}, f16 {:.3}, coop {:.3}), {:.3} G special; global {:.1} MB \
         requested in {:.1} MB of sectors ({:.0} % sector efficiency), {:.1} M loads; \
         shared {:.1} M accesses, {:.2} ways; per lane {:.0} instructions, {:.1} barriers; \
         per subgroup {:.1} loads that wait; {} atomics, {} texels{}",
        c.flops() as f64 / 1e9,
        c.flops_f32 as f64 / 1e9,
        c.flops_f16 as f64 / 1e9,
        c.coop_flops as f64 / 1e9,
        c.special as f64 / 1e9,
        (c.global.bytes_read + c.global.bytes_written) as f64 / 1e6,
        c.global.sector_bytes() as f64 / 1e6,
        100.0 * c.global.sector_efficiency(),
        c.global.loads as f64 / 1e6,
        c.shared_accesses as f64 / 1e6,
        c.shared_ways(),
        c.per_lane(c.lane_instructions),
        c.per_lane(c.barriers * u64::from(c.subgroup_size)),
        c.load_waits as f64 / c.subgroups.max(1) as f64,
        c.atomics,
        c.texture_reads,
        if c.texture.loads + c.texture.stores > 0 {
            format!(
                " ({:.0} % sector efficiency, row-major layout)",
                100.0 * c.texture.sector_efficiency()
            )
        } else {
            String::new()
        },
    );
    println!(
        "    occupancy: {} workgroups ({} warps, {:.0} %) per SM, limited by {} ({} registers, \
         {}; {} B shared)",
        k.occupancy.workgroups,
        k.occupancy.warps,
        100.0 * k.occupancy.fraction,
        k.occupancy.limit,
        k.registers,
        k.registers_from,
        k.shared_bytes,
    );
    let ms = |s: f64| s * 1e3;
    println!(
        "    predicted {:.3} ms, {}-bound (issue {:.3}, FMA {:.3}, coop {:.3}, shared {:.3}, \
         L2 {:.3}, DRAM {:.3}, latency {:.3} ms; {:.2} rounds per SM)",
        ms(pr.time),
        pr.bottleneck,
        ms(pr.issue),
        ms(pr.fma),
        ms(pr.coop),
        ms(pr.shared),
        ms(pr.l2),
        ms(pr.dram),
        ms(pr.latency),
        pr.rounds,
    );
}
