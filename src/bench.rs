//! Benchmarks, shared by `wgpu-attention bench` and the criterion benches (not part of the
//! library's API): the GPU forward pass on each kernel family, a CPU f32 ndarray attention to
//! compare with in the same run, standalone matmuls, and the adapter's arithmetic ceiling.
//! Times are medians over repeated runs after warm-up (the first dispatch of a kernel
//! compiles it on lavapipe); the clocks themselves are in the crate's timing module.

use ndarray::{s, Array2, Array3, ArrayView3, Axis};

use crate::attention::{Attention, Dims};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::gpu::buffer;
use crate::gpu::timing::{self, KernelTime, Profiling};
use crate::kernels::fma_peak;
use crate::tune::MatmulProblem;
use crate::variant::{Kernels, MatmulVariant};

pub use crate::gpu::timing::{kernel_medians, measure, Stats};
/// Writes the fully specialised WGSL of every kernel variant the tuner may pick on a GPU to
/// `dir/<family>/<variant>.wgsl` (`wgpu-attention shaders`): every kernel variant a GPU's
/// tuner, lavapipe and the GPU stand-in may run (the subgroup family at 8, 16, 32 and 64
/// lanes, and at `subgroup_size` too). Returns the files written.
///
/// # Errors
/// [`Error::Io`] when a file cannot be written.
pub fn write_shaders(
    dir: &std::path::Path,
    subgroup_size: Option<u32>,
) -> Result<Vec<std::path::PathBuf>> {
    crate::tune::sources::write(dir, subgroup_size)
}

pub use crate::tune::{flash_candidates, matmul as tuned_matmul, matmul_candidates, COOP_TUNED};

/// Self-attention with `Q = K = V = x` on the CPU in f32 with ndarray (matrixmultiply's
/// GEMM, one thread): the honest CPU baseline for `bench`. Rows are processed in blocks, so
/// memory stays O(block · n) at any n. Heads split the last axis as in [`Attention`].
pub fn cpu_attention_f32(x: ArrayView3<'_, f32>, heads: usize, causal: bool) -> Array3<f32> {
    cpu_sdpa_f32((x, x, x), heads, causal)
}

/// A projected layer on the CPU in f32 (one thread): `Q, K, V = X·W_Q, X·W_K, X·W_V`, the
/// attention as [`cpu_attention_f32`], then `·W_O`: the CPU peer of `bench --model`.
pub fn cpu_layer_f32(
    x: ArrayView3<'_, f32>,
    [w_q, w_k, w_v, w_o]: [&Array2<f32>; 4],
    heads: usize,
    causal: bool,
) -> Array3<f32> {
    let (batch, n, d) = x.dim();
    let rows = x
        .as_standard_layout()
        .into_owned()
        .into_shape_with_order((batch * n, d))
        .expect("contiguous");
    let project = |w: &Array2<f32>| {
        rows.dot(w)
            .into_shape_with_order((batch, n, w.ncols()))
            .expect("contiguous")
    };
    let (q, k, v) = (project(w_q), project(w_k), project(w_v));
    let context = cpu_sdpa_f32((q.view(), k.view(), v.view()), heads, causal);
    let width = context.dim().2;
    context
        .into_shape_with_order((batch * n, width))
        .expect("contiguous")
        .dot(w_o)
        .into_shape_with_order((batch, n, w_o.ncols()))
        .expect("contiguous")
}

/// Attention of `q`, `k`, `v`, each `(batch, n, heads·width)`, heads side by side.
fn cpu_sdpa_f32(
    (q, k, v): (
        ArrayView3<'_, f32>,
        ArrayView3<'_, f32>,
        ArrayView3<'_, f32>,
    ),
    heads: usize,
    causal: bool,
) -> Array3<f32> {
    const BLOCK: usize = 256;
    let (batch, n, d) = q.dim();
    let dh = d / heads.max(1);
    let dv = v.dim().2 / heads.max(1);
    let scale = 1.0 / (dh as f32).sqrt();
    let mut out = Array3::<f32>::zeros((batch, n, dv * heads));
    for b in 0..batch {
        for h in 0..heads {
            let qh = q.slice(s![b, .., h * dh..(h + 1) * dh]);
            let kh = k.slice(s![b, .., h * dh..(h + 1) * dh]);
            let vh = v.slice(s![b, .., h * dv..(h + 1) * dv]);
            let kt = kh.t();
            for r0 in (0..n).step_by(BLOCK) {
                let r1 = (r0 + BLOCK).min(n);
                // Keys past the block's last row are all masked when causal.
                let kv = if causal { r1 } else { n };
                let qb = qh.slice(s![r0..r1, ..]);
                let mut sc: Array2<f32> = qb.dot(&kt.slice(s![.., ..kv]));
                for (i, mut row) in sc.axis_iter_mut(Axis(0)).enumerate() {
                    let visible = if causal { r0 + i + 1 } else { kv };
                    softmax_f32(
                        row.as_slice_mut().expect("rows are contiguous"),
                        visible,
                        scale,
                    );
                }
                let ctx = sc.dot(&vh.slice(s![..kv, ..]));
                out.slice_mut(s![b, r0..r1, h * dv..(h + 1) * dv])
                    .assign(&ctx);
            }
        }
    }
    out
}

