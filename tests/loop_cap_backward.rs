//! Calls long enough that one invocation's loops would pass lavapipe's loop cap (65,535
//! iterations over all its loops, past which llvmpipe silently stops them): each is right
//! or refused with an error that names the loop iterations, never a wrong answer. The fused
//! backward of a few query rows against 70,000 keys and of 70,000 rows against a few keys
//! (through each fused forward that saves its statistics, the storage one forced: its
//! backward loops over every key or row one at a time), and the KV-cache decode over
//! 70,000 cached keys.

mod common;

use ndarray::{s, Array4};
use wgpu_attention::internals::FlashVariant;
use wgpu_attention::{reference, Attention, Decoder, Inputs, KvCache, KvCacheSpec, Options};

fn arr(shape: (usize, usize, usize, usize), salt: f32) -> Array4<f32> {
    Array4::from_shape_fn(shape, |(a, b, c, d)| {
        ((a * 31 + b * 17 + c * 7 + d) as f32 * salt).sin()
    })
}

/// The saved forward and the backward of Q `(1, 1, l, d)` against `s` keys with `variant`
/// (`None`: chosen): every gradient equal to the reference's, or an error about the loops.
fn backward_right_or_refused(l: usize, s: usize, d: usize, variant: Option<FlashVariant>) {
    let ctx = common::ctx();
    let label = format!("L={l} S={s} d={d} {variant:?}");
    let (q, k, v) = (
        arr((1, 1, l, d), 0.13),
        arr((1, 1, s, d), 0.29),
        arr((1, 1, s, d), 0.41),
    );
    let d_o = arr((1, 1, l, d), 0.07);
    let op = Attention::new().options(Options::default().flash_variant(variant));
    let refused = |e: wgpu_attention::Error| {
        let text = e.to_string();
        assert!(text.contains("loop iterations"), "{label}: {text}");
        eprintln!("{label}: refused: {text}");
    };
    let out = match op.save_for_backward(true).run(ctx, Inputs::qkv(&q, &k, &v)) {
        Ok(out) => out,
        Err(e) => return refused(e),
    };
    let g = match out.saved.unwrap().backward(ctx, d_o.view()) {
        Ok(g) => g,
        Err(e) => return refused(e),
    };
    let inputs = Inputs::qkv(&q, &k, &v);
    let want = reference::backward(&op, &inputs, d_o.view().into_dyn()).unwrap();
    let want_out = reference::run(&op, &inputs).unwrap();
    let (rel, _) = reference::compare(&out.context, &want_out.context);
    assert!(rel < 1e-4, "{label}: output relative error {rel:e}");
    // f32 sums over 70,000 terms, and dQ's cancellation in P·(dP − D) (measured up to
    // 7.5e-4); loops cut short by the cap leave whole rows or keys out (about 1).
    for (name, got, want) in [
        ("dQ", &g.q, &want.q),
        ("dK", &g.k, &want.k),
        ("dV", &g.v, &want.v),
    ] {
        let (rel, max_abs) = reference::compare(got.as_ref().unwrap(), want.as_ref().unwrap());
        eprintln!("{label}: {name} relative error {rel:e}");
        assert!(
            rel < 1e-2,
            "{label}: {name} relative error {rel:e} (max abs {max_abs:e})"
        );
    }
}

#[test]
fn a_backward_of_few_rows_against_70000_keys_is_right_or_refused() {
    for variant in [None, Some(FlashVariant::Tiled { keys: 32 })] {
        backward_right_or_refused(4, 70_000, 16, variant);
    }
}

#[test]
fn a_backward_of_70000_rows_against_few_keys_is_right_or_refused() {
    backward_right_or_refused(70_000, 40, 16, Some(FlashVariant::Tiled { keys: 32 }));
}

#[test]
fn a_decode_step_over_70000_cached_keys_is_right() {
    let ctx = common::ctx();
    let (n, d) = (70_000, 16);
    let (q, k, v) = (
        arr((1, 2, n, d), 0.11),
        arr((1, 1, n, d), 0.23),
        arr((1, 1, n, d), 0.37),
    );
    let spec = KvCacheSpec::new(n, 1, 1, d, d);
    let mut cache = KvCache::new(ctx, spec).unwrap();
    cache.append(ctx, k.view(), v.view()).unwrap();
    // The last token's query of each head sees every key.
    let last = q.slice(s![.., .., n - 1.., ..]);
    let want = reference::run(&Attention::new(), &Inputs::qkv(&last.to_owned(), &k, &v))
        .unwrap()
        .context;
    // The chosen key blocks, and one block of the whole cache.
    for dec in [Decoder::new(), Decoder::new().block(1 << 20)] {
        let got = dec.nan_fill(true).step(ctx, &cache, last).unwrap();
        let (rel, max_abs) = reference::compare(&got.into_dyn(), &want);
        assert!(
            rel < 1e-4,
            "decode: relative error {rel:e} (max abs {max_abs:e})"
        );
    }
}

#[test]
fn a_t5_bias_gradient_over_800_rows_at_d_64_is_right() {
    // The table's gradient sums each diagonal of the score matrix in one invocation, a row
    // at a time: with its q·k and dO·v loops unrolled (the head widths are constants) it
    // counts about one iteration per row, not 131, and 800 rows pass the cap's 500 or so
    // that refused it before.
    use wgpu_attention::modifiers::{Modifiers, Preset};
    use wgpu_attention::{Kernels, Mask};
    let ctx = common::ctx();
    let (n, d) = (800, 64);
    let (q, k, v) = (
        arr((1, 1, n, d), 0.013),
        arr((1, 1, n, d), 0.029),
        arr((1, 1, n, d), 0.041),
    );
    let d_o = arr((1, 1, n, d), 0.07);
    let mods = Modifiers::new().preset(Preset::RelativeBias {
        table: (0..32).map(|i| (i as f32 * 0.37).sin()).collect(),
        buckets: 32,
        max_distance: 128,
        bidirectional: true,
    });
    let mask = Mask::none().with_modifiers(&mods);
    let op = Attention::new()
        .save_for_backward(true)
        .options(Options::default().kernels(Kernels::Storage));
    let inputs = Inputs::qkv(&q, &k, &v).mask(&mask);
    let out = op.run(ctx, inputs).unwrap();
    let g = out.saved.unwrap().backward(ctx, d_o.view()).unwrap();
    let inputs = Inputs::qkv(&q, &k, &v).mask(&mask);
    let want = reference::backward(&op, &inputs, d_o.view().into_dyn()).unwrap();
    let (got, want) = (g.relative_bias.unwrap(), want.relative_bias.unwrap());
    let (rel, max_abs) = reference::compare(&got, &want);
    eprintln!("T5 table gradient over {n} rows: relative error {rel:e}");
    assert!(rel < 1e-3, "relative error {rel:e} (max abs {max_abs:e})");
}
