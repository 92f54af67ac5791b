//! `wgpu-attention tune`: warms the tuning cache and the pipeline cache for a list of shapes
//! ahead of time, so a later process's first call neither measures nor compiles what it can
//! find there.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use ndarray::Array3;
use wgpu_attention::{Attention, Dims, Error, Inputs, Kernels, Options, Result};

use crate::GpuArgs;

#[derive(Args)]
pub struct TuneArgs {
    /// Sequence lengths to warm (each with and without the weights returned).
    #[arg(long, value_delimiter = ',', required = true, value_parser = crate::args::at_least_one, allow_negative_numbers = true)]
    n: Vec<usize>,
    /// Model width d (X is (batch, n, d)); with --weights, the checkpoint's.
    #[arg(long, value_parser = crate::args::at_least_one, allow_negative_numbers = true)]
    d: Option<usize>,
    /// Heads (d, or the projections' widths, must divide by it); with --weights, default
    /// from the config.json beside the checkpoint.
    #[arg(long, value_parser = crate::args::at_least_one, allow_negative_numbers = true)]
    heads: Option<usize>,
    /// Batch size.
    #[arg(long, default_value_t = 1, value_parser = crate::args::at_least_one, allow_negative_numbers = true)]
    batch: usize,
    /// Causal calls.
    #[arg(long)]
    causal: bool,
    /// A safetensors checkpoint whose layer (--prefix) projects X, as `run --weights`.
    #[arg(long, requires = "prefix")]
    weights: Option<PathBuf>,
    /// The layer's module name in the checkpoint.
    #[arg(long, requires = "weights")]
    prefix: Option<String>,
    /// Kernel family to warm: auto (measured), storage or subgroup.
    #[arg(long, default_value = "auto")]
    kernels: Kernels,
    #[command(flatten)]
    adapter: GpuArgs,
}

pub fn tune_cmd(args: &TuneArgs) -> Result<bool> {
    let layer = match (&args.weights, &args.prefix) {
        (Some(file), Some(prefix)) => Some(crate::checkpoint_cmd::layer(file, prefix, args.heads)?),
        _ => None,
    };
    let heads = match &layer {
        Some((_, h)) => *h,
        None => args.heads.unwrap_or(1),
    };
    let proj = layer.as_ref().map(|(l, _)| l.projections());
    let d = match (&proj, args.d) {
        (Some(p), Some(d)) if p.w_q.nrows() != d => {
            return Err(Error::invalid(
                "--d",
                format!(
                    "{d}, but the checkpoint's layer takes d = {}",
                    p.w_q.nrows()
                ),
            ))
        }
        (Some(p), _) => p.w_q.nrows(),
        (None, Some(d)) => d,
        (None, None) => {
            return Err(Error::invalid(
                "--d",
                "missing: give the model width (or --weights and --prefix)",
            ))
        }
    };
    measure_every_candidate();
    let ctx = args.adapter.open()?;
    if !ctx.tuning() {
        eprintln!("note: WGPU_ATTENTION_TUNE=off: nothing is measured, only compiled");
    }
    let info = ctx.adapter_info();
    println!(
        "adapter   {} ({:?}, {:?}, driver {})",
        info.name, info.backend, info.device_type, info.driver
    );
    for &n in &args.n {
        let x = Array3::from_shape_fn((args.batch, n, d), |(b, i, j)| {
            (((b * 31 + i * 7 + j * 3) % 23) as f32 - 11.0) / 11.0
        });
        for weights in [true, false] {
            let op = Attention::new()
                .heads(heads)
                .causal(args.causal)
                .options(Options::default().kernels(args.kernels))
                .return_weights(weights);
            let start = Instant::now();
            let before = ctx.phase_times();
            let inputs = Inputs::x(&x).projections(proj.as_ref());
            let dims = Dims::new(&op, &inputs)?;
            op.run(&ctx, inputs)?;
            let spent = ctx.phase_times().since(&before);
            // What the call ran, now that its choices are made (and remembered).
            let plan = op.plan(&ctx, &dims)?;
            println!(
                "n {n:>6} {:<8} {plan}  ({:.0} ms: tune {:.0}, compile {:.0} ms, {} pipelines)",
                if weights { "weights" } else { "fused" },
                start.elapsed().as_secs_f64() * 1e3,
                spent.tune.as_secs_f64() * 1e3,
                spent.compile.as_secs_f64() * 1e3,
                spent.pipelines
            );
        }
    }
    match ctx.tune_cache().path() {
        Some(path) => println!(
            "cache     {} (tuning choices; compiled pipelines beside it where the driver keeps them)",
            path.display()
        ),
        None => println!("cache     off (WGPU_ATTENTION_TUNE_CACHE=off): nothing was kept"),
    }
    Ok(true)
}

/// Lifts the tuner's budget for this process (before any context opens): `tune` and `bench`
/// measure every candidate, not only what a call's own time allows (`tune::budgeted`), unless
/// `WGPU_ATTENTION_TUNE=off`.
pub fn measure_every_candidate() {
    if !std::env::var("WGPU_ATTENTION_TUNE").is_ok_and(|v| v.eq_ignore_ascii_case("off")) {
        std::env::set_var("WGPU_ATTENTION_TUNE", "full");
    }
}
