//! `wgpu-attention bench --model`: a small model's loop timed three ways in one run. Two
//! causal attention layers (W_Q, W_K, W_V, W_O each d × d) over `batch × n` tokens, called
//! `calls` times: through the array API (every call uploads X and every weight, and reads
//! the first layer's output back before the second), with resident layers and tensors (the
//! weights uploaded once; per call X goes up, both layers run in one submit, the output comes
//! back), and on the CPU (ndarray, one thread).

use ndarray::{Array2, Array3};
use wgpu_attention::bench::{self, Stats};
use wgpu_attention::{reference, Attention, Context, Dtype, Layer, Projections, Recorder};
use wgpu_attention::{Error, Inputs, Result, Tensor};

/// The workload's sizes.
pub struct Model {
    pub batch: usize,
    pub n: usize,
    pub d: usize,
    pub heads: usize,
    pub calls: usize,
    pub warmup: usize,
}

fn weight(d: usize, salt: usize) -> Array2<f32> {
    let s = 1.0 / (d as f32).sqrt();
    Array2::from_shape_fn((d, d), |(i, j)| {
        (((i * 31 + j * 17 + salt * 7) % 97) as f32 / 48.0 - 1.0) * s
    })
}

/// Runs the three ways and prints the table; the GPU results are checked against each other
/// and the CPU's first.
///
/// # Errors
/// GPU errors, and results of the two GPU ways that disagree.
pub fn run(ctx: &Context, m: &Model) -> Result<()> {
    let Model {
        batch,
        n,
        d,
        heads,
        calls,
        warmup,
    } = *m;
    let ws: Vec<[Array2<f32>; 4]> = (0..2)
        .map(|l| [0, 1, 2, 3].map(|i| weight(d, l * 4 + i)))
        .collect();
    let projections: Vec<Projections<'_>> = ws
        .iter()
        .map(|[q, k, v, o]| {
            Projections::new(q.view(), k.view(), v.view()).with_output(o.view(), None)
        })
        .collect();
    let op = Attention::new()
        .heads(heads)
        .causal(true)
        .return_weights(false);
    let x = Array3::from_shape_fn((batch, n, d), |(b, i, j)| {
        ((b * 13 + i * 7 + j * 3) as f32 * 0.01).sin()
    });

    let array_way = || -> Result<Array3<f32>> {
        let h = op.run(ctx, Inputs::x(&x).projections(&projections[0]))?;
        let y = op.run(ctx, Inputs::x(&h.context).projections(&projections[1]))?;
        y.context
            .into_dimensionality()
            .map_err(|e| Error::shape(e.to_string()))
    };
    let layers = projections
        .iter()
        .map(|p| Layer::new(ctx, op, p))
        .collect::<Result<Vec<_>>>()?;
    let resident_way = || -> Result<Array3<f32>> {
        let xt = Tensor::from_array(ctx, x.view().into_dyn(), Dtype::F32)?;
        let mut rec = Recorder::new(ctx);
        let h = layers[0].record(&mut rec, Inputs::x(&xt))?.context;
        let y = layers[1].record(&mut rec, Inputs::x(&h))?.context;
        rec.submit()?;
        y.to_array(ctx)?
            .into_dimensionality()
            .map_err(|e| Error::shape(e.to_string()))
    };
    let cpu_way = || -> Result<Array3<f32>> {
        let mut h = x.clone();
        for w in &ws {
            let [q, k, v, o] = w;
            h = bench::cpu_layer_f32(h.view(), [q, k, v, o], heads, true);
        }
        Ok(h)
    };

    // The same answer three ways first.
    let (a, r, c) = (array_way()?, resident_way()?, cpu_way()?);
    if a != r {
        return Err(Error::invalid(
            "bench --model",
            "the resident way's output differs from the array API's",
        ));
    }
    let (rel, _) = reference::compare(&a.into_dyn(), &c.mapv(f64::from).into_dyn());

    // Flops per call: per layer, four d × d projections and the attention (causal counted
    // whole, as the other benchmarks count it).
    let per_layer = 2.0 * 4.0 * (batch * n * d * d) as f64 + 4.0 * (batch * n * n * d) as f64;
    let flop = 2.0 * per_layer;
    println!(
        "model: 2 causal layers (W_Q, W_K, W_V, W_O {d}×{d}), {heads} heads, batch {batch} × {n} \
         tokens, median of {calls} calls after {warmup} warm-up; GPU vs CPU relative difference \
         {rel:.1e}"
    );
    println!(
        "{:<44} {:>10} {:>10} {:>9}",
        "way", "ms/call", "GFLOP/s", "speed-up"
    );
    let time = |f: &dyn Fn() -> Result<Array3<f32>>| -> Result<Stats> {
        Ok(bench::measure(warmup, calls, f)?.0)
    };
    let array = time(&array_way)?;

    let rows = [
        ("array API (uploads every weight each call)", array),
        (
            "resident layers + tensors (one submit)",
            time(&resident_way)?,
        ),
        ("CPU f32 ndarray, one thread", time(&cpu_way)?),
    ];
    for (name, stats) in rows {
        println!(
            "{name:<44} {:>10.2} {:>10.1} {:>8.2}×",
            stats.median_ms,
            flop / stats.median_ms / 1e6,
            array.median_ms / stats.median_ms
        );
    }
    Ok(())
}
