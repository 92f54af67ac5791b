//! The KV cache and the decode step: a prefill through the cache and one-token steps give,
//! row for row, the causal forward over the same tokens (f64 reference and `Attention::run`);
//! grouped-query heads, odd sizes and lengths, f16 storage, forced key blocks; and every bad
//! append or step is an error that leaves the cache exactly as it was.

mod common;

use ndarray::{s, Array4, ArrayView4, Axis};
use wgpu_attention::half::f16;
use wgpu_attention::{
    reference, Attention, Context, Decoder, Dtype, Error, Inputs, KvCache, KvCacheSpec,
};

/// Deterministic Q `(b, h, n, dk)`, K `(b, kvh, n, dk)`, V `(b, kvh, n, dv)` in [-amp, amp].
fn qkv(
    b: usize,
    h: usize,
    kvh: usize,
    n: usize,
    (dk, dv): (usize, usize),
    amp: f32,
) -> [Array4<f32>; 3] {
    let f = |salt: usize| {
        move |(i, j, k, m): (usize, usize, usize, usize)| {
            (((i * 31 + j * 17 + k * 7 + m * 3) * (salt + 2) + salt) as f32 * 0.0137).sin() * amp
        }
    };
    [
        Array4::from_shape_fn((b, h, n, dk), f(1)),
        Array4::from_shape_fn((b, kvh, n, dk), f(2)),
        Array4::from_shape_fn((b, kvh, n, dv), f(3)),
    ]
}

fn spec(b: usize, kvh: usize, cap: usize, (dk, dv): (usize, usize), dtype: Dtype) -> KvCacheSpec {
    KvCacheSpec::new(cap, b, kvh, dk, dv).dtype(dtype)
}

/// Appends tokens `[from, to)` of K, V and decodes their queries; returns their outputs.
fn feed(
    ctx: &Context,
    cache: &mut KvCache,
    dec: &Decoder,
    [q, k, v]: &[Array4<f32>; 3],
    (from, to): (usize, usize),
) -> Array4<f32> {
    let r = s![.., .., from..to, ..];
    cache.append(ctx, k.slice(r), v.slice(r)).unwrap();
    dec.step(ctx, cache, q.slice(r)).unwrap()
}

/// Prefill `steps[0]` tokens, then steps of the given sizes, through the cache; the outputs
/// of every row, concatenated along the token axis.
fn through_cache(
    dec: &Decoder,
    arrays: &[Array4<f32>; 3],
    kvh: usize,
    steps: &[usize],
) -> Array4<f32> {
    let ctx = common::ctx();
    let [q, _, v] = arrays;
    let (b, _, n, dk) = q.dim();
    let mut cache = KvCache::new(ctx, spec(b, kvh, n, (dk, v.dim().3), Dtype::F32)).unwrap();
    let mut outs = Vec::new();
    let mut at = 0;
    for &m in steps {
        outs.push(feed(ctx, &mut cache, dec, arrays, (at, at + m)));
        at += m;
    }
    assert_eq!(cache.len(), n);
    let views: Vec<ArrayView4<'_, f32>> = outs.iter().map(|o| o.view()).collect();
    ndarray::concatenate(Axis(2), &views).unwrap()
}

fn causal_reference(arrays: &[Array4<f32>; 3]) -> ndarray::ArrayD<f64> {
    let [q, k, v] = arrays;
    let op = Attention::new().causal(true);
    reference::run(&op, &Inputs::qkv(q, k, v)).unwrap().context
}

fn assert_close(got: &Array4<f32>, want: &ndarray::ArrayD<f64>, tol: f64, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    let (rel, max) = reference::compare(&got.clone().into_dyn(), want);
    assert!(rel < tol, "{what}: rel {rel:e}, max abs {max:e}");
}

