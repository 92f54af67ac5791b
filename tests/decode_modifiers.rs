//! Score and mask modifiers in the KV-cache decode (issue 24): a prefill and one-token steps
//! through the cache, with each preset (and a caller's WGSL), give row for row the causal
//! forward over all the tokens with the same modifiers (the f64 reference). A window preset's
//! steps leave the keys before its reach out of their blocks: forced small blocks show that
//! nothing it needs is left out.

mod common;

use ndarray::{s, Array4, ArrayView4, Axis};
use wgpu_attention::modifiers::{Modifiers, Preset};
use wgpu_attention::{reference, Attention, Decoder, Dtype, Inputs, KvCache, KvCacheSpec, Mask};

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

/// The outputs of a prefill of `prefill` tokens, then one-token steps to the end.
fn through_cache(dec: &Decoder, [q, k, v]: &[Array4<f32>; 3], prefill: usize) -> Array4<f32> {
    let ctx = common::ctx();
    let (b, _, n, e) = q.dim();
    let spec = KvCacheSpec {
        capacity: n,
        batch: b,
        kv_heads: k.dim().1,
        d_k: e,
        d_v: e,
        dtype: Dtype::F32,
    };
    let mut cache = KvCache::new(ctx, spec).unwrap();
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

#[test]
fn every_preset_through_the_cache_equals_the_causal_forward() {
    let (b, h, kvh, n, e) = (2, 4, 2, 150, 8);
    let data = qkv(b, h, kvh, n, e);
    let [q, k, v] = &data;
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
                .preset(Preset::Softcap(2.0)),
        ),
    ];
    let mut failures = Vec::new();
    for (name, mods) in &cases {
        // The reference takes presets only: a caller's window 7 is the window preset.
        let same = if mods.has_own_mask_mod() {
            Modifiers::new()
                .preset(Preset::Window { left: 7, right: 0 })
                .preset(Preset::Softcap(2.0))
        } else {
            mods.clone()
        };
        let mask = Mask::none().with_modifiers(&same);
        let want = reference::run(
            &Attention::new().causal(true),
            &Inputs::qkv(q, k, v).mask(&mask),
        )
        .unwrap()
        .context;
        // Blocks of 64 keys: the window's steps start past the first blocks.
        for block in [None, Some(64)] {
            let mut dec = Decoder::new().nan_fill(true).modifiers(mods);
            if let Some(keys) = block {
                dec = dec.block(keys);
            }
            let got = through_cache(&dec, &data, 97);
            let (rel, _) = reference::compare(&got.into_dyn(), &want);
            if rel > 1e-5 {
                failures.push(format!("{name}, block {block:?}: {rel:.2e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
