//! Random configurations, valid and not, thrown at the library: each call is either `Ok`
//! and equal to the f64 reference, or a clear `Err` that the reference agrees is bad input
//! (or a limit of this adapter); never a panic, never an answer to a bad question.

mod common;

use ndarray::{Array1, Array2, ArrayD, IxDyn};
use proptest::prelude::*;
use wgpu_attention::{reference, verify, Attention, Error, Inputs, Kernels, Options, Projections};

fn values(shape: &[usize], salt: usize) -> ArrayD<f32> {
    let len = shape.iter().product();
    let v = (0..len)
        .map(|i| ((i * 7 + salt * 13) as f32 * 0.37).sin())
        .collect();
    ArrayD::from_shape_vec(IxDyn(shape), v).unwrap()
}

fn two(a: ArrayD<f32>) -> Array2<f32> {
    a.into_dimensionality().unwrap()
}

fn one(a: ArrayD<f32>) -> Array1<f32> {
    a.into_dimensionality().unwrap()
}

static OK_CASES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_configuration_is_right_or_a_clear_error(
        batch in prop::option::of(0usize..3),
        n in prop_oneof![9 => 1usize..300, 1 => Just(0usize)],
        d in prop_oneof![9 => 1usize..12, 1 => Just(0usize)],
        dk in prop_oneof![9 => (1usize..6).prop_map(|k| 2 * k), 1 => Just(0usize), 1 => Just(7usize)],
        dv in prop_oneof![9 => (1usize..6).prop_map(|k| 2 * k), 1 => Just(0usize), 1 => Just(5usize)],
        heads in prop_oneof![6 => Just(1usize), 3 => Just(2usize), 1 => Just(0usize), 1 => Just(3usize)],
        causal in any::<bool>(),
        weights_out in any::<bool>(),
        with_proj in any::<bool>(),
        bias in any::<bool>(),
        wrong_rows in prop_oneof![8 => Just(0usize), 2 => 1usize..3],
        scale in prop_oneof![
            6 => Just(None),
            3 => (-2.0f32..2.0).prop_map(Some),
            1 => Just(Some(f32::NAN)),
            1 => Just(Some(f32::INFINITY)),
        ],
        poison in prop_oneof![
            8 => Just(None),
            1 => Just(Some(f32::NAN)),
            1 => Just(Some(f32::NEG_INFINITY)),
        ],
        family in prop_oneof![Just(Kernels::Auto), Just(Kernels::Storage), Just(Kernels::Subgroup)],
    ) {
        let shape: Vec<usize> = match batch {
            Some(b) => vec![b, n, d],
            None => vec![n, d],
        };
        let mut x = values(&shape, 1);
        if let (Some(p), Some(first)) = (poison, x.iter_mut().next()) {
            *first = p;
        }
        let (wq, wk, wv) = (
            two(values(&[d, dk], 2)),
            two(values(&[d + wrong_rows, dk], 3)),
            two(values(&[d, dv], 4)),
        );
        let (bq, bk, bv) = (one(values(&[dk], 5)), one(values(&[dk], 6)), one(values(&[dv], 7)));
        let proj = with_proj.then(|| {
            let p = Projections::new(wq.view(), wk.view(), wv.view());
            if bias { p.with_bias(bq.view(), bk.view(), bv.view()) } else { p }
        });
        let mut op = Attention::new()
            .heads(heads)
            .causal(causal)
            .return_weights(weights_out)
            .options(Options::default().kernels(family).nan_fill(true));
        if let Some(s) = scale {
            op = op.scale(s);
        }

        let inputs = Inputs::x(&x).projections(proj.as_ref());
        let gpu = op.run(common::ctx(), inputs.clone());
        let cpu = reference::run(&op, &inputs);
        match (gpu, cpu) {
            (Ok(g), Ok(c)) => {
                OK_CASES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let bound = verify::tolerance(
                    reference::logit_bound(&op, x.view(), proj.as_ref()).unwrap(),
                );
                let (rel, _) = reference::compare(&g.context, &c.context);
                prop_assert!(rel <= bound, "context rel {rel} > {bound}");
                prop_assert_eq!(g.weights.is_some(), weights_out);
                if let (Some(gw), Some(cw)) = (&g.weights, &c.weights) {
                    let (wrel, _) = reference::compare(gw, cw);
                    prop_assert!(wrel <= bound, "weights rel {wrel} > {bound}");
                }
            }
            (Err(e), Err(_)) => prop_assert!(!e.to_string().is_empty()),
            // Only the adapter may refuse what the reference accepts: a kernel family it
            // lacks, or a size over its limits.
            (Err(e), Ok(_)) => prop_assert!(
                matches!(e, Error::LimitExceeded { .. })
                    || (family == Kernels::Subgroup && e.to_string().contains("subgroup")),
                "GPU refused a valid problem: {e}"
            ),
            (Ok(_), Err(e)) => prop_assert!(false, "GPU accepted bad input the reference refused: {e}"),
        }
    }
}

#[test]
fn property_cases_include_valid_ones() {
    // The sweep above must exercise the kernels, not only the argument checks.
    any_configuration_is_right_or_a_clear_error();
    let ok = OK_CASES.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        ok >= 10,
        "only {ok} of the random configurations were valid"
    );
}