#[test]
fn prefill_then_one_token_steps_equal_the_causal_forward() {
    let arrays = qkv(2, 4, 4, 40, (16, 16), 1.5);
    let want = causal_reference(&arrays);
    let mut steps = vec![33];
    steps.extend([1; 7]);
    let dec = Decoder::new().nan_fill(true);
    let got = through_cache(&dec, &arrays, 4, &steps);
    assert_close(&got, &want, 1e-5, "prefill 33 + 7 steps");
    // The same as the array API's causal sdpa over all 40 tokens.
    let [q, k, v] = &arrays;
    let gpu = Attention::new()
        .causal(true)
        .return_weights(false)
        .run(common::ctx(), Inputs::qkv(q, k, v))
        .unwrap()
        .context;
    let diff = (&got.clone().into_dyn() - &gpu).mapv(f32::abs);
    assert!(
        diff.iter().all(|d| *d < 1e-5),
        "max {:e}",
        diff.fold(0.0f32, |a, &b| a.max(b))
    );
}

#[test]
fn many_small_blocks_and_rows_that_end_inside_a_block() {
    // Blocks of 64 keys: the prefill's rows end inside blocks, and early rows see none of the
    // later blocks; a 3-row step after it.
    let arrays = qkv(1, 2, 2, 200, (8, 12), 1.5);
    let want = causal_reference(&arrays);
    let dec = Decoder::new().block(64).nan_fill(true);
    let got = through_cache(&dec, &arrays, 2, &[150, 1, 3, 46]);
    assert_close(&got, &want, 1e-5, "blocks of 64");
    let whole = through_cache(&Decoder::new().block(1 << 20), &arrays, 2, &[150, 1, 3, 46]);
    assert_close(&whole, &want, 1e-5, "one block");
}

#[test]
fn grouped_query_heads_share_their_kv_head() {
    // 8 query heads over 2 K/V heads (4 rows per K/V head and token, 12 for a 3-row step:
    // two chunks of 8), widths not multiples of 4.
    let arrays = qkv(2, 8, 2, 23, (6, 10), 1.5);
    let want = causal_reference(&arrays);
    let dec = Decoder::new().nan_fill(true);
    let got = through_cache(&dec, &arrays, 2, &[5, 1, 3, 1, 13]);
    assert_close(&got, &want, 1e-5, "GQA 8/2");
    let mqa = qkv(1, 3, 1, 9, (5, 7), 1.5);
    let got = through_cache(&dec, &mqa, 1, &[4, 1, 1, 1, 2]);
    assert_close(&got, &causal_reference(&mqa), 1e-5, "MQA 3/1");
}

#[test]
fn odd_cache_lengths_and_widths() {
    for len in [1usize, 7, 37, 1000] {
        let arrays = qkv(1, 2, 2, len, (5, 7), 1.5);
        let want = causal_reference(&arrays);
        let last = want.slice(s![.., .., len - 1..len, ..]).to_owned();
        for dec in [Decoder::new(), Decoder::new().block(64)] {
            let dec = dec.nan_fill(true);
            let steps = if len == 1 { vec![1] } else { vec![len - 1, 1] };
            let got = through_cache(&dec, &arrays, 2, &steps);
            let got_last = got.slice(s![.., .., len - 1..len, ..]).to_owned();
            assert_close(
                &got_last,
                &last.clone().into_dyn(),
                1e-5,
                &format!("len {len}"),
            );
        }
    }
}

#[test]
fn large_logits_stay_finite_and_correct() {
    // |q·k| up to ~ 30² · 16 / 4: scores in the thousands.
    let arrays = qkv(1, 2, 2, 50, (16, 16), 30.0);
    let want = causal_reference(&arrays);
    let got = through_cache(&Decoder::new().block(64), &arrays, 2, &[10, 1, 1, 38]);
    assert_close(&got, &want, 1e-5, "large logits");
}

