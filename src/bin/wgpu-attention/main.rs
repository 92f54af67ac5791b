//! The `wgpu-attention` command line: `devices`, `run`, `sdpa`, `verify`, `bench`, `tune`,
//! `shaders`, `demo`.

mod args;
mod bench_backward;
mod bench_cmd;
mod bench_decode;
mod bench_host;
mod bench_sparse;
mod checkpoint_cmd;
mod errors;
mod grad_cmd;
mod heartbeat;
mod model_bench;
mod mods_args;
mod profile_cmd;
mod profile_measure;
mod report;
mod run_cmd;
mod shaders_cmd;
mod torch_peer;
mod tune_cmd;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use wgpu_attention::{
    demo, list_adapters, verify, Attention, Backend, Context, ContextOptions, Dtype, Error, Inputs,
    Projections, Result,
};

/// Scaled dot-product self-attention in WGSL compute shaders on wgpu.
#[derive(Parser)]
#[command(version, about, long_about = None, after_help = errors::EXIT_STATUS_HELP)]
struct Cli {
    /// Log to stderr: -v adapter, plan and tuning; -vv every dispatch; -vvv everything,
    /// wgpu's own logs too (RUST_LOG overrides).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone, Default)]
pub struct AdapterArgs {
    /// Graphics API: vulkan, metal, dx12 or gl (default: WGPU_BACKEND, else all).
    #[arg(long)]
    backend: Option<Backend>,
    /// Pick the adapter whose name contains this (default: WGPU_ADAPTER_NAME, else the best).
    #[arg(long)]
    adapter: Option<String>,
}

impl AdapterArgs {
    fn options(&self) -> ContextOptions {
        ContextOptions::default()
            .backend(self.backend)
            .adapter_name(self.adapter.clone())
    }

    pub fn open(&self) -> Result<Context> {
        Context::with_options(&self.options())
    }

