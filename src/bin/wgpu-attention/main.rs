//! The `wgpu-attention` command line: `devices`, `run`, `sdpa`, `verify`, `bench`, `demo`.

mod bench_cmd;
mod checkpoint_cmd;
mod shaders_cmd;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use ndarray::{ArrayD, Ix1, Ix2};
use wgpu_attention::{
    demo, list_adapters, npy, verify, Attention, Backend, Context, ContextOptions, Dtype, Error,
    Kernels, Mask, Projections, Result,
};

/// Scaled dot-product self-attention in WGSL compute shaders on wgpu.
#[derive(Parser)]
#[command(version, about, long_about = None)]
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
        ContextOptions {
            backend: self.backend,
            adapter_name: self.adapter.clone(),
        }
    }

    pub fn open(&self) -> Result<Context> {
        Context::with_options(&self.options())
    }
}

#[derive(Subcommand)]
enum Command {
    /// List every adapter wgpu finds, best first, with the limits that matter.
    Devices {
        #[command(flatten)]
        adapter: AdapterArgs,
    },
    /// Compute attention over .npy inputs and write context.npy and weights.npy.
    Run(Box<RunArgs>),
    /// PyTorch's scaled_dot_product_attention over Q, K, V .npy files in (batch, heads, L, E)
    /// layout; writes context.npy (batch, heads, L, E_v) and weights.npy (batch, heads, L, S).
    Sdpa(SdpaArgs),
    /// Check the GPU kernels against the f64 CPU reference over many shapes and options.
    Verify {
        /// Random cases in addition to the fixed sweep.
        #[arg(long, default_value_t = 20)]
        trials: usize,
        /// Seed of the random cases and their data.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Operand type: f32, or f16 (bounds fitting f16's precision).
        #[arg(long, default_value = "f32")]
        dtype: Dtype,
        #[command(flatten)]
        adapter: AdapterArgs,
    },
    /// Time the GPU against the CPU over a sweep of sizes, with per-kernel times and GFLOP/s.
    Bench(bench_cmd::BenchArgs),
    /// Write the fully specialised WGSL of every fused-kernel variant the tuner may pick to
    /// DIR/<family>/<variant>.wgsl, for offline shader-compiler checks.
    Shaders(shaders_cmd::ShadersArgs),
    /// Seed 000's example: attention over the words of a sentence, printed as a table.
    Demo {
        /// The sentence.
        sentence: Option<String>,
        /// Seed of the embedding and weights.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Also draw the weights as a heatmap, words on both axes, into this .png or .svg.
        #[arg(long)]
        plot: Option<PathBuf>,
        #[command(flatten)]
        adapter: AdapterArgs,
    },
}

#[derive(Args)]
struct SdpaArgs {
    /// Q, (batch, heads, L, E), float32 or float64 .npy.
    #[arg(long)]
    q: PathBuf,
    /// K, (batch, heads, S, E).
    #[arg(long)]
    k: PathBuf,
    /// V, (batch, heads, S, E_v).
    #[arg(long)]
    v: PathBuf,
    #[command(flatten)]
    op: OpArgs,
}

fn read_4d(path: &Path) -> Result<ndarray::Array4<f32>> {
    let a = npy::read(path)?;
    let shape = a.shape().to_vec();
    a.into_dimensionality().map_err(|_| {
        Error::shape(format!(
            "{}: expected a 4-D array (batch, heads, rows, width), got shape {shape:?}",
            path.display()
        ))
    })
}

fn sdpa(args: &SdpaArgs) -> Result<()> {
    let (q, k, v) = (read_4d(&args.q)?, read_4d(&args.k)?, read_4d(&args.v)?);
    let op = args.op.op();
    // Check the problem before opening a device, so bad input fails fast.
    let dims = op.sdpa_dims(q.shape(), k.shape(), v.shape())?;
    let (mask_array, lengths) = args.op.read_mask()?;
    let mask = with_lengths(mask_array.as_ref(), lengths.as_deref());
    let (b, h, l, _) = q.dim();
    mask.check([b, h, l, k.dim().2])?;
    let ctx = args.op.adapter.open()?;
    let out = op.sdpa_masked(&ctx, q.view(), k.view(), v.view(), &mask)?;
    args.op.write(&out)?;
    println!(
        "sdpa      Q {:?}, K {:?}, V {:?}, scale {}, causal {} -> {}",
        q.shape(),
        k.shape(),
        v.shape(),
        dims.scale,
        dims.causal,
        args.op.out.display()
    );
    Ok(())
}

