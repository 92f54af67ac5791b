//! Training one attention layer with Adam, on the GPU end to end: the student learns W_Q,
//! W_K, W_V and W_O so that its output matches a fixed teacher layer's on random causal
//! sequences, a task that needs the attention pattern (the teacher's weights are sharp, so
//! copying X is not enough).
//!
//! The data (32 batches of X) go up once, the teacher's outputs are computed on the device
//! once, and every step is one [`Recorder`] and one submit: the student's saved forward, the
//! MSE loss and its gradient (`mse.wgsl`), the backward (the fused kernels and the matmuls),
//! and Adam on the weights in place (`adam.wgsl`). Nothing comes back to the host but the
//! loss, read at the reporting steps. The loss must fall at least 10×, and the learned
//! attention map is drawn beside the teacher's.
//!
//! ```text
//! cargo run --release --example train -- [--steps 300] [--out train.png]
//! ```

use std::time::Instant;

use ndarray::{Array2, Array3, Axis};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use wgpu_attention::{
    plot, Adam, Attention, Context, Dtype, Inputs, Layer, MseLoss, Projections, Recorder, Result,
    Tensor,
};

const D: usize = 16;
const HEADS: usize = 2;
const N: usize = 10;
const BATCH: usize = 16;
/// Batches of X uploaded once and cycled through.
const BATCHES: usize = 32;
/// The loss is read back at these steps only.
const REPORT: usize = 50;

fn normal(rng: &mut ChaCha8Rng, shape: (usize, usize), scale: f32) -> Array2<f32> {
    Array2::from_shape_simple_fn(shape, || {
        let z: f32 = StandardNormal.sample(rng);
        z * scale
    })
}

fn proj(w: &[Array2<f32>; 4]) -> Projections<'_> {
    Projections::new(w[0].view(), w[1].view(), w[2].view()).with_output(w[3].view(), None)
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut steps, mut out) = (300usize, String::from("train.png"));
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--steps", Some(v)) => steps = v.parse().unwrap_or(steps),
            ("--out", Some(v)) => out = v,
            _ => {
                eprintln!("usage: train [--steps N] [--out FILE.png]");
                std::process::exit(2);
            }
        }
    }
    let ctx = Context::new()?;
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let op = Attention::new().heads(HEADS).causal(true);
    // The teacher's query and key weights are large, so its attention is sharp.
    let teacher = [
        normal(&mut rng, (D, D), 1.0),
        normal(&mut rng, (D, D), 1.0),
        normal(&mut rng, (D, D), 0.5),
        normal(&mut rng, (D, D), 0.5),
    ];
    let init = [0, 1, 2, 3].map(|_| normal(&mut rng, (D, D), 0.1));
    let teacher_layer = Layer::new(&ctx, op, &proj(&teacher))?;
    // The student keeps what its backward needs at each forward.
    let mut student = Layer::new(&ctx, op.save_for_backward(true), &proj(&init))?;
    // The data set, uploaded once, and the teacher's outputs, computed on the device.
    let mut data = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        let x = Array3::from_shape_simple_fn((BATCH, N, D), || StandardNormal.sample(&mut rng));
        let x = Tensor::from_array(&ctx, x.view().into_dyn(), Dtype::F32)?;
        let target = teacher_layer.run(&ctx, Inputs::x(&x))?.context;
        data.push((x, target));
    }
    let mut adam = Adam::new(1e-2);
    let mut first = None;
    let mut loss = f32::NAN;
    let start = Instant::now();
    for t in 1..=steps {
        let (x, target) = &data[(t - 1) % BATCHES];
        let mut rec = Recorder::new(&ctx);
        let y = student.record(&mut rec, Inputs::x(x))?;
        let saved = y
            .saved
            .as_ref()
            .ok_or_else(|| wgpu_attention::Error::invalid("student", "nothing saved"))?;
        let mse = MseLoss::record(&mut rec, &y.context, target)?;
        let grads = saved.record_backward(&mut rec, &mse.grad)?;
        student.record_update(&mut rec, &mut adam, &grads)?;
        rec.submit()?;
        if t == 1 || t % REPORT == 0 || t == steps {
            loss = mse.value(&ctx)?; // the only readback: a few floats
            first.get_or_insert(loss);
            println!("step {t:>4}  loss {loss:.5}");
        }
    }
    ctx.synchronize()?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{steps} steps in {secs:.2} s: {:.1} steps/s (forward, loss, backward and Adam on the \
         device, one submit a step)",
        steps as f64 / secs
    );
    let first = first.unwrap_or(f32::NAN);
    println!("loss fell {:.1}× ({first:.5} → {loss:.5})", first / loss);

    // The attention maps of one new sequence, teacher above, student below.
    student.sync_host(&ctx)?;
    let x = Array3::from_shape_simple_fn((1, N, D), || StandardNormal.sample(&mut rng));
    // A saved forward returns no weights: the student's trained weights (read back above)
    // in a layer that does not save.
    let trained = Layer::new(&ctx, op, &student.projections())?;
    let maps = [&teacher_layer, &trained].map(|layer| -> Result<_> {
        Ok(layer.run(&ctx, Inputs::x(&x))?.weights.unwrap_or_default())
    });
    let [t_map, s_map] = maps;
    let both = ndarray::concatenate(Axis(0), &[t_map?.view(), s_map?.view()])
        .map_err(|e| wgpu_attention::Error::shape(e.to_string()))?;
    // (2 · heads, n, n): the teacher's heads, then the student's.
    let both = both
        .into_shape_with_order((2 * HEADS, N, N))
        .map_err(|e| wgpu_attention::Error::shape(e.to_string()))?;
    plot::heatmap(
        std::path::Path::new(&out),
        both.view().into_dyn(),
        2 * HEADS,
        None,
        "attention: teacher heads 1-2, learned heads 3-4",
    )?;
    println!("wrote {out}");
    if first / loss < 10.0 {
        eprintln!("error: the loss fell less than 10×");
        std::process::exit(1);
    }
    Ok(())
}
