//! `run` and `sdpa`: attention over `.npy` inputs (or a checkpoint's layer), written to
//! `.npy` outputs, with masks, key lengths, f16 and gradients.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use ndarray::{ArrayD, Ix1, Ix2};
use wgpu_attention::{
    npy, Attention, Dims, Dtype, Error, Inputs, Kernels, Mask, Options, Projections, Result,
};

use crate::{checkpoint_cmd, grad_cmd, GpuArgs};

#[derive(Args)]
pub struct SdpaArgs {
    /// Q, (batch, heads, L, E), float16, float32 or float64 .npy.
    #[arg(long)]
    q: PathBuf,
    /// K, (batch, heads, S, E), float16/32/64 .npy.
    #[arg(long)]
    k: PathBuf,
    /// V, (batch, heads, S, E_v), float16/32/64 .npy.
    #[arg(long)]
    v: PathBuf,
    #[command(flatten)]
    op: OpArgs,
    #[command(flatten)]
    mods: crate::mods_args::ModArgs,
}

/// All of an opened Q, K or V file's values (4-d, checked when opened).
fn read_4d(file: &npy::Opened) -> Result<ndarray::Array4<f32>> {
    file.read()?
        .into_dimensionality()
        .map_err(|e| Error::shape(format!("{}: {e}", file.path().display())))
}

/// Opens a Q, K or V file (its header read, its values left on disk until the upload reads
/// them straight into device memory), checking that it is 4-d.
fn open_4d(path: &Path) -> Result<npy::Opened> {
    let a = npy::Opened::open(path)?;
    match a.shape().len() {
        4 => Ok(a),
        _ => Err(Error::shape(format!(
            "{}: expected a 4-D array (batch, heads, rows, width), got shape {:?}",
            path.display(),
            a.shape()
        ))),
    }
}

pub fn sdpa(args: &SdpaArgs) -> Result<()> {
    let (q, k, v) = (open_4d(&args.q)?, open_4d(&args.k)?, open_4d(&args.v)?);
    let op = args.op.op();
    // Check the problem before opening a device, so bad input fails fast.
    let dims = Dims::new(&op, &Inputs::qkv(&q, &k, &v))?;
    let (mask_array, lengths) = args.op.read_mask()?;
    let mods = args.mods.modifiers()?;
    let mask = with_lengths(mask_array.as_ref(), lengths.as_deref()).with_modifiers(&mods);
    let (qs, ks) = (q.shape(), k.shape());
    mask.check([qs[0], qs[1], qs[2], ks[2]])?;
    let d_o = args.op.grad.sdpa_grad_output([q.shape(), v.shape()])?;
    let ctx = args.op.adapter.open()?;
    let (out, grads) = match &d_o {
        Some(d_o) => {
            let op = (&op, !args.op.context_only);
            let (q, k, v) = (read_4d(&q)?, read_4d(&k)?, read_4d(&v)?);
            let qkv = [q.view(), k.view(), v.view()];
            let (out, grads) = grad_cmd::GradArgs::sdpa_on_gpu(&ctx, op, qkv, &mask, d_o)?;
            (out, Some(grads))
        }
        // Each file's values go from the file into device memory in one pass.
        None => (op.run(&ctx, Inputs::qkv(&q, &k, &v).mask(&mask))?, None),
    };
    args.op.write(&out)?;
    grad_cmd::write(grads, &args.op.out, args.op.dtype)?;
    crate::print_timings(&ctx, args.op.timings);
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
pub struct RunArgs {
    /// Input X, (n, d) or (batch, n, d), float16, float32 or float64 .npy.
    #[arg(long)]
    x: PathBuf,
    /// W_Q, (d, d_k), float16/32/64 .npy, in X·W orientation (PyTorch's nn.Linear.weight
    /// transposed); every weight and bias file takes the same dtypes.
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
    #[command(flatten)]
    mods: crate::mods_args::ModArgs,
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
    /// or float16/32/64 (added to the scaled scores, -inf masks out). Combines with --causal; a row
    /// with nothing to attend to gives zeros.
    #[arg(long)]
    mask: Option<PathBuf>,
    /// Key lengths .npy (any integer dtype), one per sequence: sequence b attends to its first
    /// L[b] keys.
    #[arg(long)]
    kv_lengths: Option<PathBuf>,
    /// Return only the context, not the attention weights (no weights.npy): the fused
    /// kernel, which never forms the n × n weights.
    #[arg(long)]
    context_only: bool,
    /// Kernel family: auto (measured on first use), storage (any adapter), subgroup
    /// (textures + subgroup operations, fast on lavapipe) or coop (storage with the matmul on
    /// cooperative matrices: tensor cores, where the adapter has them).
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
    /// Print to stderr where the time went: io (.npy files), adapter, pipeline compile, tune,
    /// upload (host → device, checks included), record (planning, encoding),
    /// dispatch (until the device is done), readback (device → host, checks included).
    #[arg(long)]
    timings: bool,
    #[command(flatten)]
    grad: grad_cmd::GradArgs,
    #[command(flatten)]
    adapter: GpuArgs,
}

impl OpArgs {
    /// The op these options configure.
    fn op(&self) -> Attention {
        let op = Attention::new()
            .causal(self.causal)
            .return_weights(!self.context_only)
            .dtype(self.dtype)
            .options(
                Options::default()
                    .kernels(self.kernels)
                    .propagate_non_finite(self.propagate_nan),
            );
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

pub fn run(args: &RunArgs) -> Result<()> {
    if let Some(path) = &args.plot {
        if args.op.context_only {
            return Err(Error::invalid(
                "--plot",
                "draws the attention weights, which --context-only turns off",
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
    let inputs = Inputs::x(&x).projections(proj.as_ref());
    let dims = Dims::new(&op, &inputs)?;
    let (mask_array, lengths) = args.op.read_mask()?;
    let mods = args.mods.modifiers()?;
    let mask = with_lengths(mask_array.as_ref(), lengths.as_deref()).with_modifiers(&mods);
    mask.check([dims.batch, dims.heads, dims.n, dims.n])?;
    let d_o = args.op.grad.run_grad_output(&op, x.view(), proj.as_ref())?;
    let ctx = args.op.adapter.open()?;
    let start = Instant::now();
    let (out, grads) = match &d_o {
        Some(d_o) => {
            let call = (x.view(), proj.as_ref());
            let from_flags = layer.is_none();
            let op = (&op, !args.op.context_only);
            let (out, g) = grad_cmd::GradArgs::run_on_gpu(&ctx, op, call, &mask, d_o, from_flags)?;
            (out, Some(g))
        }
        None => (op.run(&ctx, inputs.mask(&mask))?, None),
    };
    let elapsed = start.elapsed();
    args.op.write(&out)?;
    grad_cmd::write(grads, &args.op.out, args.op.dtype)?;
    crate::print_timings(&ctx, args.op.timings);
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