#[derive(Args)]
struct RunArgs {
    /// Input X, (n, d) or (batch, n, d), float32 or float64 .npy.
    #[arg(long)]
    x: PathBuf,
    /// W_Q, (d, d_k), in X·W orientation (PyTorch's nn.Linear.weight transposed).
    #[arg(long, requires_all = ["wk", "wv"])]
    wq: Option<PathBuf>,
    /// W_K, (d, d_k).
    #[arg(long, requires_all = ["wq", "wv"])]
    wk: Option<PathBuf>,
    /// W_V, (d, d_v).
    #[arg(long, requires_all = ["wq", "wk"])]
    wv: Option<PathBuf>,
    /// b_Q, (d_k,).
    #[arg(long, requires_all = ["bk", "bv", "wq"])]
    bq: Option<PathBuf>,
    /// b_K, (d_k,).
    #[arg(long, requires_all = ["bq", "bv", "wq"])]
    bk: Option<PathBuf>,
    /// b_V, (d_v,).
    #[arg(long, requires_all = ["bq", "bk", "wq"])]
    bv: Option<PathBuf>,
    /// W_O, (d_v, d_out): output projection, context·W_O (+ b_O), as nn.MultiheadAttention's
    /// out_proj (its weight transposed).
    #[arg(long, requires = "wq")]
    wo: Option<PathBuf>,
    /// b_O, (d_out,).
    #[arg(long, requires = "wo")]
    bo: Option<PathBuf>,
    /// Q/K/V (and output) projections of one layer from a .safetensors checkpoint, as PyTorch
    /// stores nn.Linear weights (transposed here): BERT's PREFIX.query/key/value (or
    /// PREFIX.self.query/… for the parent BertAttention), PREFIX.q_proj/k_proj/v_proj, or
    /// nn.MultiheadAttention's PREFIX.in_proj_weight. The output projection is applied only
    /// when it is directly under PREFIX (PREFIX.out_proj / o_proj / output.dense): a
    /// ….attention.self prefix gives BertSelfAttention's output, the context. Heads: --heads,
    /// else the config.json beside the file (num_attention_heads, num_key_value_heads).
    #[arg(long, requires = "prefix", conflicts_with_all = ["wq", "wk", "wv", "bq", "bk", "bv", "wo", "bo"])]
    weights: Option<PathBuf>,
    /// The layer's name prefix in the checkpoint, e.g. encoder.layer.0.attention.self.
    #[arg(long, requires = "weights")]
    prefix: Option<String>,
    /// Number of heads (d_k and d_v must divide by it). Default: 1, or with --weights the
    /// config.json beside the checkpoint.
    #[arg(long)]
    heads: Option<usize>,
    #[command(flatten)]
    op: OpArgs,
    /// Also draw the weights as a heatmap into this .png or .svg (one panel per head; of a
    /// batch, the first sequence).
    #[arg(long)]
    plot: Option<PathBuf>,
}

/// The options `run` and `sdpa` share.
#[derive(Args)]
struct OpArgs {
    /// Causal mask, top-left aligned as PyTorch's is_causal: query i attends to keys j ≤ i.
    #[arg(long)]
    causal: bool,
    /// Scale of Q·Kᵀ (default 1/sqrt of the per-head query width).
    #[arg(long, allow_negative_numbers = true)]
    scale: Option<f32>,
    /// Attention mask .npy, broadcastable to (batch, heads, n_q, n_kv): bool (true = attend)
    /// or float (added to the scaled scores, -inf masks out). Combines with --causal; a row
    /// with nothing to attend to gives zeros.
    #[arg(long)]
    mask: Option<PathBuf>,
    /// Key lengths .npy, one integer per sequence: sequence b attends to its first L[b] keys.
    #[arg(long)]
    kv_lengths: Option<PathBuf>,
    /// Do not compute-and-return the attention weights (no weights.npy).
    #[arg(long)]
    no_weights: bool,
    /// Kernel family: auto (measured on first use), storage (any adapter) or subgroup
    /// (textures + subgroup operations, fast on lavapipe).
    #[arg(long, default_value = "auto")]
    kernels: Kernels,
    /// Operand type on the device: f32, or f16 (needs SHADER_F16; operands stored as f16,
    /// arithmetic in f32; the outputs are written as float16 .npy).
    #[arg(long, default_value = "f32")]
    dtype: Dtype,
    /// Pass NaN/Inf in the inputs through (they propagate to the outputs that depend on them)
    /// instead of rejecting them.
    #[arg(long)]
    propagate_nan: bool,
    /// Output directory (created if missing).
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    adapter: AdapterArgs,
}

