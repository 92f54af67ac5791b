//! `flash_blocked.wgsl`, the register-blocked fused kernel meant for GPUs, forced on the
//! default adapter (lavapipe in CI, where the tuner never picks it) and checked against the
//! f64 reference: odd sizes, causal, boolean and float masks, key lengths, grouped-query
//! `sdpa` with L ≠ S, f16 operands, head sizes 32 to 256, d_k ≠ d_v, every block shape the
//! tuner may try. Outputs are pre-filled with NaN, so a row no thread wrote fails.

mod common;

use wgpu_attention::internals::{BlockedOptions, FlashVariant, KeySplit};
use wgpu_attention::verify::{self, Case, MaskCase};
use wgpu_attention::{Attention, Context, Dtype, Inputs, Kernels, Options};

const BLOCKS: [FlashVariant; 4] = [
    FlashVariant::Blocked { rows: 64, keys: 64 },
    FlashVariant::Blocked { rows: 64, keys: 32 },
    FlashVariant::Blocked { rows: 32, keys: 64 },
    FlashVariant::Blocked {
        rows: 128,
        keys: 32,
    },
];

/// `case.op()` with its fused kernel forced to `v` and its keys split as `split`: the
/// options `Case::op` sets (the case's kernels, NaN-filled outputs) and these two, in one
/// `Options` (`Attention::options` sets every knob at once).
fn forced_split(case: &Case, v: FlashVariant, split: KeySplit) -> Attention {
    case.op().options(
        Options::default()
            .kernels(case.kernels)
            .nan_fill(true)
            .flash_variant(v)
            .key_split(split),
    )
}

/// `case.op()` with its fused kernel forced to `v` (see [`forced_split`]).
fn forced(case: &Case, v: FlashVariant) -> Attention {
    forced_split(case, v, KeySplit::Auto)
}

/// Runs each case fused with each of `variants` (those that fit the adapter) and collects
/// the failures.
fn check(cases: &[Case], variants: &[FlashVariant]) {
    check_on(common::ctx(), cases, variants);
}