#[test]
fn an_f16_cache_matches_the_reference_of_its_rounded_values() {
    let ctx = common::ctx();
    let arrays = qkv(2, 4, 2, 21, (12, 8), 1.5);
    let [q, k, v] = &arrays;
    let (kh, vh) = (k.mapv(f16::from_f32), v.mapv(f16::from_f32));
    let rounded = [q.clone(), kh.mapv(f16::to_f32), vh.mapv(f16::to_f32)];
    let want = causal_reference(&rounded);
    let mut cache = KvCache::new(ctx, spec(2, 2, 21, (12, 8), Dtype::F16)).unwrap();
    let f32_bytes = KvCache::new(ctx, spec(2, 2, 21, (12, 8), Dtype::F32))
        .unwrap()
        .memory_bytes();
    assert_eq!(cache.memory_bytes() * 2, f32_bytes);
    let dec = Decoder::new().nan_fill(true);
    let mut outs = Vec::new();
    for (from, to) in [(0, 17), (17, 18), (18, 21)] {
        let r = s![.., .., from..to, ..];
        cache.append(ctx, kh.slice(r), vh.slice(r)).unwrap();
        outs.push(dec.step(ctx, &cache, q.slice(r)).unwrap());
    }
    let views: Vec<_> = outs.iter().map(|o| o.view()).collect();
    let got = ndarray::concatenate(Axis(2), &views).unwrap();
    assert_close(&got, &want, 1e-5, "f16 cache");
}

#[test]
fn bad_appends_are_errors_that_leave_the_cache_as_it_was() {
    let ctx = common::ctx();
    let [q, k, v] = qkv(2, 4, 2, 12, (6, 5), 1.0);
    let mut cache = KvCache::new(ctx, spec(2, 2, 10, (6, 5), Dtype::F32)).unwrap();
    // 40 rows of 8 values each for K and V, in whole texture lines (here one of 48 rows).
    let need = (10 * 2 * 2 * (8 + 8) * 4) as u64;
    assert!(
        (need..=2 * need).contains(&cache.memory_bytes()),
        "{}",
        cache.memory_bytes()
    );
    cache
        .append(
            ctx,
            k.slice(s![.., .., ..8, ..]),
            v.slice(s![.., .., ..8, ..]),
        )
        .unwrap();
    let dec = Decoder::new();
    let q_last = q.slice(s![.., .., 7..8, ..]);
    let before = dec.step(ctx, &cache, q_last).unwrap();

    let three = s![.., .., 8..11, ..];
    let mut nan_k = k.slice(three).to_owned();
    nan_k[[1, 0, 2, 3]] = f32::NAN;
    let other = Context::new().unwrap();
    let wide = Array4::<f32>::zeros((2, 2, 1, 7));
    let cases: Vec<(&str, Result<(), Error>)> = vec![
        (
            "past capacity",
            cache.append(ctx, k.slice(three), v.slice(three)),
        ),
        ("NaN", cache.append(ctx, nan_k.view(), v.slice(three))),
        (
            "heads",
            cache.append(
                ctx,
                q.slice(s![.., .., 8..9, ..]),
                v.slice(s![.., .., 8..9, ..]),
            ),
        ),
        (
            "width",
            cache.append(ctx, wide.view(), v.slice(s![.., .., 8..9, ..])),
        ),
        (
            "batch",
            cache.append(
                ctx,
                k.slice(s![..1, .., 8..9, ..]),
                v.slice(s![..1, .., 8..9, ..]),
            ),
        ),
        (
            "K and V lengths",
            cache.append(
                ctx,
                k.slice(s![.., .., 8..9, ..]),
                v.slice(s![.., .., 8..10, ..]),
            ),
        ),
        (
            "dtype",
            cache.append(
                ctx,
                k.slice(s![.., .., 8..9, ..]).mapv(f16::from_f32).view(),
                v.slice(s![.., .., 8..9, ..]).mapv(f16::from_f32).view(),
            ),
        ),
        (
            "context",
            cache.append(
                &other,
                k.slice(s![.., .., 8..9, ..]),
                v.slice(s![.., .., 8..9, ..]),
            ),
        ),
    ];
    for (what, result) in cases {
        let err = result.expect_err(what).to_string();
        assert!(!err.contains('\n'), "{what}: {err}");
        assert_eq!(cache.len(), 8, "{what}");
        let after = dec.step(ctx, &cache, q_last).unwrap();
        assert_eq!(after, before, "{what}: {err}");
    }
    // The cache still takes what fits, and decodes it.
    let two = s![.., .., 8..10, ..];
    cache.append(ctx, k.slice(two), v.slice(two)).unwrap();
    assert_eq!(cache.len(), 10);
    let got = dec.step(ctx, &cache, q.slice(two)).unwrap();
    let want = causal_reference(&[
        q.slice(s![.., .., ..10, ..]).to_owned(),
        k.slice(s![.., .., ..10, ..]).to_owned(),
        v.slice(s![.., .., ..10, ..]).to_owned(),
    ]);
    assert_close(
        &got,
        &want.slice(s![.., .., 8..10, ..]).to_owned().into_dyn(),
        1e-5,
        "after",
    );
}

