//! `verify --dtype f16` cannot be fooled: every one of its cases is held to a bound under
//! 0.05 relative (the f64 reference on the f16-rounded operands, the bound from the kernels'
//! arithmetic, `verify::Expected`), the GPU's answer meets it, and a wrong answer does not:
//! the context replaced by zeros, by its own rows in another order, or by the f32 answer
//! to another seed fails every case.

mod common;

use std::time::Instant;

use ndarray::{ArrayD, Axis, IxDyn};
use wgpu_attention::verify::{self, Case, CaseData, Expected};
use wgpu_attention::{reference, Dtype, Inputs};

/// The cases `verify --dtype f16` runs on `ctx` with the CLI's defaults (the standard sweep
/// and 20 random cases from seed 0, on every path), each with its seed.
fn f16_cases(ctx: &wgpu_attention::Context) -> Vec<(Case, u64)> {
    let mut cases = verify::standard_cases();
    cases.extend(verify::random_cases(20, 0));
    verify::on_every_path(ctx, &cases)
        .into_iter()
        .enumerate()
        .map(|(i, c)| (c.dtype(Dtype::F16), i as u64))
        .collect()
}

/// `a` with its rows (every axis but the last, flattened) moved down by one, the last to
/// the top; a single row has its values moved along instead. `None` for a single value,
/// which has no other order.
fn rows_moved(a: &ArrayD<f32>) -> Option<ArrayD<f32>> {
    let width = a.shape().last().copied().unwrap_or(1).max(1);
    let rows = a.len() / width;
    let flat: Vec<f32> = a.iter().copied().collect();
    let moved: Vec<f32> = match (rows, width) {
        (0, _) | (1, 1) => return None,
        (1, _) => (0..width).map(|c| flat[(c + 1) % width]).collect(),
        _ => (0..rows)
            .flat_map(|r| {
                let from = (r + 1) % rows;
                flat[from * width..(from + 1) * width].iter().copied()
            })
            .collect(),
    };
    Some(ArrayD::from_shape_vec(IxDyn(a.shape()), moved).expect("same length"))
}

/// The f32 answer of `case` on the arrays of another seed: the reference on them, in f32.
fn answer_to_another_seed(case: &Case, seed: u64) -> ArrayD<f32> {
    let data: CaseData = case.data(seed.wrapping_add(1_000_003));
    let proj = data.projections();
    let mask = data.mask();
    let op = case.dtype(Dtype::F32).op();
    let out = match &data.qkv {
        None => {
            let inputs = Inputs::x(data.x.view()).mask(&mask);
            let inputs = match proj.as_ref() {
                Some(p) => inputs.projections(p),
                None => inputs,
            };
            reference::run(&op, &inputs)
        }
        Some([q, k, v]) => reference::run(&op, &Inputs::qkv(q, k, v).mask(&mask)),
    }
    .unwrap_or_else(|e| panic!("{case}: {e}"));
    out.context.mapv(|v| v as f32)
}

/// What went wrong with `case` (seed `seed`): a bound of 0.05 or more, a right answer that
/// fails (the GPU's with `gpu`, else the reference's in f32), or a sabotaged one that passes
/// (its context replaced by zeros, by its own rows in another order, by the f32 answer to
/// another seed; its weights kept). Also its bound, and whether its context has a single
/// value (no other order).
fn problems(
    ctx: &wgpu_attention::Context,
    case: &Case,
    seed: u64,
    gpu: bool,
) -> (Vec<String>, f64, bool) {
    let data = case.data(seed);
    let expected = Expected::new(ctx, case, &data).unwrap_or_else(|e| panic!("{case}: {e}"));
    let bound = expected.tolerance();
    let mut problems = Vec::new();
    if bound.is_nan() || bound >= 0.05 {
        problems.push(format!("{case}: bound {bound:.3e} ≥ 0.05"));
    }
    let (context, weights) = match gpu {
        true => {
            let out = pollster::block_on(verify::run_gpu(ctx, &case.op(), &data))
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            (out.context, out.weights)
        }
        false => {
            let cpu = expected.reference();
            let f32_of = |a: &ArrayD<f64>| a.mapv(|v| v as f32);
            let weights = cpu.weights.as_ref().filter(|_| !case.fused).map(f32_of);
            (f32_of(&cpu.context), weights)
        }
    };
    let weights = weights.as_ref();
    let r = expected.check(&context, weights);
    if !r.passed() {
        problems.push(format!("the right answer fails: {r}"));
    }
    let mut wrong = vec![("zeros", ArrayD::zeros(context.raw_dim()))];
    let moved = rows_moved(&context);
    let single = moved.is_none();
    wrong.extend(moved.map(|m| ("rows moved", m)));
    wrong.push((
        "another seed's f32 answer",
        answer_to_another_seed(case, seed),
    ));
    for (what, context) in wrong {
        let r = expected.check(&context, weights);
        if r.passed() {
            problems.push(format!("{what} passes: {r}"));
        }
    }
    (problems, bound, single)
}

