//! Seed 003's worked example (PyTorch, d_model = 2, three tokens), reproduced to the four
//! decimals it prints. Its weights are printed already in X·W orientation.

mod common;

use ndarray::{array, Array2};
use wgpu_attention::Context;
use wgpu_attention::{Attention, Inputs, Options, Projections};

fn close(got: &Array2<f32>, want: &Array2<f32>, what: &str) {
    // The seed prints its inputs to 4 decimals too: a weight rounded by up to 5e-5 times
    // |x| up to 4.41 + 2.16 moves Q, K, V by up to 3.3e-4, and the printed outputs are
    // rounded by 5e-5 more. A wrong definition (scale, softmax axis, orientation) moves
    // them by 1e-2 or more.
    for ((i, j), w) in want.indexed_iter() {
        let g = got[[i, j]];
        assert!(
            (g - w).abs() <= 5e-4,
            "{what}[{i},{j}] = {g}, seed prints {w}"
        );
    }
}

/// Runs the op on `x` with the given weights and checks the printed attention weights
/// (`attention_percents`) and context vectors (`attention_scores`).
fn check_against_printout(ctx: &Context, x: &Array2<f32>, w: [&Array2<f32>; 3]) {
    let proj = Projections::new(w[0].view(), w[1].view(), w[2].view());
    let out = Attention::new()
        .options(Options::default().nan_fill(true))
        .run(ctx, Inputs::x(x).projections(&proj))
        .unwrap();
    let weights = out.weights.unwrap().into_dimensionality().unwrap();
    let context = out.context.into_dimensionality().unwrap();
    close(
        &weights,
        &array![
            [0.1403f32, 0.0845, 0.7752],
            [0.0292, 0.0123, 0.9586],
            [0.3715, 0.2413, 0.3872]
        ],
        "attention_percents",
    );
    close(
        &context,
        &array![
            [-0.7802f32, -1.8837],
            [-0.9534, -2.3194],
            [-0.4130, -0.9592]
        ],
        "attention_scores",
    );
}

#[test]
fn seed_003_worked_example_matches_to_printed_decimals() {
    let x = array![[1.16f32, 0.23], [0.57, 1.36], [4.41, -2.16]];
    let w_q = array![[0.5406f32, -0.1657], [0.5869, 0.6496]];
    let w_k = array![[0.6233f32, 0.6146], [-0.5188, 0.1323]];
    let w_v = array![[-0.1549f32, -0.3443], [0.1427, 0.4153]];
    check_against_printout(common::ctx(), &x, [&w_q, &w_k, &w_v]);
}

#[test]
fn seed_003_from_its_printed_q_k_v() {
    // X = I makes Q, K, V exactly the weights, so this feeds the printed Q, K, V (4 decimals)
    // straight into the scores, softmax and weighted sum.
    let q = array![[0.7621f32, -0.0428], [1.1063, 0.7890], [1.1164, -2.1336]];
    let k = array![[0.6038f32, 0.7434], [-0.3502, 0.5303], [3.8695, 2.4246]];
    let v = array![[-0.1469f32, -0.3038], [0.1057, 0.3685], [-0.9914, -2.4152]];
    check_against_printout(common::ctx(), &Array2::eye(3), [&q, &k, &v]);
}
