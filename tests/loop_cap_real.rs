//! That lavapipe's loop cap is real and that `flash_tiled`'s bound sits on it: with the
//! crate's guard off (`WGPU_ATTENTION_LOOP_CAP=off`), `flash_tiled` with 32-key tiles at d 64
//! is right over 24,600 keys and wrong over 25,000 on llvmpipe (its bound allows 24,640: 85
//! counted iterations per tile, `src/kernels/loops.rs`); with the guard on, both are right.
//! Its own binary: the variable is read when a device opens.

mod common;

use ndarray::Array4;
use wgpu_attention::internals::FlashVariant;
use wgpu_attention::{reference, Attention, Context, Inputs, Kernels, Options};

fn rel_error(ctx: &Context, s: usize) -> f64 {
    // Values in [-1, 1] from a linear congruential generator: logits of about 0.3, so every
    // key weighs about as much as another and the keys a stopped loop leaves out show.
    let wave = |n: usize, seed: u64| {
        let mut x = seed;
        Array4::from_shape_simple_fn((1, 1, n, 64), || {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((x >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        })
    };
    let (q, k, v) = (wave(4, 1), wave(s, 2), wave(s, 3));
    let op = Attention::new()
        .options(
            Options::default()
                .kernels(Kernels::Storage)
                .nan_fill(true)
                .flash_variant(FlashVariant::Tiled { keys: 32 }),
        )
        .return_weights(false);
    let inputs = Inputs::qkv(&q, &k, &v);
    let got = op.run(ctx, inputs.clone()).unwrap();
    let want = reference::run(&op, &inputs).unwrap();
    reference::compare(&got.context, &want.context).0
}

#[test]
fn the_cap_is_real_and_the_bound_sits_on_it() {
    common::isolate();
    std::env::set_var("WGPU_ATTENTION_LOOP_CAP", "off");
    let off = Context::new().unwrap().with_tuning(false);
    std::env::remove_var("WGPU_ATTENTION_LOOP_CAP");
    let on = Context::new().unwrap().with_tuning(false);
    let llvmpipe = on.adapter_info().name.contains("llvmpipe");
    assert!(rel_error(&off, 24_600) < 1e-4);
    let past = rel_error(&off, 25_000);
    if llvmpipe {
        assert!(
            past > 1e-2,
            "unguarded flash_tiled past the cap was right: {past:e}"
        );
    } else {
        assert!(past < 1e-4, "{past:e}");
    }
    for s in [24_600, 25_000] {
        let rel = rel_error(&on, s);
        assert!(rel < 1e-4, "guarded, {s} keys: rel {rel:e}");
    }
}