/// [`check`] on `ctx`.
fn check_on(ctx: &Context, cases: &[Case], variants: &[FlashVariant]) {
    let mut failures = Vec::new();
    let mut ran = 0;
    for (i, case) in cases.iter().enumerate() {
        let case = case.on(Kernels::Storage, true);
        for &v in variants {
            let op = forced(&case, v);
            match verify::run_case_with(ctx, &case, op, 100 + i as u64) {
                Ok(r) if r.passed() => {
                    // The errors, for `--nocapture` (the README's f16 arithmetic bound).
                    eprintln!("{v} {r}");
                    ran += 1;
                }
                Ok(r) => failures.push(format!("{v} {r}")),
                // A block that does not fit this adapter (or a d_v too wide for its keys) is
                // refused with a limit error before anything runs.
                Err(wgpu_attention::Error::LimitExceeded { .. }) => {}
                Err(e) => failures.push(format!("{v} {case}: {e}")),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n{}",
        verify::HEADER,
        failures.join("\n")
    );
    assert!(
        ran >= cases.len(),
        "only {ran} runs for {} cases",
        cases.len()
    );
}

/// Self-attention without projections (Q = K = V = X) of one head of width `d`.
fn plain(n: usize, d: usize) -> Case {
    Case::new(n, d, d, d).weights(false)
}

#[test]
fn odd_sizes_and_causal_match_the_reference() {
    let mut cases = Vec::new();
    for n in [1, 7, 37, 300] {
        for causal in [false, true] {
            cases.push(plain(n, 64).causal(causal).batch(2));
        }
    }
    check(&cases, &BLOCKS);
}

#[test]
fn head_sizes_and_unequal_widths_match_the_reference() {
    let mut cases = Vec::new();
    for hs in [32, 80, 128, 256] {
        // Two heads of width hs each, projected, with biases; and causal without.
        cases.push(Case::new(37, 24, 2 * hs, 2 * hs).heads(2).bias(true));
        cases.push(plain(300, hs).causal(true));
    }
    // d_k ≠ d_v both ways, widths not multiples of 4, a custom scale.
    cases.push(Case::new(37, 12, 40, 24));
    cases.push(Case::new(300, 16, 26, 70).heads(2).scale(-0.3));
    check(&cases, &BLOCKS);
}

#[test]
fn masks_match_the_reference() {
    let mut cases = Vec::new();
    for mask in [MaskCase::Bool, MaskCase::Float, MaskCase::Lengths] {
        for (n, causal) in [(37, true), (300, false), (7, false)] {
            cases.push(
                Case::new(n, 16, 32, 32)
                    .mask(mask)
                    .causal(causal)
                    .heads(2)
                    .batch(2),
            );
        }
    }
    check(&cases, &BLOCKS[..1]);
}

#[test]
fn grouped_query_sdpa_with_other_key_counts_matches_the_reference() {
    let mut cases = Vec::new();
    for (n, n_kv, kv_heads, causal) in [
        (37, 300, 2, false),
        (300, 37, 1, true),
        (7, 130, 4, true),
        (1, 65, 2, false),
    ] {
        for mask in [MaskCase::None, MaskCase::Bool] {
            cases.push(
                Case::new(n, 16, 4 * 24, 4 * 40)
                    .heads(4)
                    .batch(2)
                    .causal(causal)
                    .mask(mask)
                    .sdpa((n_kv, kv_heads)),
            );
        }
    }
    check(&cases, &BLOCKS);
}

#[test]
fn f16_operands_match_the_reference() {
    let mut cases = Vec::new();
    for (n, hs, causal, mask) in [
        (300, 64, true, MaskCase::None),
        (37, 128, false, MaskCase::Float),
        (7, 80, true, MaskCase::Lengths),
    ] {
        cases.push(
            Case::new(n, 32, 2 * hs, 2 * hs)
                .dtype(Dtype::F16)
                .causal(causal)
                .mask(mask)
                .heads(2),
        );
    }
    cases.push(
        Case::new(37, 16, 64, 64)
            .dtype(Dtype::F16)
            .heads(2)
            .sdpa((90, 1)),
    );
    check(&cases, &BLOCKS[..2]);
}

#[test]
fn bad_block_shapes_are_errors() {
    let ctx = common::ctx();
    let case = plain(7, 16).on(Kernels::Storage, true);
    for v in [
        FlashVariant::Blocked { rows: 30, keys: 32 },
        FlashVariant::Blocked { rows: 0, keys: 32 },
    ] {
        let err = verify::run_case_with(ctx, &case, forced(&case, v), 1).unwrap_err();
        assert!(
            matches!(err, wgpu_attention::Error::InvalidArgument { .. }),
            "{v}: {err}"
        );
    }
}

/// Runs each case with its block shape unchecked (`unchecked`) and checked (`checked`) and
/// asserts the same bits.
fn twins(unchecked: &Context, checked: &Context, runs: &[(Case, FlashVariant)]) {
    assert!(!unchecked.runtime_checks() && checked.runtime_checks());
    for (case, v) in runs {
        let case = case.on(Kernels::Storage, true);
        let data = case.data(5);
        let (proj, mask) = (data.projections(), data.mask());
        let op = forced(&case, *v);
        let run = |ctx: &Context| {
            op.run(
                ctx,
                Inputs::x(&data.x).projections(proj.as_ref()).mask(&mask),
            )
            .map(|o| o.context)
        };
        match (run(unchecked), run(checked)) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{v} {case} {:?}", unchecked.blocked_options()),
            (Err(wgpu_attention::Error::LimitExceeded { .. }), Err(_)) => {}
            (a, b) => panic!("{v} {case}: {:?} vs {:?}", a.err(), b.err()),
        }
    }
}

#[test]
fn the_unchecked_kernel_equals_its_checked_twin_bit_for_bit() {
    // flash_blocked runs without naga's runtime checks (its indices are proven in bounds);
    // the same kernel with them must give the same bits, on sizes that fit no tile. One
    // block shape per case (each compiles twice on lavapipe, which is what takes time).
    let checked = |opts| ctx_with(opts).with_runtime_checks(true);
    // The adapter's default inner loop (on lavapipe: subgroup reductions at 64 × 32).
    let runs = [
        plain(37, 20).causal(true),
        Case::new(7, 24, 16, 40).heads(2),
        plain(100, 8).mask(MaskCase::Lengths),
        plain(150, 12).causal(true),
    ];
    let runs: Vec<_> = runs.into_iter().zip(BLOCKS).collect();
    twins(common::ctx(), &checked(BlockedOptions::default()), &runs);
    // Each option alone: the double buffer, subgroup reductions, f16 arithmetic, vector
    // loads (the defaults above have them wherever widths and strides are multiples of 4),
    // resident queries (the defaults above have them wherever they fit).
    let off = BlockedOptions::plain();
    let on = Some(true);
    // Subgroups hold a row group of 64 × 32 blocks (8 lanes of a 128-thread workgroup)?
    let info = common::ctx().adapter_info();
    let sgr = common::ctx()
        .device()
        .features()
        .contains(wgpu::Features::SUBGROUP)
        && info.subgroup_min_size >= 8
        && 128 % info.subgroup_max_size.max(1) == 0;
    let f16 = runs[1].0.dtype(Dtype::F16);
    let mut each = vec![
        (off.double_buffer(on), runs[0]),
        (off.f16_arithmetic(on), (f16, BLOCKS[1])),
        (off.vector_loads(on), (f16, BLOCKS[0])),
        (off.vector_loads(on), runs[1]),
        (off.resident_queries(on), runs[0]),
        (
            off.resident_queries(on).double_buffer(on).vector_loads(on),
            (f16, BLOCKS[0]),
        ),
    ];
    if sgr {
        each.push((off.subgroups(on), (runs[2].0, BLOCKS[1])));
    }
    for (opts, run) in each {
        twins(&ctx_with(opts), &checked(opts), &[run]);
    }
}

/// A context whose blocked kernel runs its inner loop as `opts` say.
fn ctx_with(opts: BlockedOptions) -> Context {
    Context::new()
        .unwrap()
        .with_tuning(false)
        .with_blocked_options(opts)
}

/// Odd sizes, causal, a mask, GQA with another key count, d_k ≠ d_v, in `dtype`.
fn inner_loop_cases(dtype: Dtype) -> Vec<Case> {
    vec![
        plain(300, 64).causal(true).batch(2).dtype(dtype),
        Case::new(37, 16, 32, 32)
            .mask(MaskCase::Bool)
            .causal(true)
            .heads(2)
            .dtype(dtype),
        Case::new(7, 16, 4 * 24, 4 * 40)
            .heads(4)
            .causal(true)
            .mask(MaskCase::Lengths)
            .sdpa((130, 2))
            .dtype(dtype),
        Case::new(37, 12, 2 * 80, 2 * 128).heads(2).dtype(dtype),
    ]
}

#[test]
fn each_inner_loop_alone_matches_the_reference() {
    // The default context runs every inner loop the adapter allows (the tests above); here
    // the plain loop, the double buffer alone, the subgroup reductions alone, the vector
    // loads alone, the resident queries alone, and everything a GPU turns on.
    let off = BlockedOptions::plain();
    let cases = inner_loop_cases(Dtype::F32);
    check_on(&ctx_with(off), &cases, &BLOCKS[..2]);
    let dbuf = off.double_buffer(true);
    check_on(&ctx_with(dbuf), &cases, &BLOCKS[..2]);
    // Subgroups hold a row group of 64 × 32 blocks (8 lanes) wherever they exist.
    let ctx = ctx_with(off.subgroups(None));
    check_on(&ctx, &cases, &BLOCKS[1..2]);
    let vec = off.vector_loads(true);
    check_on(&ctx_with(vec), &cases, &BLOCKS[..2]);
    let qres = off.resident_queries(true);
    check_on(&ctx_with(qres), &cases, &BLOCKS[..2]);
    let gpu = BlockedOptions::default()
        .double_buffer(true)
        .subgroups(None)
        .f16_arithmetic(true)
        .vector_loads(true)
        .resident_queries(true);
    check_on(&ctx_with(gpu), &cases, &BLOCKS[..2]);
    check_on(&ctx_with(gpu), &inner_loop_cases(Dtype::F16), &BLOCKS[..2]);
}

#[test]
fn f16_arithmetic_and_f32_arithmetic_on_f16_operands_match_the_reference() {
    let cases = inner_loop_cases(Dtype::F16);
    for f16_arithmetic in [Some(true), Some(false)] {
        let ctx = ctx_with(BlockedOptions::default().f16_arithmetic(f16_arithmetic));
        check_on(&ctx, &cases, &BLOCKS[..2]);
    }
}

#[test]
fn subgroups_asked_for_where_a_row_group_does_not_fit_are_an_error() {
    let ctx = ctx_with(BlockedOptions::default().subgroups(true));
    let info = ctx.adapter_info();
    // 128 × 128 blocks: row groups of 32 lanes, more than lavapipe's 8.
    let v = FlashVariant::Blocked {
        rows: 16,
        keys: 128,
    };
    let case = plain(7, 16).on(Kernels::Storage, true);
    let result = verify::run_case_with(&ctx, &case, forced(&case, v), 1);
    if info.subgroup_min_size < 32 {
        assert!(
            matches!(result, Err(wgpu_attention::Error::Unsupported { .. })),
            "{:?}",
            result.map(|r| r.to_string())
        );
    } else {
        assert!(result.unwrap().passed());
    }
}

#[test]
fn the_unchecked_split_kernel_equals_its_checked_twin_bit_for_bit() {
    // The key split's partials and their bounds, unchecked and checked: causal with a mask
    // of key lengths, 300 keys in 3 ranges of 64 × 32 blocks (ranges that start inside the
    // diagonal, and ranges wholly above it for the first query blocks).
    let checked = ctx_with(BlockedOptions::default()).with_runtime_checks(true);
    let case = plain(300, 20)
        .causal(true)
        .mask(MaskCase::Lengths)
        .on(Kernels::Storage, true);
    let data = case.data(5);
    let (proj, mask) = (data.projections(), data.mask());
    let op = forced_split(&case, BLOCKS[1], KeySplit::Ranges(3));
    let run = |ctx: &Context| {
        op.run(
            ctx,
            Inputs::x(&data.x).projections(proj.as_ref()).mask(&mask),
        )
        .unwrap()
        .context
    };
    assert_eq!(run(common::ctx()), run(&checked));
}
