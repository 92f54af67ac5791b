//! `demo --out DIR`: the demo's weights and context as .npy files (what the browser test
//! compares the page's demo with), equal to the library's own forward pass.

mod common;

use common::{cli, ok};
use wgpu_attention::{demo, npy, Attention, Inputs, Projections};

#[test]
fn demo_out_writes_the_weights_and_context_it_prints() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo");
    ok(&cli(&["demo", "--out", out.to_str().unwrap()]));
    let weights = npy::read(&out.join("weights.npy")).unwrap();
    let context = npy::read(&out.join("context.npy")).unwrap();
    assert_eq!(weights.shape(), [6, 6]);
    assert_eq!(context.shape(), [6, demo::D_V]);
    // The default sentence and seed (42), through the library on the same adapter.
    let inputs = demo::inputs(demo::DEFAULT_SENTENCE, 42).unwrap();
    let proj = Projections::new(inputs.w_q.view(), inputs.w_k.view(), inputs.w_v.view());
    let lib = Attention::new()
        .run(common::ctx(), Inputs::x(&inputs.x).projections(&proj))
        .unwrap();
    let lib = lib.weights.unwrap();
    let max = weights
        .iter()
        .zip(lib.iter())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(max < 1e-6, "max abs diff {max}");
    // Six rows, each summing to 1.
    assert!((weights.sum() - 6.0).abs() < 1e-4, "{}", weights.sum());
}
