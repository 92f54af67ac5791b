//! `Attention::sdpa`: PyTorch's `scaled_dot_product_attention` for callers with Q, K, V in
//! `(batch, heads, L, E)` layout, L ≠ S included, on every kernel family, with and without
//! the weights, against the f64 reference; and its bad shapes.

mod common;

use ndarray::Array4;
use wgpu_attention::{reference, Attention, Error, Kernels, Mask};

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
                let mut base = Attention::new().causal(causal).nan_fill(true);
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
        .sdpa(common::ctx(), q.view(), k.view(), v.view())
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
        op.sdpa(ctx, q.view(), k.view(), v.view()).unwrap_err()
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
        let e = err(&q, &k, &v, Attention::new().kernels(Kernels::Subgroup));
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
            let base = Attention::new().causal(causal).nan_fill(true);
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
    let grouped = reference::sdpa(&op, q.view(), k.view(), v.view()).unwrap();
    let repeated = reference::sdpa(&op, q.view(), repeat(&k).view(), repeat(&v).view()).unwrap();
    assert_eq!(grouped.context, repeated.context);
}