    /// The device type of the adapter [`AdapterArgs::open`] would pick, without opening it.
    pub fn device_type(&self) -> Option<wgpu_attention::wgpu::DeviceType> {
        let adapter = wgpu_attention::default_adapter(&self.options()).ok()??;
        Some(adapter.info.device_type)
    }
}

/// The adapter, and how the kernels of the commands that compute attention may run on it.
#[derive(Args, Clone, Default)]
pub struct GpuArgs {
    #[command(flatten)]
    pub adapter: AdapterArgs,
    /// With f16 operands, multiply in f16 in the GPU family's fused kernel (flash-blocked):
    /// true or false (default: true on GPUs, false on CPU adapters).
    #[arg(long)]
    pub f16_arithmetic: Option<bool>,
    /// flash-blocked's double buffering (stage the next chunk while computing): true or
    /// false (default: true on GPUs, false on CPU adapters). For bisecting a GPU's answers.
    #[arg(long)]
    pub double_buffer: Option<bool>,
    /// flash-blocked's row reductions through subgroup shuffles instead of workgroup memory:
    /// true or false (default: where the adapter's subgroups allow). For bisecting.
    #[arg(long)]
    pub subgroup_reductions: Option<bool>,
    /// flash-blocked's vector loads (4 values of a row of Q, K, V in one load, where every
    /// width and stride is a multiple of 4): true or false (default: true). For bisecting.
    #[arg(long)]
    pub vector_loads: Option<bool>,
    /// flash-blocked's resident queries (a block's Q rows staged once into workgroup memory,
    /// not with every key tile): true or false (default: where the block stays within 32 KiB).
    #[arg(long)]
    pub resident_queries: Option<bool>,
}

impl GpuArgs {
    pub fn open(&self) -> Result<Context> {
        let blocked = wgpu_attention::internals::BlockedOptions::default()
            .f16_arithmetic(self.f16_arithmetic)
            .double_buffer(self.double_buffer)
            .subgroups(self.subgroup_reductions)
            .vector_loads(self.vector_loads)
            .resident_queries(self.resident_queries);
        self.adapter.open().map(|c| c.with_blocked_options(blocked))
    }
}

#[derive(Subcommand)]
enum Command {
    /// List every adapter wgpu finds, best first, with the limits that matter.
    Devices {
        #[command(flatten)]
        adapter: AdapterArgs,
    },
    /// Compute attention over .npy inputs (float16, float32 or float64) and write context.npy
    /// and weights.npy.
    Run(Box<run_cmd::RunArgs>),
    /// PyTorch's scaled_dot_product_attention over Q, K, V .npy files (float16, float32 or
    /// float64) in (batch, heads, L, E) layout; writes context.npy (batch, heads, L, E_v) and
    /// weights.npy (batch, heads, L, S).
    Sdpa(run_cmd::SdpaArgs),
    /// Check the GPU kernels against the f64 CPU reference over many shapes and options.
    Verify {
        /// Random cases in addition to the fixed sweep.
        #[arg(long, default_value_t = 20, value_parser = args::count, allow_negative_numbers = true)]
        trials: usize,
        /// Seed of the random cases and their data.
        #[arg(long, default_value_t = 0, value_parser = args::seed, allow_negative_numbers = true)]
        seed: u64,
        /// Operand type: f32, or f16 (bounds fitting f16's precision).
        #[arg(long, default_value = "f32")]
        dtype: Dtype,
        /// Also run every case with each kernel variant the tuner may pick for it forced in
        /// turn (fused kernels for the fused cases, matmuls for the others).
        #[arg(long)]
        variants: bool,
        /// Only the cases whose line contains this text (e.g. `37x13`, `[storage]`);
        /// repeatable: a case is kept when its line contains any.
        #[arg(long)]
        only: Vec<String>,
        /// A few cases that take every path of a call instead of the whole sweep (with
        /// --variants: what CI runs under the GPU stand-in).
        #[arg(long)]
        quick: bool,
        /// Also run every case on the cooperative-matrix kernels (`--kernels coop`), where
        /// the adapter has them (the tuner does not pick them yet).
        #[arg(long)]
        coop: bool,
        /// Run every dispatch under the WGSL sanitizer as a GPU with subgroups of this many
        /// lanes (32, 64 or 16; 32 when no width is given): data races, indices out of
        /// bounds, reads of unwritten workgroup memory, divergent barriers and inactive-lane
        /// reads are errors; slow (default: WGPU_ATTENTION_SANITIZE, else off).
        #[arg(long, value_name = "LANES", num_args = 0..=1, default_missing_value = "32")]
        sanitize: Option<wgpu_attention::internals::Sanitize>,
        /// Under the sanitizer, run every dispatch under N schedules (seeds
        /// WGPU_ATTENTION_SANITIZE_SEED on), each from the same inputs; a finding names the
        /// seed that reproduces it (default: WGPU_ATTENTION_SANITIZE_SEEDS, else 1).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        sanitize_seeds: Option<u32>,
        /// Also the fused backward (a saved forward, then its gradients) on each family:
        /// grouped-query heads, causal with a window, presets and T5's bias table, f16
        /// (default: under the sanitizer; `--gradients false` leaves them out).
        #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
        gradients: Option<bool>,
        /// Also token-by-token decoding through the KV cache: a prefill, one-token steps,
        /// f32 and f16 caches, presets, small key blocks (default: under the sanitizer).
        #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
        decode: Option<bool>,
        #[command(flatten)]
        adapter: GpuArgs,
    },
    /// Time the GPU against the CPU over a sweep of sizes, with per-kernel times and GFLOP/s.
    Bench(bench_cmd::BenchArgs),
    /// Measure the tables the docs show (forward, backward, decode, matmul, first call) on
    /// this adapter, beside the CPU paths, and write DIR/results.md and DIR/results.json.
    Report(report::ReportArgs),
    /// Warm the tuning cache and the pipeline cache for a list of shapes ahead of time (each
    /// n with and without the weights returned), printing what was chosen and where the
    /// cache is.
    Tune(tune_cmd::TuneArgs),
    /// Write the fully specialised WGSL of every kernel variant the tuner may pick on a GPU
    /// to DIR/<family>/<variant>.wgsl, for offline shader-compiler checks.
    Shaders(shaders_cmd::ShadersArgs),
    /// What each kernel of one forward call would spend on a GPU, counted on the CPU by the
    /// WGSL sanitizer (FLOPs, 32-byte sectors, bank conflicts, barriers, instructions), with
    /// occupancy and a predicted time and bottleneck on a device description (h100), for
    /// every fused-kernel variant the tuner may pick.
    Profile(profile_cmd::ProfileArgs),
    /// The example of the post "Building the Self-Attention Mechanism of Large Language Models
    /// from scratch": attention over the words of a sentence, printed as a table.
    ///
    /// Prints the adapter, the sentence's vocabulary and word indices, the attention weights
    /// (row = query word, column = key word; each row sums to 1), then the context's shape
    /// (one d_v = 28 wide vector per word) and the largest absolute and relative differences
    /// (‖gpu − ref‖ / ‖ref‖) of the weights and the context from the f64 CPU reference.
    Demo {
        /// The sentence (default "Life is short, eat dessert first", the post's).
        sentence: Option<String>,
        /// Seed of the embedding and weights.
        #[arg(long, default_value_t = 42, value_parser = args::seed, allow_negative_numbers = true)]
        seed: u64,
        /// Also draw the weights as a heatmap, words on both axes, into this .png or .svg.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Print to stderr where the time went: adapter, pipeline compile, tune, upload,
        /// record, dispatch, readback.
        #[arg(long)]
        timings: bool,
        /// Also write DIR/weights.npy and DIR/context.npy (float32), as `run` does.
        #[arg(long)]
        out: Option<PathBuf>,
        #[command(flatten)]
        adapter: AdapterArgs,
    },
}

/// With `on`, prints the context's [`Context::phase_times`] to stderr as one line.
/// What `bench` and `report` print first: the profile that built this binary; in a debug
/// build, also a warning on stderr (its CPU baseline runs at about half speed, so every
/// GPU-over-CPU ratio comes out about twice too good).
pub fn say_build_profile() {
    if cfg!(debug_assertions) {
        println!("build:   debug profile (timings are not representative)");
        eprintln!(
            "warning: this is a debug build: the CPU baseline runs at about half speed and the \
             host code slower, so the ratios below are off; time with `cargo run --release -- …`"
        );
    } else {
        println!("build:   release profile");
    }
}

/// The `--timings` line: the context's phases and this process's `.npy` I/O.
pub fn print_timings(ctx: &Context, on: bool) {
    if on {
        let mut t = ctx.phase_times();
        t.io += wgpu_attention::npy::io_time();
        eprintln!("timings   {t}");
    }
}

/// verify's sanitizer options: the width, seeds per dispatch, and whether gradients and
/// decoding run too.
type Sanitizing = (
    Option<wgpu_attention::internals::Sanitize>,
    Option<u32>,
    Option<bool>,
    Option<bool>,
);

fn verify_cmd(
    (trials, seed, dtype): (usize, u64, Dtype),
    (variants, only, quick, coop): (bool, &[String], bool, bool),
    (sanitize, seeds, gradients, decode): Sanitizing,
    adapter: &GpuArgs,
) -> Result<bool> {
    let mut ctx = adapter.open()?;
    if let Some(s) = sanitize {
        ctx = ctx.with_sanitizer(s);
    }
    if let Some(n) = seeds {
        ctx = ctx.with_sanitizer_seeds(n);
    }
    if dtype == Dtype::F16 {
        ctx.require_f16()?;
    }
    let info = ctx.adapter_info();
    println!(
        "adapter: {} ({:?}, {:?}, driver {})",
        info.name, info.backend, info.device_type, info.driver
    );
    println!(
        "GPU vs f64 CPU reference; bound = relative-error tolerance (grows with the logit size)\n"
    );
    println!("{}", verify::HEADER);
    let mut cases = match quick {
        true => verify::quick_cases(),
        false => verify::standard_cases(),
    };
    cases.extend(verify::random_cases(trials, seed));
    let mut on_paths = verify::on_every_path(&ctx, &cases);
    if coop {
        on_paths.extend(verify::on_coop(&ctx, &cases));
    }
    let cases: Vec<_> = on_paths.into_iter().map(|c| c.dtype(dtype)).collect();
    let cases = match variants {
        true => verify::with_every_variant(&ctx, &cases),
        false => cases,
    };
    let cases: Vec<_> = cases
        .into_iter()
        .filter(|c| only.is_empty() || only.iter().any(|o| c.to_string().contains(o.as_str())))
        .collect();
    let mut failed = 0;
    // Drawn on a terminal only (indicatif hides it otherwise); lines print above it.
    let progress = indicatif::ProgressBar::new(cases.len() as u64);
    for (i, case) in cases.iter().enumerate() {
        let line = match verify::run_case(&ctx, case, seed.wrapping_add(i as u64)) {
            Ok(r) => {
                if !r.passed() {
                    failed += 1;
                }
                r.to_string()
            }
            Err(e) => {
                failed += 1;
                format!("{:<58} error: {e}", case.to_string())
            }
        };
        progress.suspend(|| println!("{line}"));
        progress.inc(1);
    }
    progress.finish_and_clear();
    let sanitizing = ctx.sanitizing() != wgpu_attention::internals::Sanitize::Off;
    let steps: Vec<_> = verify::step_cases(
        &ctx,
        gradients.unwrap_or(sanitizing),
        decode.unwrap_or(sanitizing),
    )
    .into_iter()
    .filter(|c| only.is_empty() || only.iter().any(|o| c.to_string().contains(o.as_str())))
    .collect();
    if !steps.is_empty() {
        println!("\n{}", verify::STEP_HEADER);
    }
    for (i, case) in steps.iter().enumerate() {
        match case.run(&ctx, seed.wrapping_add(i as u64)) {
            Ok(r) => {
                failed += usize::from(!r.passed());
                println!("{r}");
            }
            Err(e) => {
                failed += 1;
                println!("{:<58} error: {e}", case.to_string());
            }
        }
    }
    let total = cases.len() + steps.len();
    println!("\n{} passed, {} failed", total - failed, failed);
    if ctx.sanitizing() != wgpu_attention::internals::Sanitize::Off {
        let summary = ctx.sanitizer_summary();
        println!("{summary}");
        // A finding is an error of its case, so it failed above; this catches one that a
        // caller's fallback took for another error.
        if summary.total_errors() > 0 || summary.failed > 0 {
            return Ok(false);
        }
    }
    Ok(failed == 0)
}

fn demo_cmd(
    sentence: Option<&str>,
    seed: u64,
    (plot_path, out_dir): (Option<&Path>, Option<&Path>),
    timings: bool,
    adapter: &AdapterArgs,
) -> Result<()> {
    let sentence = sentence.unwrap_or(demo::DEFAULT_SENTENCE);
    let inputs = demo::inputs(sentence, seed)?;
    if let Some(path) = plot_path {
        wgpu_attention::plot::Format::from_path(path)?;
    }
    let ctx = adapter.open()?;
    let info = ctx.adapter_info();
    println!(
        "adapter:    {} ({:?}, {:?})",
        info.name, info.backend, info.device_type
    );
    println!("sentence:   {sentence:?}");
    println!("vocabulary: {:?}", inputs.vocab);
    println!("indices:    {:?}", inputs.indices);
    println!(
        "X (n={}, d={}) from a seeded normal embedding (seed {seed}); W_Q, W_K {}x{}, W_V {}x{} uniform in [0, 1)\n",
        inputs.x.nrows(),
        demo::D,
        demo::D,
        demo::D_K,
        demo::D,
        demo::D_V
    );
    let proj = Projections::new(inputs.w_q.view(), inputs.w_k.view(), inputs.w_v.view());
    let op = Attention::new();
    let out = op.run(&ctx, Inputs::x(&inputs.x).projections(&proj))?;
    print_timings(&ctx, timings);
    let weights = out
        .weights
        .as_ref()
        .ok_or_else(|| Error::invalid("demo", "no weights"))?;
    println!(
        "attention weights softmax(Q·Kᵀ/sqrt({})), row = query word, column = key word:",
        demo::D_K
    );
    print!("{}", demo::table(&inputs.words, weights)?);
    if let Some(path) = plot_path {
        let title = format!("attention weights: \"{sentence}\"");
        wgpu_attention::plot::heatmap(path, weights.view(), 1, Some(&inputs.words), &title)?;
        println!("\nheatmap -> {}", path.display());
    }
    if let Some(dir) = out_dir {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, format!("cannot create: {e}")))?;
        wgpu_attention::npy::write(&dir.join("weights.npy"), weights)?;
        wgpu_attention::npy::write(&dir.join("context.npy"), &out.context)?;
    }
    let reference = wgpu_attention::reference::run(&op, &Inputs::x(&inputs.x).projections(&proj))?;
    let (rel_c, max_c) = wgpu_attention::reference::compare(&out.context, &reference.context);
    let (rel_w, max_w) = wgpu_attention::reference::compare(
        weights,
        reference
            .weights
            .as_ref()
            .ok_or_else(|| Error::invalid("reference", "no weights"))?,
    );
    println!(
        "\ncontext: shape {:?}, one d_v = {} wide vector per word (the weights above times V)",
        out.context.shape(),
        demo::D_V
    );
    println!(
        "vs the f64 CPU reference: weights max abs {max_w:.1e} (rel {rel_w:.1e}), context max \
         abs {max_c:.1e} (rel {rel_c:.1e}); rel = ‖gpu − ref‖ / ‖ref‖"
    );
    Ok(())
}

