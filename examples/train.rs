//! Training one attention layer with Adam: the student learns W_Q, W_K, W_V and W_O so that
//! its output matches a fixed teacher layer's on random causal sequences, a task that needs
//! the attention pattern (the teacher's weights are sharp, so copying X is not enough). The
//! forward and the backward run on the GPU (`forward_saved`, `LayerSaved::backward`: the
//! fused kernels and the matmuls, nothing read back in between); Adam updates the 4 KB of
//! weights on the host. The loss must fall at least 10×, and the learned attention map is
//! drawn beside the teacher's.
//!
//! ```text
//! cargo run --release --example train -- [--steps 300] [--out train.png]
//! ```

use ndarray::{Array2, Array3, Axis};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use wgpu_attention::{plot, Attention, Context, Mask, Projections, Result};

const D: usize = 16;
const HEADS: usize = 2;
const N: usize = 10;
const BATCH: usize = 16;

fn normal(rng: &mut ChaCha8Rng, shape: (usize, usize), scale: f32) -> Array2<f32> {
    Array2::from_shape_simple_fn(shape, || {
        let z: f32 = StandardNormal.sample(rng);
        z * scale
    })
}

/// Adam's state for one parameter.
struct Adam {
    m: Array2<f32>,
    v: Array2<f32>,
}

impl Adam {
    fn new(shape: (usize, usize)) -> Self {
        Adam {
            m: Array2::zeros(shape),
            v: Array2::zeros(shape),
        }
    }

    /// One step on `w` with gradient `g` at step `t` (from 1).
    fn step(&mut self, w: &mut Array2<f32>, g: &Array2<f32>, t: i32, lr: f32) {
        let (b1, b2, eps) = (0.9f32, 0.999f32, 1e-8f32);
        self.m = &self.m * b1 + g * (1.0 - b1);
        self.v = &self.v * b2 + &(g * g) * (1.0 - b2);
        let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
        ndarray::Zip::from(w)
            .and(&self.m)
            .and(&self.v)
            .for_each(|w, &m, &v| *w -= lr * (m / c1) / ((v / c2).sqrt() + eps));
    }
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
    let mut student = [0, 1, 2, 3].map(|_| normal(&mut rng, (D, D), 0.1));
    let mut adam = [0, 1, 2, 3].map(|_| Adam::new((D, D)));
    let mut first = None;
    let mut loss = f32::NAN;
    for t in 1..=steps {
        let x = Array3::from_shape_simple_fn((BATCH, N, D), || StandardNormal.sample(&mut rng));
        let target = op.forward(&ctx, &x, Some(&proj(&teacher)))?.context;
        // Forward and backward on the GPU: the saved forward keeps what the backward needs.
        let (y, saved) = op.forward_saved(&ctx, &x, Some(&proj(&student)), &Mask::none())?;
        let y = y.context;
        // Mean squared error and its gradient with respect to the output.
        let diff = &y - &target;
        loss = diff.mapv(|v| v * v).mean().unwrap_or(f32::NAN);
        first.get_or_insert(loss);
        let d_out = diff * (2.0 / y.len() as f32);
        let g = saved.backward(&ctx, &d_out)?;
        let grads = [g.w_q, g.w_k, g.w_v, g.w_o].map(Option::unwrap_or_default);
        for ((w, g), a) in student.iter_mut().zip(&grads).zip(&mut adam) {
            a.step(w, g, t as i32, 1e-2);
        }
        if t == 1 || t % 50 == 0 {
            println!("step {t:>4}  loss {loss:.5}");
        }
    }
    let first = first.unwrap_or(f32::NAN);
    println!("loss fell {:.1}× ({first:.5} → {loss:.5})", first / loss);

    // The attention maps of one sequence, teacher above, student below.
    let x = Array3::from_shape_simple_fn((1, N, D), || StandardNormal.sample(&mut rng));
    let maps = [&teacher, &student].map(|w| -> Result<_> {
        Ok(op
            .forward(&ctx, &x, Some(&proj(w)))?
            .weights
            .unwrap_or_default())
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