/// `row[..visible] ← softmax(scale · row[..visible])`, zeros after.
fn softmax_f32(row: &mut [f32], visible: usize, scale: f32) {
    let m = row[..visible]
        .iter()
        .fold(f32::NEG_INFINITY, |a, &v| a.max(v * scale));
    let mut sum = 0.0;
    for v in &mut row[..visible] {
        *v = (*v * scale - m).exp();
        sum += *v;
    }
    for v in &mut row[..visible] {
        *v /= sum;
    }
    row[visible..].fill(0.0);
}

/// The adapter's f32 arithmetic ceiling in GFLOP/s: `fma_peak.wgsl` on enough invocations
/// to fill the device, best of a few runs (GPU time where timestamps exist, else wall time).
///
/// # Errors
/// GPU errors.
pub fn fma_peak(ctx: &Context) -> Result<f64> {
    let cpu = !ctx.hardware().decide.gpu_sized_benchmarks;
    // Enough work to dwarf launch costs: ~2 GFLOP on a CPU adapter, ~1 TFLOP on a GPU.
    let (invocations, iters): (u32, u32) = if cpu {
        (16_384, 2_048)
    } else {
        (1 << 22, 4_096)
    };
    let out = buffer::output(ctx, "fma peak", invocations as usize, false)?;
    let flops = f64::from(invocations) * f64::from(iters) * fma_peak::FLOPS_PER_ITER;
    let mut best = 0.0f64;
    for _ in 0..4 {
        let (wall, times) = timing::timed_submit(ctx, |enc| {
            fma_peak::dispatch(ctx, enc, invocations, iters, &out)
        })?;
        let ms = times.first().map_or(wall, |t| t.ms);
        best = best.max(flops / (ms * 1e6));
    }
    Ok(best)
}

/// A matmul `m × k` by `k × n` with `variant` on operands of `dtype` (f16 operands
/// accumulate in f32): wall-clock statistics of the dispatch (operands already on the GPU)
/// and, when profiling is on, the kernels' median times.
///
/// # Errors
/// Size limits and GPU errors.
pub fn matmul(
    ctx: &Context,
    (variant, dtype): (MatmulVariant, crate::Dtype),
    (m, n, k): (usize, usize, usize),
    warmup: usize,
    repeats: usize,
) -> Result<(Stats, Vec<(String, f64)>)> {
    let problem = MatmulProblem::new(ctx, (m, n, k), dtype)?;
    profiled(ctx, warmup, repeats, || problem.run(ctx, variant))
}

/// One GPU forward pass of self-attention (`Q = K = V = x`) with `op`, returning the
/// wall-clock statistics and, when profiling is on, the kernels' median times.
///
/// # Errors
/// Whatever the forward pass returns.
pub fn gpu_attention(
    ctx: &Context,
    op: &Attention,
    x: ArrayView3<'_, f32>,
    warmup: usize,
    repeats: usize,
) -> Result<(Stats, Vec<(String, f64)>)> {
    let x = x.into_dyn();
    profiled(ctx, warmup, repeats, || {
        op.run(ctx, crate::Inputs::x(x.view()))?;
        Ok(ctx.kernel_times())
    })
}

/// [`gpu_attention`] with X already on the device as a [`crate::Tensor`] and the result left
/// there: the kernels alone (and their launch), waited for with [`Context::synchronize`].
///
/// # Errors
/// Whatever the forward pass returns.
pub fn gpu_resident(
    ctx: &Context,
    (op, dtype): (&Attention, crate::Dtype),
    x: ArrayView3<'_, f32>,
    (warmup, repeats): (usize, usize),
) -> Result<(Stats, Vec<(String, f64)>)> {
    let x = crate::Tensor::from_array(ctx, x.into_dyn(), dtype)?;
    profiled(ctx, warmup, repeats, || {
        op.run(ctx, crate::Inputs::x(&x))?;
        ctx.synchronize()?;
        Ok(ctx.kernel_times())
    })
}

/// Wall-clock statistics and the kernels' median times (empty when profiling is off).
pub type Timed = (Stats, Vec<(String, f64)>);