impl OpArgs {
    /// The op these options configure.
    fn op(&self) -> Attention {
        let op = Attention::new()
            .causal(self.causal)
            .return_weights(!self.no_weights)
            .kernels(self.kernels)
            .dtype(self.dtype)
            .propagate_non_finite(self.propagate_nan);
        match self.scale {
            Some(s) => op.scale(s),
            None => op,
        }
    }

    /// Reads --mask and --kv-lengths (a mask array the returned [`Mask`] borrows from).
    fn read_mask(&self) -> Result<(Option<npy::MaskArray>, Option<Vec<usize>>)> {
        let mask = self.mask.as_deref().map(npy::read_mask).transpose()?;
        let lengths = self
            .kv_lengths
            .as_deref()
            .map(npy::read_lengths)
            .transpose()?;
        Ok((mask, lengths))
    }

    /// Writes context.npy and, when there are weights, weights.npy into `out`.
    fn write(&self, out: &wgpu_attention::Output) -> Result<()> {
        std::fs::create_dir_all(&self.out)
            .map_err(|e| Error::io(&self.out, format!("cannot create directory: {e}")))?;
        let write = match self.dtype {
            Dtype::F32 => npy::write,
            Dtype::F16 => npy::write_f16,
        };
        write(&self.out.join("context.npy"), &out.context)?;
        if let Some(w) = &out.weights {
            write(&self.out.join("weights.npy"), w)?;
        }
        Ok(())
    }
}

fn read_2d(path: &Path) -> Result<ndarray::Array2<f32>> {
    let a = npy::read(path)?;
    let shape = a.shape().to_vec();
    a.into_dimensionality::<Ix2>()
        .map_err(|_| Error::io(path, format!("expected a 2-D array, found shape {shape:?}")))
}

fn read_1d(path: &Path) -> Result<ndarray::Array1<f32>> {
    let a = npy::read(path)?;
    let shape = a.shape().to_vec();
    a.into_dimensionality::<Ix1>()
        .map_err(|_| Error::io(path, format!("expected a 1-D array, found shape {shape:?}")))
}

/// The mask of a read mask array and key lengths (either may be absent).
fn with_lengths<'a>(mask: Option<&'a npy::MaskArray>, lengths: Option<&[usize]>) -> Mask<'a> {
    let mask = mask.map(npy::MaskArray::mask).unwrap_or_default();
    match lengths {
        Some(l) => mask.with_kv_lengths(l),
        None => mask,
    }
}

