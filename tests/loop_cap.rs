//! Long calls on the default adapter: lavapipe (Mesa's llvmpipe) stops an invocation's loops
//! past 65,535 iterations in all and gives a wrong answer without a word
//! (`src/kernels/loops.rs`). Every forward path, forced and automatic, with and without the
//! weights, over key sequences whose loops would cross that cap, is right or refused with an
//! error that says why, never silently wrong; the fused pass (context alone) is always right.
//! On another adapter the same calls must simply be right.

mod common;

use ndarray::Array4;
use wgpu_attention::internals::FlashVariant;
use wgpu_attention::{reference, Attention, Error, Inputs, Kernels, Options};

/// Values in [-2, 2] from a small linear congruential generator: keys unlike their
/// neighbours, so a key range left out changes the answer (smooth keys could hide it).
fn noise(shape: (usize, usize, usize, usize), seed: u64) -> Array4<f32> {
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    Array4::from_shape_simple_fn(shape, || {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((x >> 33) as f32 / (1u64 << 31) as f32) * 4.0 - 2.0
    })
}

/// `op` on (L, S, d) against the f64 reference: `Ok(rel)` or the error's message.
fn run(op: &Attention, (l, s, d): (usize, usize, usize)) -> Result<f64, String> {
    let q = noise((1, 1, l, d), 1);
    let k = noise((1, 1, s, d), 2);
    let v = noise((1, 1, s, d), 3);
    let inputs = Inputs::qkv(&q, &k, &v);
    let got = op.run(common::ctx(), inputs.clone());
    let got = match got {
        Ok(got) => got,
        Err(e) => return Err(e.to_string()),
    };
    let want = reference::run(op, &inputs).unwrap();
    let (rel, _) = reference::compare(&got.context, &want.context);
    let wrel = match (&got.weights, &want.weights) {
        (Some(w), Some(r)) => reference::compare(w, r).0,
        _ => 0.0,
    };
    Ok(rel.max(wrel))
}

fn op(kernels: Kernels, weights: bool, flash: Option<FlashVariant>) -> Attention {
    Attention::new()
        .options(
            Options::default()
                .kernels(kernels)
                .nan_fill(true)
                .flash_variant(flash),
        )
        .return_weights(weights)
}

#[test]
fn long_key_sequences_are_right_or_refused_on_every_path() {
    let capped = common::ctx().adapter_info().name.contains("llvmpipe");
    let mut failures = Vec::new();
    // A few queries against 60,000 keys (flash_tiled crossed the cap at 24,672 keys with
    // 32-key tiles), one against 70,000 (past the textures' 16,384 texels for the subgroup
    // matmul) and 16 against 250,000 at d 32.
    let sizes = [(4, 60_000, 64), (1, 70_000, 64), (16, 250_000, 32)];
    let families = [Kernels::Auto, Kernels::Storage, Kernels::Subgroup];
    for size in sizes {
        for kernels in families {
            for weights in [false, true] {
                let label = format!("{size:?} {kernels:?} weights={weights}");
                match run(&op(kernels, weights, None), size) {
                    Ok(rel) if rel < 1e-4 => {}
                    Ok(rel) => failures.push(format!("{label}: WRONG, rel {rel:e}")),
                    // The context alone always has a way that fits.
                    Err(e) if !weights && kernels != Kernels::Subgroup => {
                        failures.push(format!("{label}: refused the fused pass: {e}"));
                    }
                    Err(e) if !capped && !e.contains("max_texture_dimension_2d") => {
                        failures.push(format!("{label}: refused off llvmpipe: {e}"));
                    }
                    Err(e) if !(e.contains("loop iterations") || e.contains("texture")) => {
                        failures.push(format!("{label}: refused without saying why: {e}"));
                    }
                    Err(_) => {}
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_fused_kernel_forced_over_long_keys_is_right() {
    // Each fused variant of the storage family, forced, at the largest head width and past
    // the cap: flash_tiled falls back to flash_blocked with its keys split, flash_blocked
    // splits them itself.
    let mut failures = Vec::new();
    for (flash, size) in [
        (FlashVariant::Tiled { keys: 32 }, (4, 40_000, 64)),
        (FlashVariant::Tiled { keys: 16 }, (2, 30_000, 256)),
        (
            FlashVariant::Blocked { rows: 64, keys: 32 },
            (70, 90_000, 32),
        ),
    ] {
        match run(&op(Kernels::Storage, false, Some(flash)), size) {
            Ok(rel) if rel < 1e-4 => {}
            other => failures.push(format!("{flash} {size:?}: {other:?}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_weights_past_the_cap_are_refused_with_advice_that_works() {
    if !common::ctx().adapter_info().name.contains("llvmpipe") {
        return; // No cap: tested right above.
    }
    let size = (4, 70_000, 64);
    let err = run(&op(Kernels::Storage, true, None), size).unwrap_err();
    assert!(
        err.contains("loop iterations") && err.contains("context"),
        "{err}"
    );
    // The advice: the context alone.
    assert!(run(&op(Kernels::Storage, false, None), size).unwrap() < 1e-4);
    // The error is the crate's, typed.
    let q = noise((1, 1, 4, 64), 1);
    let k = noise((1, 1, 70_000, 64), 2);
    let e = op(Kernels::Storage, true, None)
        .run(common::ctx(), Inputs::qkv(&q, &k, &k))
        .unwrap_err();
    assert!(matches!(e, Error::LimitExceeded { .. }), "{e}");
}
