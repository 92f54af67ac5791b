//! `Attention::run` on `Inputs::qkv`: PyTorch's `scaled_dot_product_attention` for callers
//! with Q, K, V in `(batch, heads, L, E)` layout, L ≠ S included, on every kernel family, with
//! and without the weights, against the f64 reference; and its bad shapes.

mod common;

use ndarray::Array4;
use wgpu_attention::{
    reference, Attention, Dims, Error, Inputs, Kernels, Mask, Options, Projections,
};

/// Outputs pre-filled with NaN, so an element no kernel wrote shows up; on `kernels`.
fn nan_fill(kernels: Kernels) -> Options {
    Options::default().kernels(kernels).nan_fill(true)
}

#[test]
fn sdpa_matches_the_reference_with_l_unequal_s_on_every_path() {
    let mut failures = Vec::new();
    for &(b, h, l, s, e, ev) in &[
        (2, 3, 37, 53, 8, 12),
        (1, 2, 70, 20, 16, 16),
        (1, 1, 1, 9, 4, 3),
    ] {
        let qkv = common::sdpa_arrays(b, h, l, s, e, ev);
        for causal in [false, true] {
            for scale in [None, Some(0.3f32)] {
                let mut base = Attention::new()
                    .causal(causal)
                    .options(nan_fill(Kernels::Auto));
                if let Some(sc) = scale {
                    base = base.scale(sc);
                }
                let label = format!("b{b} h{h} L{l} S{s} causal={causal} scale={scale:?}");
                failures.extend(common::sdpa_failures(base, &qkv, &Mask::none(), &label));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn sdpa_causal_rows_past_s_see_every_key() {
    // L = 6 > S = 3: query i sees keys j ≤ i, so rows 2.. see all three (top-left aligned).
    let [q, k, v] = common::sdpa_arrays(1, 1, 6, 3, 4, 2);
    let out = Attention::new()
        .causal(true)
        .run(common::ctx(), Inputs::qkv(&q, &k, &v))
        .unwrap();
    let w = out.weights.unwrap();
    assert_eq!(w[[0, 0, 0, 1]], 0.0);
    assert_eq!(w[[0, 0, 1, 2]], 0.0);
    for i in 2..6 {
        assert!(w[[0, 0, i, 2]] > 0.0, "row {i} must see key 2");
    }
}

#[test]
fn sdpa_bad_shapes_and_values_are_clear_errors() {
    let ctx = common::ctx();
    let [q, k, v] = common::sdpa_arrays(2, 2, 5, 7, 4, 3);
    let err = |q: &Array4<f32>, k: &Array4<f32>, v: &Array4<f32>, op: Attention| {
        op.run(ctx, Inputs::qkv(q, k, v)).unwrap_err()
    };
    let [_, k_wide, _] = common::sdpa_arrays(2, 2, 5, 7, 6, 3);
    assert!(err(&q, &k_wide, &v, Attention::new())
        .to_string()
        .contains("same width E"));
    let [_, _, v_long] = common::sdpa_arrays(2, 2, 5, 8, 4, 3);
    assert!(err(&q, &k, &v_long, Attention::new())
        .to_string()
        .contains("same length S"));
    // 2 Q heads cannot share 3 K/V heads.
    let [_, k_heads, v_heads] = common::sdpa_arrays(2, 3, 5, 7, 4, 3);
    let e = err(&q, &k_heads, &v_heads, Attention::new());
    assert!(
        matches!(e, Error::ShapeMismatch { .. }) && e.to_string().contains("multiple"),
        "{e}"
    );
    let [q0, k0, v0] = common::sdpa_arrays(2, 2, 0, 7, 4, 3);
    assert!(err(&q0, &k0, &v0, Attention::new())
        .to_string()
        .contains("L is 0"));
    let mut k_nan = k.clone();
    k_nan[[1, 0, 3, 2]] = f32::NAN;
    let e = err(&q, &k_nan, &v, Attention::new());
    assert!(
        e.to_string().contains('K') && e.to_string().contains("[1, 0, 3, 2]"),
        "{e}"
    );
    let e = err(&q, &k, &v, Attention::new().scale(f32::INFINITY));
    assert!(e.to_string().contains("scale"), "{e}");
    if ctx.subgroup_size().is_none() {
        let subgroup = Options::default().kernels(Kernels::Subgroup);
        let e = err(&q, &k, &v, Attention::new().options(subgroup));
        assert!(e.to_string().contains("subgroup"), "{e}");
    }
}

#[test]
fn grouped_query_attention_ratios_1_2_4_8_match_the_reference_on_every_path() {
    let mut failures = Vec::new();
    for kv_heads in [8usize, 4, 2, 1] {
        let [q, _, _] = common::sdpa_arrays(2, 8, 19, 23, 8, 6);
        let [_, k, v] = common::sdpa_arrays(2, kv_heads, 19, 23, 8, 6);
        let qkv = [q, k, v];
        for causal in [false, true] {
            let base = Attention::new()
                .causal(causal)
                .options(nan_fill(Kernels::Auto));
            let label = format!("kv_heads={kv_heads} causal={causal}");
            failures.extend(common::sdpa_failures(base, &qkv, &Mask::none(), &label));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn reference_gqa_equals_k_and_v_repeated_per_q_head() {
    // The definition, checked against the obvious one: repeat each K/V head for its Q heads.
    let [q, _, _] = common::sdpa_arrays(1, 4, 5, 6, 3, 2);
    let [_, k, v] = common::sdpa_arrays(1, 2, 5, 6, 3, 2);
    let repeat = |a: &Array4<f32>| {
        Array4::from_shape_fn((1, 4, a.dim().2, a.dim().3), |(b, h, i, j)| {
            a[[b, h / 2, i, j]]
        })
    };
    let op = Attention::new();
    let grouped = reference::run(&op, &Inputs::qkv(&q, &k, &v)).unwrap();
    let repeated = reference::run(&op, &Inputs::qkv(&q, &repeat(&k), &repeat(&v))).unwrap();
    assert_eq!(grouped.context, repeated.context);
}

#[test]
fn forward_runs_grouped_query_projections_as_such_on_every_path() {
    // 4 query heads of width 3 sharing 2 K/V heads (W_K, W_V half as wide as W_Q); causal,
    // a key-length mask and W_O. The same layer with each K/V head's columns repeated is
    // ordinary multi-head attention, and must give the same output.
    let ctx = common::ctx();
    let (d, n, heads, kv) = (6, 37, 4, 2);
    let w = |r: usize, c: usize, salt: usize| {
        ndarray::Array2::from_shape_fn((r, c), |(i, j)| {
            (((i * 7 + j * 3) * (salt + 1)) as f32 * 0.17).sin()
        })
    };
    let (wq, wk, wv, wo) = (w(d, 12, 1), w(d, 6, 2), w(d, 4, 3), w(8, 5, 4));
    let bk = ndarray::Array1::from_shape_fn(6, |i| i as f32 * 0.1);
    let x = ndarray::Array3::from_shape_fn((2, n, d), |(b, i, j)| {
        ((b * 5 + i * 3 + j) as f32 * 0.23).cos()
    });
    let mut p = Projections::new(wq.view(), wk.view(), wv.view()).with_output(wo.view(), None);
    p.b_k = Some(bk.view());
    let repeat = |a: &ndarray::Array2<f32>| {
        let per = a.ncols() / kv;
        let cols: Vec<usize> = (0..heads)
            .flat_map(|h| (h / 2) * per..(h / 2 + 1) * per)
            .collect();
        a.select(ndarray::Axis(1), &cols)
    };
    let (wk_mha, wv_mha) = (repeat(&wk), repeat(&wv));
    let bk_mha = repeat(&bk.clone().insert_axis(ndarray::Axis(0))).remove_axis(ndarray::Axis(0));
    let mut mha =
        Projections::new(wq.view(), wk_mha.view(), wv_mha.view()).with_output(wo.view(), None);
    mha.b_k = Some(bk_mha.view());
    let lengths = [30usize, 37];
    let mask = Mask::none().with_kv_lengths(&lengths);
    let base = Attention::new()
        .heads(heads)
        .causal(true)
        .options(nan_fill(Kernels::Auto));
    let inputs = Inputs::x(&x).projections(&p).mask(&mask);
    let dims = Dims::new(&base, &inputs).unwrap();
    assert_eq!((dims.kv_heads, dims.d_v), (kv, 8));
    let want = reference::run(&base, &inputs).unwrap();
    let same = reference::run(&base, &Inputs::x(&x).projections(&mha).mask(&mask)).unwrap();
    let (rel, _) = reference::compare(&same.context.mapv(|v| v as f32), &want.context);
    assert!(
        rel < 1e-6,
        "the grouped reference is the repeated one: {rel}"
    );
    let mut failures = Vec::new();
    for family in Kernels::available(ctx) {
        for weights in [false, true] {
            let op = base.options(nan_fill(family)).return_weights(weights);
            let got = op.run(ctx, inputs.clone()).unwrap();
            let (rel, _) = reference::compare(&got.context, &want.context);
            let wrel = got.weights.map_or(0.0, |w| {
                reference::compare(&w, want.weights.as_ref().unwrap()).0
            });
            if !(rel < 1e-5 && wrel < 1e-5) {
                failures.push(format!("{family} weights={weights}: {rel:e} {wrel:e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // A K narrower than Q by a ratio that does not divide the heads is an error.
    let wk3 = w(d, 4, 5);
    let bad = Projections::new(wq.view(), wk3.view(), wv.view());
    let err = Dims::new(&base, &Inputs::x(&x).projections(&bad)).unwrap_err();
    assert!(err.to_string().contains("W_K"), "{err}");
}