/// Panics listing `problems`, if any.
fn assert_none(problems: &[String]) {
    assert!(
        problems.is_empty(),
        "{}\n{}",
        verify::HEADER,
        problems.join("\n")
    );
}

#[test]
fn every_f16_verify_case_has_a_bound_under_5e_2_that_a_wrong_answer_cannot_meet() {
    every_case_bounded(common::ctx());
}

/// The same under the GPU stand-in, whose plans take a GPU's f16 arithmetic
/// (`flash_blocked` with f16 operands and P in workgroup memory, and the
/// cooperative matrices' f16 inputs where they run), so its bounds have the terms lavapipe's
/// plans do not.
#[test]
fn every_f16_verify_case_under_the_stand_in_has_a_bound_under_5e_2_as_well() {
    static CTX: std::sync::OnceLock<wgpu_attention::Context> = std::sync::OnceLock::new();
    common::isolate();
    let ctx = CTX.get_or_init(|| {
        wgpu_attention::Context::new()
            .expect("GPU tests need an adapter")
            .with_stand_in(wgpu_attention::internals::StandIn::Gpu)
            .with_tuning(false)
            .with_tune_cache(wgpu_attention::TuneCache::at(None))
    });
    every_case_bounded(ctx);
}

/// Every f16 case `verify` runs on `ctx`: its bound under 0.05, the right answer passes it
/// and the wrong ones fail it.
fn every_case_bounded(ctx: &wgpu_attention::Context) {
    // The reference's answer in f32 stands in for the GPU's (which meets the bound as it
    // does: `verify --dtype f16`, and the test below on the largest logits), so that every
    // case is checked in seconds, without compiling its kernels.
    let start = Instant::now();
    let cases = f16_cases(ctx);
    let (mut all, mut worst, mut singles) = (Vec::new(), (0.0f64, String::new()), 0);
    for (case, seed) in &cases {
        let (problems, bound, single) = problems(ctx, case, *seed, false);
        all.extend(problems);
        if bound > worst.0 {
            worst = (bound, case.to_string());
        }
        singles += usize::from(single);
    }
    // A context of one value (the sweep's `1x3 dk=2 dv=1` with a batch of one) has no other
    // order of its rows; the other sabotages fail it.
    eprintln!(
        "stand-in {:?}: {} f16 cases in {:.1} s; largest bound {:.2e} ({}); {singles} contexts of one value",
        ctx.standing_in(),
        cases.len(),
        start.elapsed().as_secs_f64(),
        worst.0,
        worst.1
    );
    assert_none(&all);
    assert!(
        cases.len() >= 244 && singles * 61 <= cases.len(),
        "{singles}"
    );
}

#[test]
fn the_gpus_f16_answers_with_the_largest_logits_meet_their_bounds_and_sabotaged_fail() {
    // The cases whose logits are largest (X or Q, K scaled by 10 or 30): their bounds were
    // 2 to 24 relative against the reference on unrounded inputs.
    let ctx = common::ctx();
    let start = Instant::now();
    let cases: Vec<_> = f16_cases(ctx)
        .into_iter()
        .filter(|(c, _)| c.magnitude != 1.0)
        .collect();
    assert!(cases.len() >= 8, "{} cases", cases.len());
    let mut all = Vec::new();
    for (case, seed) in &cases {
        all.extend(problems(ctx, case, *seed, true).0);
    }
    eprintln!(
        "{} f16 cases on the GPU in {:.1} s",
        cases.len(),
        start.elapsed().as_secs_f64()
    );
    assert_none(&all);
}

#[test]
fn rows_moved_moves_rows_or_the_values_of_a_single_row() {
    let a = ArrayD::from_shape_vec(IxDyn(&[2, 2, 3]), (0..12).map(|v| v as f32).collect()).unwrap();
    let moved = rows_moved(&a).unwrap();
    assert_eq!(
        moved
            .index_axis(Axis(0), 0)
            .iter()
            .copied()
            .collect::<Vec<_>>(),
        vec![3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    );
    assert_eq!(moved[[1, 1, 2]], 2.0);
    let row = ArrayD::from_shape_vec(IxDyn(&[1, 3]), vec![1.0, 2.0, 3.0]).unwrap();
    assert_eq!(
        rows_moved(&row).unwrap().as_slice().unwrap(),
        &[2.0, 3.0, 1.0]
    );
    assert!(rows_moved(&ArrayD::from_elem(IxDyn(&[1, 1, 1]), 1.0)).is_none());
}
