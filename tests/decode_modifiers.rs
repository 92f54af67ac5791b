//! Score and mask modifiers in the KV-cache decode: a prefill and one-token steps
//! through the cache, with each preset (and a caller's WGSL), give row for row the causal
//! forward over all the tokens with the same modifiers (the f64 reference). A window preset's
//! steps leave the keys before its reach out of their blocks: forced small blocks show that
//! nothing it needs is left out. A rolling cache of the window's size gives the same rows.

mod common;

use ndarray::{s, Array4, ArrayView4, Axis};
use wgpu_attention::modifiers::{Modifiers, Preset};
use wgpu_attention::{reference, Attention, Decoder, Inputs, KvCache, KvCacheSpec, Mask};

/// Q `(b, h, n, e)`, K and V `(b, kvh, n, e)`.
fn qkv(b: usize, h: usize, kvh: usize, n: usize, e: usize) -> [Array4<f32>; 3] {
    let f = |salt: usize| {
        move |(i, j, k, m): (usize, usize, usize, usize)| {
            (((i * 31 + j * 17 + k * 7 + m * 3) * (salt + 2) + salt) as f32 * 0.0137).sin() * 1.5
        }
    };
    [
        Array4::from_shape_fn((b, h, n, e), f(1)),
        Array4::from_shape_fn((b, kvh, n, e), f(2)),
        Array4::from_shape_fn((b, kvh, n, e), f(3)),
    ]
}

/// The outputs of a prefill of `prefill` tokens, then one-token steps to the end, through a
/// cache of `capacity` tokens (rolling when it is less than the sequence).
fn through_cache(
    dec: &Decoder,
    [q, k, v]: &[Array4<f32>; 3],
    prefill: usize,
    capacity: Option<usize>,
) -> Array4<f32> {
    let ctx = common::ctx();
    let (b, _, n, e) = q.dim();
    let spec = KvCacheSpec::new(capacity.unwrap_or(n), b, k.dim().1, e, e);
    let mut cache = KvCache::new(ctx, spec).unwrap();
    if capacity.is_some() {
        cache = cache.rolling();
    }
    let mut outs = Vec::new();
    let mut at = 0;
    for m in std::iter::once(prefill).chain(std::iter::repeat_n(1, n - prefill)) {
        let r = s![.., .., at..at + m, ..];
        cache.append(ctx, k.slice(r), v.slice(r)).unwrap();
        outs.push(dec.step(ctx, &cache, q.slice(r)).unwrap());
        at += m;
    }
    let views: Vec<ArrayView4<'_, f32>> = outs.iter().map(|o| o.view()).collect();
    ndarray::concatenate(Axis(2), &views).unwrap()
}

/// The causal forward over all the tokens with `mods` (presets), in f64.
fn causal_reference([q, k, v]: &[Array4<f32>; 3], mods: &Modifiers) -> ndarray::ArrayD<f64> {
    let mask = Mask::none().with_modifiers(mods);
    reference::run(
        &Attention::new().causal(true),
        &Inputs::qkv(q, k, v).mask(&mask),
    )
    .unwrap()
    .context
}

/// Decoders with `mods`: key blocks chosen per step, and of 64 keys (so that a window's
/// steps start past the first blocks).
fn decoders(mods: &Modifiers) -> [(Option<usize>, Decoder); 2] {
    let dec = Decoder::new().nan_fill(true).modifiers(mods);
    [(None, dec.clone()), (Some(64), dec.block(64))]
}

#[test]
fn every_preset_through_the_cache_equals_the_causal_forward() {
    let (b, h, kvh, n, e) = (2, 4, 2, 150, 8);
    let data = qkv(b, h, kvh, n, e);
    let ids: Vec<i32> = (0..b * n)
        .map(|p| ((p % n) / (23 + 11 * (p / n))) as i32)
        .collect();
    let cases = [
        (
            "window 40",
            Modifiers::new().preset(Preset::Window { left: 40, right: 0 }),
        ),
        ("softcap", Modifiers::new().preset(Preset::Softcap(1.2))),
        (
            "alibi",
            Modifiers::new().preset(Preset::Alibi(Preset::alibi_slopes(h))),
        ),
        (
            "documents",
            Modifiers::new().preset(Preset::Documents { ids, n: n as u32 }),
        ),
        (
            "a caller's window 7 and softcap",
            Modifiers::new()
                .mask_mod(
                    "w.wgsl",
                    "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {\n    \
                     return kv + 7u >= q;\n}\n",
                )
                .mask_mod_cpu(|_b, _h, q, kv| kv + 7 >= q)
                .preset(Preset::Softcap(2.0)),
        ),
    ];
    let mut failures = Vec::new();
    for (name, mods) in &cases {
        // The reference applies the caller's window in its CPU form, at the whole sequence's
        // positions.
        let want = causal_reference(&data, mods);
        for (block, dec) in decoders(mods) {
            let got = through_cache(&dec, &data, 97, None);
            let (rel, _) = reference::compare(&got.into_dyn(), &want);
            if rel > 1e-5 {
                failures.push(format!("{name}, block {block:?}: {rel:.2e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_rolling_cache_holds_the_window_alone_and_gives_the_same_rows() {
    // 150 tokens through a cache of 60 (a window of 41 keys: m + left = 41 ≤ 60), its rows
    // wrapping twice; the same as the causal forward with the window over all the tokens.
    let (b, h, kvh, n, e) = (2, 4, 2, 150, 8);
    let data = qkv(b, h, kvh, n, e);
    let [q, k, v] = &data;
    let window = Modifiers::new().preset(Preset::Window { left: 40, right: 0 });
    let want = causal_reference(&data, &window);
    for (block, dec) in decoders(&window) {
        let got = through_cache(&dec, &data, 50, Some(60));
        let (rel, _) = reference::compare(&got.into_dyn(), &want);
        assert!(rel < 1e-5, "block {block:?}: {rel:.2e}");
    }
    // A step that reaches past what the cache holds is an error, not old keys' replacements.
    let ctx = common::ctx();
    let spec = KvCacheSpec::new(60, b, kvh, e, e);
    let mut cache = KvCache::new(ctx, spec).unwrap().rolling();
    for at in [0, 50] {
        let r = s![.., .., at..at + 50, ..];
        cache.append(ctx, k.slice(r), v.slice(r)).unwrap();
    }
    assert_eq!(cache.len(), 100);
    let one = q.slice(s![.., .., 99..100, ..]);
    let wide = Modifiers::new().preset(Preset::Window { left: 70, right: 0 });
    for dec in [Decoder::new(), Decoder::new().modifiers(&wide)] {
        let err = dec.step(ctx, &cache, one).unwrap_err().to_string();
        assert!(err.contains("rolling cache"), "{err}");
    }
    Decoder::new()
        .modifiers(&window)
        .step(ctx, &cache, one)
        .unwrap();
}