#[test]
fn bad_steps_and_caches_are_errors() {
    let ctx = common::ctx();
    let [q, k, v] = qkv(1, 4, 2, 4, (4, 4), 1.0);
    let mut cache = KvCache::new(ctx, spec(1, 2, 4, (4, 4), Dtype::F32)).unwrap();
    let dec = Decoder::new();
    // Nothing cached yet: no row can attend.
    assert!(dec.step(ctx, &cache, q.slice(s![.., .., ..1, ..])).is_err());
    cache
        .append(
            ctx,
            k.slice(s![.., .., ..2, ..]),
            v.slice(s![.., .., ..2, ..]),
        )
        .unwrap();
    let three = Array4::<f32>::zeros((1, 3, 1, 4));
    let mut nan_q = q.slice(s![.., .., ..1, ..]).to_owned();
    nan_q[[0, 1, 0, 2]] = f32::INFINITY;
    let other = Context::new().unwrap();
    for (what, result) in [
        (
            "more rows than tokens",
            dec.step(ctx, &cache, q.slice(s![.., .., ..3, ..])),
        ),
        ("heads", dec.step(ctx, &cache, three.view())),
        (
            "width",
            dec.step(ctx, &cache, Array4::zeros((1, 4, 1, 5)).view()),
        ),
        (
            "batch",
            dec.step(ctx, &cache, Array4::zeros((2, 4, 1, 4)).view()),
        ),
        ("non-finite", dec.step(ctx, &cache, nan_q.view())),
        (
            "scale",
            Decoder::new()
                .scale(f32::NAN)
                .step(ctx, &cache, q.slice(s![.., .., ..1, ..])),
        ),
        (
            "context",
            dec.step(&other, &cache, q.slice(s![.., .., ..1, ..])),
        ),
    ] {
        let err = result.expect_err(what).to_string();
        assert!(!err.contains('\n'), "{what}: {err}");
    }
    for bad in [
        spec(0, 1, 4, (4, 4), Dtype::F32),
        spec(1, 1, 0, (4, 4), Dtype::F32),
        spec(1, 1, 4, (0, 4), Dtype::F32),
    ] {
        assert!(KvCache::new(ctx, bad).is_err(), "{bad:?}");
    }
}

#[test]
fn a_ten_thousand_step_decode_loop_holds_memory_flat() {
    // Its own context, so the pool's figures are this loop's alone.
    let ctx = Context::new().unwrap().with_tuning(false);
    let steps = 10_000;
    let spec = spec(1, 1, steps, (4, 4), Dtype::F32);
    let mut cache = KvCache::new(&ctx, spec).unwrap();
    let cache_bytes = cache.memory_bytes();
    let one = |t: usize| {
        Array4::from_shape_fn((1, 1, 1, 4), |(_, _, _, e)| ((t + e) as f32 * 0.01).sin())
    };
    let decoder = Decoder::new();
    let mut at_100 = None;
    for t in 0..steps {
        cache
            .append(&ctx, one(t).view(), one(t + 1).view())
            .unwrap();
        let out = decoder.step(&ctx, &cache, one(t + 2).view()).unwrap();
        assert!(out.iter().all(|v| v.is_finite()));
        if t == 100 {
            at_100 = Some(ctx.memory());
        }
    }
    let (early, end) = (at_100.unwrap(), ctx.memory());
    // Nothing is held between steps, the cache does not grow, and the pool stops allocating
    // (a longer cache may take a few more key blocks: a bounded number of size classes).
    assert_eq!(end.in_use_bytes, 0, "{end:?}");
    assert_eq!(cache.memory_bytes(), cache_bytes);
    assert!(
        end.allocations <= early.allocations + 8
            && end.free_bytes <= 4 * early.free_bytes.max(1 << 16),
        "the pool grew: {early:?} → {end:?}"
    );
}