/// The fused forward and the fused backward of `op` on `q`, `k`, `v` (`Inputs::qkv`) and
/// `d_o`, each timed as [`gpu_attention`] is: the plain fused forward (no weights), and
/// [`crate::Saved::backward`] on a forward saved once (dO's upload, the three backward
/// kernels, the gradients' readback).
///
/// # Errors
/// Whatever the forward or the backward returns.
pub fn gpu_forward_backward(
    ctx: &Context,
    op: &Attention,
    [q, k, v, d_o]: [ndarray::ArrayView4<'_, f32>; 4],
    warmup: usize,
    repeats: usize,
) -> Result<[Timed; 2]> {
    let op = op.return_weights(false);
    let forward = profiled(ctx, warmup, repeats, || {
        op.run(ctx, crate::Inputs::qkv(q, k, v))?;
        Ok(ctx.kernel_times())
    })?;
    let saved = op
        .save_for_backward(true)
        .run(ctx, crate::Inputs::qkv(q, k, v))?
        .saved
        .ok_or_else(|| crate::Error::invalid("saved forward", "nothing saved"))?;
    let backward = profiled(ctx, warmup, repeats, || {
        saved.backward(ctx, d_o)?;
        Ok(ctx.kernel_times())
    })?;
    Ok([forward, backward])
}

/// The fused forward of `op` on `q`, `k`, `v` (`Inputs::qkv`) under `mask`, timed as
/// [`gpu_attention`] is (with modifiers, their block maps are made in the warm-up).
///
/// # Errors
/// Whatever the forward pass returns.
pub fn gpu_masked(
    ctx: &Context,
    op: &Attention,
    [q, k, v]: [ndarray::ArrayView4<'_, f32>; 3],
    mask: &crate::Mask<'_>,
    warmup: usize,
    repeats: usize,
) -> Result<Timed> {
    let op = op.return_weights(false);
    profiled(ctx, warmup, repeats, || {
        op.run(ctx, crate::Inputs::qkv(q, k, v).mask(mask))?;
        Ok(ctx.kernel_times())
    })
}

/// Times any GPU work `run` as [`gpu_attention`] is: the wall-clock statistics, and the
/// kernels' median times of what `run` dispatched when profiling is on (`run` returns
/// [`Context::kernel_times`] after its work).
///
/// # Errors
/// Whatever `run` returns.
pub fn timed(
    ctx: &Context,
    warmup: usize,
    repeats: usize,
    run: impl FnMut() -> Result<Vec<KernelTime>>,
) -> Result<Timed> {
    profiled(ctx, warmup, repeats, run)
}

/// Times `run` with profiling off (the headline figure: nothing serialized or added), then
/// runs it `repeats` more times with profiling on for the per-kernel medians.
fn profiled(
    ctx: &Context,
    warmup: usize,
    repeats: usize,
    mut run: impl FnMut() -> Result<Vec<KernelTime>>,
) -> Result<(Stats, Vec<(String, f64)>)> {
    let mode = ctx.profiling();
    ctx.set_profiling(false);
    let timed = measure(warmup, repeats, &mut run);
    ctx.set_profiling(mode != Profiling::Off);
    let (stats, _) = timed?;
    let runs = if mode == Profiling::Off {
        Vec::new()
    } else {
        measure(0, repeats, run)?.1
    };
    Ok((stats, kernel_medians(&runs)))
}

/// The kernel families to benchmark for `choice` on `ctx` (`None`: every family it has;
/// [`Kernels::Auto`]: the one it resolves to for `dims`).
///
/// # Errors
/// As [`Attention::plan`].
pub fn families(ctx: &Context, choice: Option<Kernels>, dims: &Dims) -> Result<Vec<Kernels>> {
    match choice {
        Some(k) => Ok(vec![Attention::new().kernels(k).plan(ctx, dims)?.family()]),
        None => Ok(Kernels::available(ctx)),
    }
}

/// The CPU's model name (from `/proc/cpuinfo` where there is one) and its thread count.
pub fn cpu_name() -> String {
    format!("{}, {} threads", cpu_model(), cpu_threads())
}

/// The CPU's model name from `/proc/cpuinfo`, else the architecture's name.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The threads this process may run at once.
pub fn cpu_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Rejects benchmark sizes that are empty.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the flag.
pub fn check_sizes(what: &str, sizes: &[usize]) -> Result<()> {
    if sizes.is_empty() || sizes.contains(&0) {
        return Err(Error::invalid(
            what,
            format!("sizes must be at least 1, got {sizes:?}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_f32_attention_matches_the_f64_reference() {
        let x = Array3::from_shape_fn((2, 300, 8), |(b, i, j)| {
            ((b * 7 + i * 3 + j) as f32 * 0.37).sin()
        });
        for causal in [false, true] {
            let op = Attention::new().heads(2).causal(causal);
            let r = crate::reference::run(&op, &crate::Inputs::x(&x)).unwrap();
            let c = cpu_attention_f32(x.view(), 2, causal).into_dyn();
            let (rel, _) = crate::reference::compare(&c, &r.context);
            assert!(rel < 1e-5, "causal={causal}: rel {rel}");
        }
    }
}
