//! Masks, as PyTorch's and JAX's attention take them: boolean (true = attend) and float
//! (added to the scaled scores) masks of every broadcast shape, key lengths, their
//! combinations with causal, and rows with nothing to attend to (zeros, never NaN); on every
//! kernel path against the f64 reference, through `Attention::run` on Q, K, V and on X.

mod common;

use ndarray::{Array1, Array2, ArrayD, IxDyn};
use wgpu_attention::{reference, verify, Attention, Error, Inputs, Mask, Options, Projections};

/// What every test here runs with: outputs pre-filled with NaN, so an element no kernel
/// wrote shows up.
fn nan_fill() -> Options {
    Options::default().nan_fill(true)
}

/// A deterministic pseudo-random boolean of shape `shape`, about `keep` of it true.
fn bool_mask(shape: &[usize], keep: f64, salt: u64) -> ArrayD<bool> {
    let mut state = salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    ArrayD::from_shape_fn(IxDyn(shape), |_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % 1000) as f64 / 1000.0 < keep
    })
}

#[test]
fn boolean_masks_of_every_broadcast_shape_match_the_reference_on_every_path() {
    let (b, h, l, s) = (2, 3, 37, 53);
    let qkv = common::sdpa_arrays(b, h, l, s, 8, 12);
    let mut failures = Vec::new();
    for (i, shape) in [
        vec![s],
        vec![l, s],
        vec![1, l, s],
        vec![h, 1, s],
        vec![b, 1, 1, s],
        vec![b, h, l, s],
        vec![1, h, l, 1],
    ]
    .into_iter()
    .enumerate()
    {
        let m = bool_mask(&shape, 0.7, i as u64 + 1);
        for causal in [false, true] {
            let base = Attention::new().causal(causal).options(nan_fill());
            let label = format!("bool {shape:?} causal={causal}");
            let mask = Mask::boolean(m.view());
            failures.extend(common::sdpa_failures(base, &qkv, &mask, &label));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn float_masks_add_to_the_scaled_scores_with_minus_infinity_masking_out() {
    let (b, h, l, s) = (1, 2, 19, 23);
    let qkv = common::sdpa_arrays(b, h, l, s, 8, 6);
    let mut failures = Vec::new();
    // Smooth biases, with -inf, -1e9 and float32's most negative value sprinkled in (how
    // Hugging Face models mask), and a row of -inf only.
    let mut m = ArrayD::from_shape_fn(IxDyn(&[h, l, s]), |ix| {
        let (hh, i, j) = (ix[0], ix[1], ix[2]);
        match (hh * 7 + i * 3 + j) % 11 {
            0 => f32::NEG_INFINITY,
            1 => -1e9,
            2 => f32::MIN,
            _ => ((i * 5 + j * 3 + hh) as f32 * 0.37).sin() * 4.0,
        }
    });
    m.slice_mut(ndarray::s![1, 4, ..]).fill(f32::NEG_INFINITY);
    // A row of nothing but f32's most negative value: uniform weights (the scores cannot be
    // told apart, in f64 either), not unnormalized ones. Found by the NumPy cross-check: the
    // subgroup weights once divided by exp2(M + log2 L), which rounds back to exp2(M) here.
    m.slice_mut(ndarray::s![1, 9, ..]).fill(f32::MIN);
    for causal in [false, true] {
        for scale in [None, Some(2.5f32)] {
            let mut base = Attention::new().causal(causal).options(nan_fill());
            if let Some(sc) = scale {
                base = base.scale(sc);
            }
            let label = format!("float causal={causal} scale={scale:?}");
            let mask = Mask::additive(m.view());
            failures.extend(common::sdpa_failures(base, &qkv, &mask, &label));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn masks_of_any_strides_give_the_contiguous_masks_results() {
    // A permuted float mask (T5's position bias arrives as (L, S, H) permuted to (H, L, S))
    // and a transposed boolean one: read as the contiguous masks they equal. The float one
    // was once an "incompatible memory layout" error (found by the Python transformers backend).
    let (b, h, l, s) = (2, 3, 9, 11);
    let qkv = common::sdpa_arrays(b, h, l, s, 8, 8);
    let lsh = ArrayD::from_shape_fn(IxDyn(&[l, s, h]), |ix| {
        ((ix[0] * 7 + ix[1] * 3 + ix[2]) as f32 * 0.41).sin() * 3.0
    });
    let permuted = lsh.view().permuted_axes(IxDyn(&[2, 0, 1]));
    assert!(!permuted.is_standard_layout());
    let contiguous = permuted.as_standard_layout().into_owned();
    let sl = bool_mask(&[s, l], 0.7, 5);
    let transposed = sl.view().reversed_axes();
    let transposed_owned = transposed.as_standard_layout().into_owned();
    let op = Attention::new().options(nan_fill());
    let (q, k, v) = (&qkv[0], &qkv[1], &qkv[2]);
    for (strided, plain) in [
        (
            Mask::additive(permuted.view()),
            Mask::additive(contiguous.view()),
        ),
        (
            Mask::boolean(transposed.view()),
            Mask::boolean(transposed_owned.view()),
        ),
    ] {
        let got = op
            .run(common::ctx(), Inputs::qkv(q, k, v).mask(&strided))
            .unwrap();
        let want = op
            .run(common::ctx(), Inputs::qkv(q, k, v).mask(&plain))
            .unwrap();
        assert_eq!(got.context, want.context);
        assert_eq!(got.weights, want.weights);
    }
    assert!(
        common::sdpa_failures(op, &qkv, &Mask::additive(permuted.view()), "permuted").is_empty()
    );
}

#[test]
fn rows_with_nothing_to_attend_to_are_zeros_on_every_path() {
    let ctx = common::ctx();
    let (b, h, l, s) = (2, 2, 9, 7);
    let [q, k, v] = common::sdpa_arrays(b, h, l, s, 4, 5);
    // Key lengths 0 (sequence 0 sees nothing) and 4; row 2 of every head masked out whole;
    // under causal, row 0 of sequence 1 sees key 0 only, which the mask hides.
    let mut m = ArrayD::from_elem(IxDyn(&[l, s]), true);
    m.slice_mut(ndarray::s![2, ..]).fill(false);
    m[[0, 0]] = false;
    let mask = Mask::boolean(m.view()).with_kv_lengths(&[0, 4]);
    for causal in [false, true] {
        let base = Attention::new().causal(causal).options(nan_fill());
        let inputs = Inputs::qkv(&q, &k, &v).mask(&mask);
        let want = reference::run(&base, &inputs).unwrap();
        for (kernels, fused) in verify::paths(ctx) {
            let op = base
                .options(nan_fill().kernels(kernels))
                .return_weights(!fused);
            let got = op.run(ctx, inputs.clone()).unwrap();
            let what = format!("{kernels} fused={fused} causal={causal}");
            let (rel, _) = reference::compare(&got.context, &want.context);
            assert!(rel < 1e-5, "{what}: context rel {rel:e}");
            // Exactly zero, not NaN: sequence 0 entirely, row 2 everywhere, and row 0 of
            // sequence 1 under causal.
            let mut empty = vec![(0, None), (1, Some(2))];
            if causal {
                empty.push((1, Some(0)));
            }
            for (bi, row) in empty {
                for hi in 0..h {
                    let rows = match row {
                        Some(r) => r..r + 1,
                        None => 0..l,
                    };
                    for i in rows {
                        let c = got.context.slice(ndarray::s![bi, hi, i, ..]);
                        assert!(
                            c.iter().all(|&x| x == 0.0),
                            "{what}: context {bi},{hi},{i} {c}"
                        );
                        if let Some(w) = &got.weights {
                            let w = w.slice(ndarray::s![bi, hi, i, ..]);
                            assert!(w.iter().all(|&x| x == 0.0), "{what}: weights {w}");
                        }
                    }
                }
            }
            if let Some(w) = &got.weights {
                let (wrel, _) = reference::compare(w, want.weights.as_ref().unwrap());
                assert!(wrel < 1e-5, "{what}: weights rel {wrel:e}");
            }
        }
    }
}

#[test]
fn key_lengths_alone_and_with_grouped_query_heads_match_the_reference() {
    let (b, l, s) = (3, 21, 26);
    let [q, _, _] = common::sdpa_arrays(b, 4, l, s, 8, 6);
    let [_, k, v] = common::sdpa_arrays(b, 2, l, s, 8, 6);
    let qkv = [q, k, v];
    let mut failures = Vec::new();
    for causal in [false, true] {
        let base = Attention::new().causal(causal).options(nan_fill());
        let lengths = Mask::none().with_kv_lengths(&[26, 1, 13]);
        failures.extend(common::sdpa_failures(base, &qkv, &lengths, "lengths"));
        let m = bool_mask(&[4, 1, s], 0.6, 9);
        let both = Mask::boolean(m.view()).with_kv_lengths(&[5, 26, 17]);
        failures.extend(common::sdpa_failures(base, &qkv, &both, "lengths+mask GQA"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_mask_of_all_true_changes_nothing_and_all_false_gives_zeros() {
    let ctx = common::ctx();
    let [q, k, v] = common::sdpa_arrays(1, 2, 11, 13, 4, 4);
    let op = Attention::new();
    let plain = op.run(ctx, Inputs::qkv(&q, &k, &v)).unwrap();
    let ones = ArrayD::from_elem(IxDyn(&[11, 13]), true);
    let masked = op
        .run(
            ctx,
            Inputs::qkv(&q, &k, &v).mask(&Mask::boolean(ones.view())),
        )
        .unwrap();
    assert_eq!(plain.context, masked.context);
    let zeros = ArrayD::from_elem(IxDyn(&[1]), false);
    let none = op
        .run(
            ctx,
            Inputs::qkv(&q, &k, &v).mask(&Mask::boolean(zeros.view())),
        )
        .unwrap();
    assert!(none.context.iter().all(|&x| x == 0.0));
    assert!(none.weights.unwrap().iter().all(|&x| x == 0.0));
}

#[test]
fn a_masked_forward_on_x_with_projections_and_heads_matches_the_reference() {
    let ctx = common::ctx();
    let (batch, n, d) = (2, 37, 12);
    let x = ArrayD::from_shape_fn(IxDyn(&[batch, n, d]), |ix| {
        ((ix[0] * 97 + ix[1] * 13 + ix[2] * 5) as f32 * 0.11).sin()
    });
    let w = |cols: usize, salt: usize| {
        Array2::from_shape_fn((d, cols), |(i, j)| {
            (((i * 7 + j * 3) * salt) as f32 * 0.05).cos() * 0.4
        })
    };
    let (wq, wk, wv, wo) = (w(16, 1), w(16, 2), w(8, 3), w(8, 4).t().to_owned());
    let bo = Array1::from_shape_fn(d, |i| i as f32 * 0.1);
    let proj =
        Projections::new(wq.view(), wk.view(), wv.view()).with_output(wo.view(), Some(bo.view()));
    let m = bool_mask(&[batch, 2, n, n], 0.5, 3);
    let f = ArrayD::from_shape_fn(IxDyn(&[n, n]), |ix| (ix[0] as f32 - ix[1] as f32) * 0.05);
    // Borrowed from an array that outlives the loops: `Inputs::mask` takes `&'a Mask<'a>`.
    let masks = [
        Mask::boolean(m.view()),
        Mask::additive(f.view()).with_kv_lengths(&[30, 2]),
    ];
    for mask in &masks {
        for causal in [false, true] {
            let base = Attention::new().heads(2).causal(causal).options(nan_fill());
            let inputs = Inputs::x(&x).projections(&proj).mask(mask);
            let want = reference::run(&base, &inputs).unwrap();
            for (kernels, fused) in verify::paths(ctx) {
                let op = base
                    .options(nan_fill().kernels(kernels))
                    .return_weights(!fused);
                let got = op.run(ctx, inputs.clone()).unwrap();
                let (rel, _) = reference::compare(&got.context, &want.context);
                assert!(
                    rel < 1e-5,
                    "{kernels} fused={fused} causal={causal}: {rel:e}"
                );
                if let Some(wt) = &got.weights {
                    let (wrel, _) = reference::compare(wt, want.weights.as_ref().unwrap());
                    assert!(wrel < 1e-5, "{kernels} weights causal={causal}: {wrel:e}");
                }
            }
        }
    }
}

#[test]
fn bad_masks_are_errors_that_say_what_is_wrong() {
    let ctx = common::ctx();
    let [q, k, v] = common::sdpa_arrays(2, 2, 5, 7, 4, 3);
    let op = Attention::new();
    // Takes the inputs whole: with `Inputs::mask(&'a Mask<'a>)` a closure cannot pair a
    // mask it is given with the Q, K, V it borrows.
    let run = |inputs: Inputs<'_>| op.run(ctx, inputs).unwrap_err();
    let wrong = ArrayD::from_elem(IxDyn(&[5, 6]), true);
    let e = run(Inputs::qkv(&q, &k, &v).mask(&Mask::boolean(wrong.view())));
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    assert!(
        e.to_string().contains("[5, 6]") && e.to_string().contains("n_kv"),
        "{e}"
    );
    let five = ArrayD::from_elem(IxDyn(&[1, 2, 2, 5, 7]), true);
    assert!(matches!(
        run(Inputs::qkv(&q, &k, &v).mask(&Mask::boolean(five.view()))),
        Error::ShapeMismatch { .. }
    ));
    let mut nan = ArrayD::zeros(IxDyn(&[5, 7]));
    nan[[3, 4]] = f32::NAN;
    let e = run(Inputs::qkv(&q, &k, &v).mask(&Mask::additive(nan.view())));
    assert!(
        matches!(&e, Error::NonFinite { index, .. } if index == &[3, 4]),
        "{e}"
    );
    nan[[3, 4]] = f32::INFINITY;
    assert!(matches!(
        run(Inputs::qkv(&q, &k, &v).mask(&Mask::additive(nan.view()))),
        Error::NonFinite { .. }
    ));
    let e = run(Inputs::qkv(&q, &k, &v).mask(&Mask::none().with_kv_lengths(&[7])));
    assert!(e.to_string().contains("one per batch index"), "{e}");
    let e = run(Inputs::qkv(&q, &k, &v).mask(&Mask::none().with_kv_lengths(&[7, 8])));
    assert!(e.to_string().contains("kv_lengths[1] = 8"), "{e}");
    // The same checks guard a masked forward on X, before any GPU work.
    let x = ArrayD::<f32>::zeros(IxDyn(&[4, 6]));
    let e = run(Inputs::x(&x).mask(&Mask::boolean(wrong.view())));
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
}