#[test]
fn a_layer_decoding_with_its_cache_equals_its_causal_forward() {
    let ctx = common::ctx();
    let (d, n, prompt) = (12, 37, 30);
    let w = |r: usize, c: usize, salt: usize| {
        ndarray::Array2::from_shape_fn((r, c), |(i, j)| {
            (((i * 7 + j * 3) * (salt + 1)) as f32 * 0.13).sin() * 0.5
        })
    };
    // Four query heads of width 2 on two K/V heads; W_O 8 → 5, with biases.
    let (wq, wk, wv, wo) = (w(d, 8, 1), w(d, 4, 2), w(d, 4, 3), w(8, 5, 4));
    let (bq, bo) = (
        ndarray::Array1::from_elem(8, 0.1f32),
        ndarray::Array1::from_elem(5, -0.2f32),
    );
    let mut p = wgpu_attention::Projections::new(wq.view(), wk.view(), wv.view())
        .with_output(wo.view(), Some(bo.view()));
    p.b_q = Some(bq.view());
    let op = Attention::new().heads(4).causal(true).return_weights(false);
    let layer = wgpu_attention::Layer::new(ctx, op, &p).unwrap();
    let x = ndarray::Array3::from_shape_fn((2, n, d), |(b, i, j)| {
        ((b * 3 + i * 5 + j) as f32 * 0.07).cos()
    });
    let want = layer.run(ctx, Inputs::x(&x)).unwrap().context;
    let mut cache = KvCache::new(ctx, spec(2, 2, n, (2, 2), Dtype::F32)).unwrap();
    let mut got = vec![layer
        .decode(ctx, &mut cache, x.slice(s![.., ..prompt, ..]))
        .unwrap()];
    for t in prompt..n {
        got.push(
            layer
                .decode(ctx, &mut cache, x.slice(s![.., t..t + 1, ..]))
                .unwrap(),
        );
    }
    let views: Vec<_> = got.iter().map(|a| a.view()).collect();
    let got = ndarray::concatenate(Axis(1), &views).unwrap();
    let (rel, _) = reference::compare(&got, &want.mapv(f64::from));
    assert!(rel < 1e-5, "decode vs forward: {rel:e}");
    assert_eq!(cache.len(), n);
    // A full cache refuses more, unchanged; a layer that is not causal is refused.
    let e = layer
        .decode(ctx, &mut cache, x.slice(s![.., ..1, ..]))
        .unwrap_err();
    assert!(matches!(e, Error::LimitExceeded { .. }), "{e}");
    assert_eq!(cache.len(), n);
    let plain = wgpu_attention::Layer::new(ctx, op.causal(false), &p).unwrap();
    let mut fresh = KvCache::new(ctx, spec(2, 2, n, (2, 2), Dtype::F32)).unwrap();
    let e = plain
        .decode(ctx, &mut fresh, x.slice(s![.., ..1, ..]))
        .unwrap_err();
    assert!(e.to_string().contains("not causal"), "{e}");
    let mut wrong = KvCache::new(ctx, spec(2, 4, n, (2, 2), Dtype::F32)).unwrap();
    let e = layer
        .decode(ctx, &mut wrong, x.slice(s![.., ..1, ..]))
        .unwrap_err();
    assert!(e.to_string().contains("K/V heads"), "{e}");
}