/// Mesa's implicit Vulkan layer `VK_LAYER_MESA_device_select` connects to a Wayland display
/// while the adapters are enumerated, to put the GPU that drives the screen first; on a
/// machine with no display it prints "error: XDG_RUNTIME_DIR is invalid or not set in the
/// environment." twice, which reads like a failure. This tool presents nothing and ranks the
/// adapters itself, so the layer is switched off through its own variable, `NODEVICE_SELECT`
/// (unless the user set it). Called first, while the process has one thread.
fn quiet_vulkan_layers() {
    if std::env::var_os("NODEVICE_SELECT").is_none() {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}

fn main() -> ExitCode {
    quiet_vulkan_layers();
    errors::install_panic_hook();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return errors::parse_failure(&e),
    };
    // wgpu's own messages (e.g. EGL probing that fails on a machine without GL) only at -vvv.
    let level = match cli.verbose {
        0 => "wgpu_attention=warn",
        1 => "wgpu_attention=info",
        2 => "wgpu_attention=debug",
        _ => "trace",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level))
        .format_timestamp(None)
        .init();
    // A panic (a bug) has printed its one line from the hook; it exits 1 like any failure.
    let code = match std::panic::catch_unwind(|| dispatch(&cli.command)) {
        Ok(Ok(true)) => ExitCode::SUCCESS,
        Ok(Ok(false)) | Err(_) => ExitCode::FAILURE,
        Ok(Err(e)) => errors::fail(&e),
    };
    sanitizer_line(&cli.command, code)
}

