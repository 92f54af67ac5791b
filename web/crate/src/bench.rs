//! The page's benchmark: one size at a time, WebGPU against the CPU f32 path compiled to
//! wasm (ndarray, one thread), wall-clock medians from `performance.now()`.

use ndarray::{s, Array2, ArrayView2, Axis};
use serde::Serialize;
use wasm_bindgen::JsError;
use web_time::Instant;
use wgpu_attention::{
    bench::cpu_attention_f32, ndarray, Attention, Context, Dims, Inputs, Projections,
};

use crate::{js, json};

/// Embedding width of both benchmarks.
const D: usize = 64;
/// Heads of the projected layer.
const HEADS: usize = 4;

#[derive(Serialize)]
struct Point {
    kind: String,
    n: usize,
    flop: f64,
    gpu_ms: f64,
    cpu_ms: f64,
    gpu_gflops: f64,
    cpu_gflops: f64,
    max_abs_diff: f64,
}

/// A deterministic `(rows, cols)` matrix of values in [-1, 1).
fn filled(rows: usize, cols: usize, salt: usize) -> Array2<f32> {
    Array2::from_shape_fn((rows, cols), |(i, j)| {
        (((i * 31 + j * 7 + salt * 13) % 23) as f32 / 23.0 - 0.5) * 2.0
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Runs benchmark `kind` at `n` and returns its [`Point`] as JSON.
pub(crate) async fn point(
    ctx: &Context,
    kind: &str,
    n: usize,
    repeats: usize,
) -> Result<String, JsError> {
    if n == 0 {
        return Err(JsError::new("n must be at least 1"));
    }
    let x = filled(n, D, 0);
    let (wq, wk, wv, wo) = (
        filled(D, D, 1) * 0.125,
        filled(D, D, 2) * 0.125,
        filled(D, D, 3) * 0.125,
        filled(D, D, 4) * 0.125,
    );
    let (op, proj, flop) = match kind {
        "attention" => {
            let op = Attention::new().return_weights(false);
            let dims = Dims::new(&op, &Inputs::x(&x)).map_err(js)?;
            (op, None, dims.attention_flops())
        }
        "layer" => {
            let op = Attention::new().heads(HEADS).return_weights(false);
            let p = Projections::new(wq.view(), wk.view(), wv.view()).with_output(wo.view(), None);
            let dims = Dims::new(&op, &Inputs::x(&x).projections(&p)).map_err(js)?;
            let out_proj = 2.0 * (n * D * D) as f64;
            let flop = dims.attention_flops() + dims.projection_flops() + out_proj;
            (op, Some(p), flop)
        }
        other => {
            return Err(JsError::new(&format!(
                "unknown benchmark {other:?}: attention or layer"
            )))
        }
    };
    let inputs = Inputs::x(&x).projections(proj.as_ref());
    // One run first: it compiles the kernels.
    let gpu_out = op.run_async(ctx, inputs.clone()).await.map_err(js)?;
    let mut gpu = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let t = Instant::now();
        op.run_async(ctx, inputs.clone()).await.map_err(js)?;
        gpu.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mut cpu = Vec::with_capacity(repeats);
    let mut cpu_out = None;
    for _ in 0..repeats {
        let t = Instant::now();
        let out = match kind {
            "attention" => cpu_attention_f32(x.view().insert_axis(Axis(0)), 1, false)
                .index_axis_move(Axis(0), 0),
            _ => cpu_layer_f32(x.view(), [wq.view(), wk.view(), wv.view(), wo.view()]),
        };
        cpu.push(t.elapsed().as_secs_f64() * 1e3);
        cpu_out = Some(out);
    }
    let max_abs_diff = cpu_out.map_or(f64::NAN, |c| {
        c.iter()
            .zip(gpu_out.context.iter())
            .map(|(a, b)| f64::from((a - b).abs()))
            .fold(0.0, f64::max)
    });
    let (gpu_ms, cpu_ms) = (median(gpu), median(cpu));
    json(&Point {
        kind: kind.to_string(),
        n,
        flop,
        gpu_ms,
        cpu_ms,
        gpu_gflops: flop / (gpu_ms * 1e6),
        cpu_gflops: flop / (cpu_ms * 1e6),
        max_abs_diff,
    })
}

/// The projected layer on the CPU in f32: `X·W_Q`, `X·W_K`, `X·W_V`, attention per head,
/// heads concatenated, times `W_O`.
fn cpu_layer_f32(
    x: ArrayView2<'_, f32>,
    [wq, wk, wv, wo]: [ArrayView2<'_, f32>; 4],
) -> Array2<f32> {
    let (q, k, v) = (x.dot(&wq), x.dot(&wk), x.dot(&wv));
    let n = x.nrows();
    let dh = D / HEADS;
    let scale = 1.0 / (dh as f32).sqrt();
    let mut ctx = Array2::<f32>::zeros((n, D));
    for h in 0..HEADS {
        let cols = s![.., h * dh..(h + 1) * dh];
        let mut scores = q.slice(cols).dot(&k.slice(cols).t());
        for mut row in scores.axis_iter_mut(Axis(0)) {
            let m = row.fold(f32::NEG_INFINITY, |a, &b| a.max(b * scale));
            row.mapv_inplace(|v| (v * scale - m).exp());
            let sum = row.sum();
            row /= sum;
        }
        ctx.slice_mut(cols).assign(&scores.dot(&v.slice(cols)));
    }
    ctx.dot(&wo)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_layer_matches_the_f64_reference() {
        use super::*;
        let x = filled(37, D, 0);
        let w: Vec<Array2<f32>> = (1..=4).map(|s| filled(D, D, s) * 0.125).collect();
        let p =
            Projections::new(w[0].view(), w[1].view(), w[2].view()).with_output(w[3].view(), None);
        let op = Attention::new().heads(HEADS);
        let r = wgpu_attention::reference::run(&op, &Inputs::x(&x).projections(&p)).unwrap();
        let c = cpu_layer_f32(
            x.view(),
            [w[0].view(), w[1].view(), w[2].view(), w[3].view()],
        );
        let (rel, _) = wgpu_attention::reference::compare(&c.into_dyn(), &r.context);
        assert!(rel < 1e-5, "rel {rel}");
    }
}