fn run(args: &RunArgs) -> Result<()> {
    if let Some(path) = &args.plot {
        if args.op.no_weights {
            return Err(Error::invalid(
                "--plot",
                "draws the attention weights, which --no-weights turns off",
            ));
        }
        wgpu_attention::plot::Format::from_path(path)?;
    }
    let x: ArrayD<f32> = npy::read(&args.x)?;
    let weights = match (&args.wq, &args.wk, &args.wv) {
        (Some(q), Some(k), Some(v)) => Some((read_2d(q)?, read_2d(k)?, read_2d(v)?)),
        _ => None,
    };
    let biases = match (&args.bq, &args.bk, &args.bv) {
        (Some(q), Some(k), Some(v)) => Some((read_1d(q)?, read_1d(k)?, read_1d(v)?)),
        _ => None,
    };
    let w_o = args.wo.as_deref().map(read_2d).transpose()?;
    let b_o = args.bo.as_deref().map(read_1d).transpose()?;
    let (layer, heads) = match (&args.weights, &args.prefix) {
        (Some(file), Some(prefix)) => {
            let (layer, heads) = checkpoint_cmd::layer(file, prefix, args.heads)?;
            (Some(layer), heads)
        }
        _ => (None, args.heads.unwrap_or(1)),
    };
    let from_file = weights.as_ref().map(|(q, k, v)| {
        let p = Projections::new(q.view(), k.view(), v.view());
        let p = match &biases {
            Some((bq, bk, bv)) => p.with_bias(bq.view(), bk.view(), bv.view()),
            None => p,
        };
        match &w_o {
            Some(w) => p.with_output(w.view(), b_o.as_ref().map(|b| b.view())),
            None => p,
        }
    });
    let proj = match &layer {
        Some(l) => Some(l.projections()),
        None => from_file,
    };
    let op = args.op.op().heads(heads);
    // Check the problem before opening a device, so bad input fails fast.
    let dims = op.dims(x.shape(), proj.as_ref())?;
    let (mask_array, lengths) = args.op.read_mask()?;
    let mask = with_lengths(mask_array.as_ref(), lengths.as_deref());
    mask.check([dims.batch, dims.heads, dims.n, dims.n])?;
    let ctx = args.op.adapter.open()?;
    let start = Instant::now();
    let out = op.forward_masked(&ctx, x.view(), proj.as_ref(), &mask)?;
    let elapsed = start.elapsed();
    args.op.write(&out)?;
    let info = ctx.adapter_info();
    println!(
        "adapter   {} ({:?}, {:?})",
        info.name, info.backend, info.device_type
    );
    println!(
        "problem   X {:?}, d_k {}, d_v {}, heads {}, scale {}, causal {}",
        x.shape(),
        dims.d_k,
        dims.d_v,
        dims.heads,
        dims.scale,
        dims.causal
    );
    println!(
        "context   {:?} -> {}",
        out.context.shape(),
        args.op.out.join("context.npy").display()
    );
    if let Some(w) = &out.weights {
        println!(
            "weights   {:?} -> {}",
            w.shape(),
            args.op.out.join("weights.npy").display()
        );
        if let Some(path) = &args.plot {
            let title = format!(
                "attention weights, X {:?}{}",
                x.shape(),
                if dims.causal { ", causal" } else { "" }
            );
            wgpu_attention::plot::heatmap(path, w.view(), dims.heads, None, &title)?;
            println!("heatmap   -> {}", path.display());
        }
    }
    println!(
        "time      {:.2} ms (upload, kernels, readback; includes first-use shader compilation)",
        elapsed.as_secs_f64() * 1e3
    );
    Ok(())
}

fn verify_cmd(trials: usize, seed: u64, dtype: Dtype, adapter: &AdapterArgs) -> Result<bool> {
    let ctx = adapter.open()?;
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
    let mut cases = verify::standard_cases();
    cases.extend(verify::random_cases(trials, seed));
    let cases: Vec<_> = verify::on_every_path(&ctx, &cases)
        .into_iter()
        .map(|c| verify::Case { dtype, ..c })
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
    println!("\n{} passed, {} failed", cases.len() - failed, failed);
    Ok(failed == 0)
}

fn demo_cmd(
    sentence: Option<&str>,
    seed: u64,
    plot_path: Option<&Path>,
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
    let out = op.forward(&ctx, inputs.x.view().into_dyn(), Some(&proj))?;
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
    let reference =
        wgpu_attention::reference::attention(&op, inputs.x.view().into_dyn(), Some(&proj))?;
    let (rel_c, max_c) = wgpu_attention::reference::compare(&out.context, &reference.context);
    let (rel_w, max_w) = wgpu_attention::reference::compare(
        weights,
        reference
            .weights
            .as_ref()
            .ok_or_else(|| Error::invalid("reference", "no weights"))?,
    );
    println!(
        "\ncontext vectors: {:?}; vs the f64 CPU reference: weights max abs {:.1e} (rel {:.1e}), context max abs {:.1e} (rel {:.1e})",
        out.context.shape(),
        max_w,
        rel_w,
        max_c,
        rel_c
    );
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
    let result = match &cli.command {
        Command::Devices { adapter } => {
            let adapters = list_adapters(&adapter.options());
            if adapters.is_empty() {
                Err(Error::NoAdapter {
                    wanted: String::new(),
                    hint: wgpu_attention::context::NO_ADAPTER_HINT.into(),
                })
            } else {
                for (i, a) in adapters.iter().enumerate() {
                    println!("[{i}] {a}");
                }
                Ok(true)
            }
        }
        Command::Run(args) => run(args).map(|()| true),
        Command::Sdpa(args) => sdpa(args).map(|()| true),
        Command::Verify {
            trials,
            seed,
            dtype,
            adapter,
        } => verify_cmd(*trials, *seed, *dtype, adapter),
        Command::Bench(args) => bench_cmd::bench_cmd(args),
        Command::Shaders(args) => shaders_cmd::shaders_cmd(args),
        Command::Demo {
            sentence,
            seed,
            plot,
            adapter,
        } => demo_cmd(sentence.as_deref(), *seed, plot.as_deref(), adapter).map(|()| true),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