/// Under the WGSL sanitizer, the command's last line on stderr says what ran and what was
/// found (`verify` prints its own in its report, on stdout); a finding fails the command even
/// where the command took it for another error and went on.
fn sanitizer_line(command: &Command, code: ExitCode) -> ExitCode {
    let summary = wgpu_attention::internals::SanitizerSummary::process();
    if summary.lanes == 0 || matches!(command, Command::Verify { .. }) {
        return code;
    }
    eprintln!("{summary}");
    match summary.total_errors() + summary.failed {
        0 => code,
        _ => ExitCode::FAILURE,
    }
}

/// Runs a command: `Ok(false)` when it ran but failed (a `verify` case, say).
fn dispatch(command: &Command) -> Result<bool> {
    match command {
        Command::Devices { adapter } => {
            let options = adapter.options();
            match list_adapters(&options) {
                Ok(adapters) if adapters.is_empty() => Err(Error::NoAdapter {
                    wanted: options.describe(),
                    hint: wgpu_attention::context::NO_ADAPTER_HINT.into(),
                }),
                Ok(adapters) => {
                    for (i, a) in adapters.iter().enumerate() {
                        println!("[{i}] {a}");
                    }
                    if let Some(w) =
                        wgpu_attention::internals::StandIn::from_env()?.subgroup_width()
                    {
                        println!(
                            "WGPU_ATTENTION_STAND_IN: the adapter a command opens ([0] unless \
                             chosen) stands in for a GPU with {w}-lane subgroups \
                             (docs/testing.md)"
                        );
                    }
                    Ok(true)
                }
                Err(e) => Err(e),
            }
        }
        Command::Run(args) => run_cmd::run(args).map(|()| true),
        Command::Sdpa(args) => run_cmd::sdpa(args).map(|()| true),
        Command::Verify {
            trials,
            seed,
            dtype,
            variants,
            only,
            quick,
            coop,
            sanitize,
            sanitize_seeds,
            gradients,
            decode,
            adapter,
        } => verify_cmd(
            (*trials, *seed, *dtype),
            (*variants, only, *quick, *coop),
            (*sanitize, *sanitize_seeds, *gradients, *decode),
            adapter,
        ),
        Command::Bench(args) => bench_cmd::bench_cmd(args),
        Command::Report(args) => report::report_cmd(args),
        Command::Shaders(args) => shaders_cmd::shaders_cmd(args),
        Command::Profile(args) => profile_cmd::profile_cmd(args),
        Command::Tune(args) => tune_cmd::tune_cmd(args),
        Command::Demo {
            sentence,
            seed,
            plot,
            timings,
            out,
            adapter,
        } => demo_cmd(
            sentence.as_deref(),
            *seed,
            (plot.as_deref(), out.as_deref()),
            *timings,
            adapter,
        )
        .map(|()| true),
    }
}
