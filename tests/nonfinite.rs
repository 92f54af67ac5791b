//! NaN and Inf in the inputs: rejected by default (tests/bad_input.rs); with
//! `propagate_non_finite` they reach exactly the outputs that depend on them, as the f64
//! reference defines it, on every kernel path — and never through a key of weight 0
//! (masked or hidden by causal).

mod common;

use ndarray::{s, ArrayD, IxDyn};
use wgpu_attention::{reference, verify, Attention, Error, Inputs, Mask, Options};

/// NaN and Inf let through (`Options::propagate_non_finite`), on `kernels`.
fn propagate(kernels: wgpu_attention::Kernels) -> Options {
    Options::default()
        .kernels(kernels)
        .propagate_non_finite(true)
}

/// Elements are non-finite in the same places, and the finite ones agree to `tol`.
fn agrees(got: &ArrayD<f32>, want: &ArrayD<f64>, tol: f64) -> Result<(), String> {
    let mut diff2 = 0.0;
    let mut ref2 = 0.0;
    for (i, (&g, &w)) in got.iter().zip(want.iter()).enumerate() {
        if g.is_finite() != w.is_finite() {
            return Err(format!("element {i}: got {g}, reference {w}"));
        }
        if w.is_finite() {
            diff2 += (f64::from(g) - w).powi(2);
            ref2 += w * w;
        }
    }
    let rel = (diff2 / ref2.max(1e-300)).sqrt();
    if rel > tol {
        return Err(format!("finite elements rel {rel:e}"));
    }
    Ok(())
}

fn x() -> ArrayD<f32> {
    let mut x = ArrayD::from_shape_fn(IxDyn(&[2, 23, 8]), |ix| {
        ((ix[0] * 97 + ix[1] * 13 + ix[2] * 3) as f32 * 0.21).sin()
    });
    x[[0, 5, 3]] = f32::NAN;
    x[[1, 9, 0]] = f32::INFINITY;
    x[[1, 20, 7]] = f32::NEG_INFINITY;
    x
}

#[test]
fn nan_and_inf_propagate_as_the_reference_says_on_every_path() {
    let ctx = common::ctx();
    let x = x();
    let keep = ArrayD::from_shape_fn(IxDyn(&[23, 23]), |ix| (ix[0] * 3 + ix[1]) % 5 != 0);
    // Borrowed from an array that outlives the loops: `Inputs::mask` takes `&'a Mask<'a>`.
    let masks = [Mask::none(), Mask::boolean(keep.view())];
    for mask in &masks {
        for causal in [false, true] {
            let base = Attention::new()
                .heads(2)
                .causal(causal)
                .options(propagate(wgpu_attention::Kernels::Auto));
            let inputs = Inputs::x(&x).mask(mask);
            let want = reference::run(&base, &inputs).unwrap();
            // The reference itself: some rows poisoned, some not.
            let bad = want.context.iter().filter(|v| !v.is_finite()).count();
            assert!(bad > 0 && bad < want.context.len(), "{bad}");
            for (kernels, fused) in verify::paths(ctx) {
                let op = base.options(propagate(kernels)).return_weights(!fused);
                let got = op.run(ctx, inputs.clone()).unwrap();
                let what = format!("{kernels} fused={fused} causal={causal}");
                agrees(&got.context, &want.context, 1e-5).unwrap_or_else(|e| panic!("{what}: {e}"));
                if let Some(w) = &got.weights {
                    agrees(w, want.weights.as_ref().unwrap(), 1e-5)
                        .unwrap_or_else(|e| panic!("{what} weights: {e}"));
                }
            }
        }
    }
}

#[test]
fn a_nan_value_at_a_key_of_weight_zero_never_reaches_a_row() {
    let ctx = common::ctx();
    let [q, k, mut v] = common::sdpa_arrays(1, 2, 40, 40, 8, 8);
    // Key 3's value is NaN and the mask hides key 3 from every query; key 39 is NaN and,
    // under causal, only the last query sees it.
    v.slice_mut(s![.., .., 3, ..]).fill(f32::NAN);
    v.slice_mut(s![.., .., 39, ..]).fill(f32::NAN);
    let keep = ArrayD::from_shape_fn(IxDyn(&[40]), |ix| ix[0] != 3);
    let mask = Mask::boolean(keep.view());
    for (kernels, fused) in verify::paths(ctx) {
        let op = Attention::new()
            .causal(true)
            .options(propagate(kernels))
            .return_weights(!fused);
        let got = op.run(ctx, Inputs::qkv(&q, &k, &v).mask(&mask)).unwrap();
        let what = format!("{kernels} fused={fused}");
        let rows_ok = got.context.slice(s![.., .., ..39, ..]);
        assert!(
            rows_ok.iter().all(|x| x.is_finite()),
            "{what}: a hidden NaN leaked"
        );
        let last = got.context.slice(s![.., .., 39, ..]);
        assert!(
            last.iter().all(|x| x.is_nan()),
            "{what}: the last row sees key 39"
        );
        if let Some(w) = &got.weights {
            assert!(
                w.iter().all(|x| x.is_finite()),
                "{what}: weights do not depend on V"
            );
        }
    }
}

#[test]
fn without_the_opt_in_the_same_inputs_are_named_errors() {
    let ctx = common::ctx();
    let x = x();
    let e = Attention::new().run(ctx, Inputs::x(&x)).unwrap_err();
    assert!(
        matches!(&e, Error::NonFinite { index, .. } if index == &[0, 5, 3]),
        "{e}"
    );
}
