//! The autotuner on a real adapter: it picks one of its candidates, remembers the choice in
//! its file, does not measure problems too small to matter, and the op it tunes still
//! matches the reference.

use std::collections::HashMap;

use ndarray::Array3;

use crate::settings::TuneCache;
use crate::tune::{self, fastest, fastest_within, Bucket, MIN_TUNED_N};
use crate::verify::{self, Case};
use crate::{reference, Attention, Context, Dtype, Kernels};

#[test]
fn tuned_choice_is_a_candidate_and_is_remembered_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tune.json");
    let ctx = Context::new()
        .unwrap()
        .with_tuning(true)
        .with_tune_cache(TuneCache::at(Some(path.clone())));
    let fam = Kernels::available(&ctx);

    // Too small to measure: the default, and nothing written.
    let small = tune::flash(&ctx, (&fam, Dtype::F32), (16, 16), (64, MIN_TUNED_N - 1)).unwrap();
    assert_eq!(small, tune::default_flash(&ctx, fam[0], (4, 4)));
    assert!(!path.exists(), "a small problem must not be measured");

    let chosen = tune::flash(&ctx, (&fam, Dtype::F32), (16, 16), (1, 1024)).unwrap();
    assert!(tune::flash_candidates(&ctx, &fam, 4, 4, Dtype::F32).contains(&chosen));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("dk4=4 dv4=4 g~1 n~1024"), "{text}");

    // A new context on the same file (not measuring further) reuses the choice for the same
    // bucket of sizes.
    let again = Context::new()
        .unwrap()
        .with_tuning(false)
        .with_tune_cache(TuneCache::at(Some(path)));
    assert_eq!(
        tune::flash(&again, (&fam, Dtype::F32), (16, 16), (1, 2047)).unwrap(),
        chosen
    );
    assert_eq!(
        tune::flash(&again, (&fam, Dtype::F32), (13, 16), (1, 1500)).unwrap(),
        chosen,
        "widths round up to whole vec4s and n to its bucket, so these share the choice"
    );
}

#[test]
fn auto_kernels_after_tuning_match_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Context::new()
        .unwrap()
        .with_tuning(true)
        .with_tune_cache(TuneCache::at(Some(dir.path().join("tune.json"))));
    let x = Array3::from_shape_fn((1, 300, 32), |(_, i, j)| {
        ((i * 5 + j * 3) as f32 * 0.11).sin()
    });
    for weights in [false, true] {
        let op = Attention::new()
            .heads(2)
            .causal(true)
            .options(
                crate::Options::default()
                    .kernels(Kernels::Auto)
                    .nan_fill(true),
            )
            .return_weights(weights);
        let gpu = op.run(&ctx, crate::Inputs::x(&x)).unwrap();
        let cpu = reference::run(&op, &crate::Inputs::x(&x)).unwrap();
        let (rel, _) = reference::compare(&gpu.context, &cpu.context);
        assert!(rel < 1e-5, "weights={weights}: rel {rel}");
    }
}

#[test]
fn every_candidate_variant_matches_the_reference() {
    // Every variant autotuning may pick, not only the one it picks here: each fused variant
    // with and without the weights, each matmul variant in the projections.
    let ctx = crate::context::test_context();
    let fam = Kernels::available(ctx);
    let cases = [
        Case {
            heads: 2,
            causal: true,
            bias: true,
            batch: Some(2),
            ..Case::new(37, 12, 10, 14)
        },
        Case {
            causal: false,
            ..Case::new(300, 16, 64, 64)
        },
    ];
    let mut failures = Vec::new();
    for case in &cases {
        let data = case.data(5);
        let proj = data.projections();
        let inputs = crate::Inputs::x(&data.x).projections(proj.as_ref());
        let reference = reference::run(&case.op(), &inputs).unwrap();
        let bound = verify::tolerance(
            reference::logit_bound(&case.op(), data.x.view(), proj.as_ref()).unwrap(),
        );
        let flash = tune::flash_candidates(ctx, &fam, 16, 16, Dtype::F32);
        let matmul = tune::matmul_candidates(ctx, &fam, Dtype::F32);
        for (i, &fv) in flash.iter().enumerate() {
            for weights in [false, true] {
                let mv = matmul[i % matmul.len()];
                let op = case.op().return_weights(weights).options(
                    crate::Options::default()
                        .kernels(case.kernels)
                        .flash_variant(fv)
                        .matmul_variant(mv)
                        .nan_fill(true),
                );
                let gpu = op.run(ctx, inputs.clone()).unwrap();
                let (rel, _) = reference::compare(&gpu.context, &reference.context);
                let wrel = match (&gpu.weights, &reference.weights) {
                    (Some(g), Some(r)) => reference::compare(g, r).0,
                    _ => 0.0,
                };
                if !(rel <= bound && wrel <= bound) || weights != gpu.weights.is_some() {
                    failures.push(format!(
                        "{case} {fv} {mv} weights={weights}: {rel:e} {wrel:e}"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn fastest_picks_the_lowest_time_and_drops_slow_candidates_early() {
    let times = std::cell::RefCell::new(HashMap::from([(1, 10.0), (2, 3.0), (3, 100.0)]));
    let mut calls = HashMap::new();
    let best = fastest(&[1, 2, 3], |c| {
        *calls.entry(c).or_insert(0) += 1;
        Ok(times.borrow()[&c])
    })
    .unwrap();
    assert_eq!(best, Some(2));
    assert_eq!(calls[&3], 2, "warm-up, then a 5x slower first run ends it");
    times.borrow_mut().clear();
}

#[test]
fn the_blocked_kernel_is_offered_on_gpus_only() {
    use crate::variant::FlashVariant;
    let ctx = crate::context::test_context();
    let cpu = ctx.adapter_info().device_type == wgpu::DeviceType::Cpu;
    let offered = tune::flash_candidates(ctx, &[Kernels::Storage], 16, 16, Dtype::F32);
    let blocked = |v: &FlashVariant| matches!(v, FlashVariant::Blocked { .. });
    if cpu {
        assert!(
            !offered.iter().any(blocked),
            "lavapipe keeps its own kernels"
        );
    } else {
        assert!(offered.iter().all(blocked), "{offered:?}");
    }
    // Under a GPU's limits every shape fits at d = 64; at d = 256, 32 keys per tile would
    // leave each thread 8 output vec4s (spills), so that shape is not offered.
    let gpu = tune::sources::gpu_limits();
    assert_eq!(tune::candidates::blocked_candidates(&gpu, 16, 16).len(), 4);
    let at_256 = tune::candidates::blocked_candidates(&gpu, 64, 64);
    for keys_32 in [(64, 32), (128, 32)] {
        let (rows, keys) = keys_32;
        assert!(!at_256.contains(&FlashVariant::Blocked { rows, keys }));
    }
}

#[test]
fn gpus_default_to_and_choose_among_spill_free_blocked_variants_only() {
    use crate::gpu::hardware::Decisions;
    use crate::variant::FlashVariant;
    use wgpu::DeviceType::{Cpu, DiscreteGpu, IntegratedGpu, Other, VirtualGpu};
    let gpu = tune::sources::gpu_limits();
    let tiled = FlashVariant::Tiled { keys: 32 };
    let is_blocked = |v: &FlashVariant| matches!(v, FlashVariant::Blocked { .. });
    for d in tune::sources::HEAD_SIZES {
        let w4 = d.div_ceil(4) as u32;
        for device in [DiscreteGpu, IntegratedGpu, VirtualGpu, Other] {
            let (default, candidates) =
                tune::candidates::storage_flash(&Decisions::of(device), &gpu, (w4, w4));
            assert!(is_blocked(&default), "d = {d} on {device:?}: {default}");
            assert!(candidates.contains(&default), "d = {d}: {candidates:?}");
            assert!(candidates.iter().all(is_blocked), "d = {d}: {candidates:?}");
            let by_family = tune::candidates::default_flash_on(
                &Decisions::of(device),
                &gpu,
                Kernels::Storage,
                (w4, w4),
            );
            assert_eq!(by_family, default);
            assert_eq!(
                tune::candidates::default_flash_on(
                    &Decisions::of(device),
                    &gpu,
                    Kernels::Subgroup,
                    (w4, w4)
                ),
                FlashVariant::Subgroup { rows_per_lane: 2 }
            );
        }
        // A CPU adapter keeps flash_tiled, default and candidates.
        let (default, candidates) =
            tune::candidates::storage_flash(&Decisions::of(Cpu), &gpu, (w4, w4));
        assert_eq!(default, tiled);
        assert_eq!(candidates, tune::candidates::tiled_candidates(&gpu, w4, w4));
    }
    // 64 × 64 blocks (256 threads) first; a device with 128 threads per workgroup gets the
    // shapes that fit it.
    let (default, _) = tune::candidates::storage_flash(&Decisions::of(DiscreteGpu), &gpu, (16, 16));
    assert_eq!(default, FlashVariant::Blocked { rows: 64, keys: 64 });
    let small = wgpu::Limits {
        max_compute_invocations_per_workgroup: 128,
        ..gpu.clone()
    };
    let (default, candidates) =
        tune::candidates::storage_flash(&Decisions::of(DiscreteGpu), &small, (16, 16));
    assert_eq!(default, FlashVariant::Blocked { rows: 64, keys: 32 });
    assert!(!candidates.contains(&FlashVariant::Blocked { rows: 64, keys: 64 }));
    // No block shape fits (d = 512 needs 8 output vec4s a thread; 4 KiB of workgroup
    // memory): flash_tiled, on a GPU too.
    let (default, candidates) =
        tune::candidates::storage_flash(&Decisions::of(DiscreteGpu), &gpu, (128, 128));
    assert_eq!(default, tiled);
    assert!(!candidates.iter().any(is_blocked), "{candidates:?}");
    let tiny = wgpu::Limits {
        max_compute_workgroup_storage_size: 4 << 10,
        ..gpu.clone()
    };
    assert_eq!(
        tune::candidates::storage_flash(&Decisions::of(IntegratedGpu), &tiny, (16, 16)).0,
        tiled
    );
}

#[test]
fn every_written_shader_is_the_validated_source_of_a_variant() {
    let dir = tempfile::tempdir().unwrap();
    let files = tune::sources::write(dir.path(), Some(8)).unwrap();
    for want in [
        "storage/flash-blocked-64x64-d64-f32.wgsl",
        "storage/flash-blocked-64x64-d128-f16.wgsl",
        "storage/flash-blocked-32x64-d256-f32.wgsl",
        "storage/flash-blocked-64x64-d64-f32-wg48k.wgsl",
        "storage/matmul-f32.wgsl",
        "storage/matmul-f16-abc.wgsl",
        "storage/softmax-mask1-f32.wgsl",
        "storage/weighted-sum-f16.wgsl",
        "subgroup/flash-subgroup-r2-d128-f16-sg8.wgsl",
        "coop/coop-matmul-16-f32.wgsl",
        "coop/flash-coop-16-d128-f16.wgsl",
        // Subgroups of 16 to 64 lanes: 32 query rows; of 32 lanes, 64.
        "coop/flash-coop-16-d128-f16-sg32.wgsl",
    ] {
        assert!(files.contains(&dir.path().join(want)), "{want} missing");
    }
    assert!(!files.contains(&dir.path().join("storage/flash-blocked-64x32-d256-f32.wgsl")));
    // flash_coop takes its largest block at d = 128 from 32 KiB: no `-wg48k` or `-wg64k` file.
    assert!(!files.contains(&dir.path().join("coop/flash-coop-16-d128-f16-wg48k.wgsl")));
    assert!(!files.contains(&dir.path().join("coop/flash-coop-16-d128-f16-wg64k.wgsl")));
    // 48 KiB of workgroup memory (NVIDIA, and AMD's 64) widens the Q/K chunks: another
    // variant; 64 KiB adds none to the storage family but double-buffered ones (two buffers
    // of wider chunks).
    let wide = dir
        .path()
        .join("storage/flash-blocked-64x64-d64-f32-wg48k.wgsl");
    assert!(std::fs::read_to_string(wide)
        .unwrap()
        .contains("const DC4: u32 = 8u;"));
    assert!(!files
        .iter()
        .filter(|f| f.starts_with(dir.path().join("storage")))
        .map(|f| f.display().to_string())
        .any(|f| f.contains("wg64k") && !f.contains("-dbuf")));
    for want in [
        "storage/flash-blocked-64x64-d64-f32-dbuf-sgr-wg64k.wgsl",
        "storage/flash-blocked-64x64-d128-f16-dbuf-sgr-hmul.wgsl",
        "storage/flash-blocked-64x32-d64-f32-sgr.wgsl",
    ] {
        assert!(files.contains(&dir.path().join(want)), "{want} missing");
    }
    // f16 arithmetic is left out where it would spill (4 output vec4s per thread).
    assert!(!files
        .iter()
        .any(|f| f.ends_with("flash-blocked-64x32-d128-f16-hmul.wgsl")));
    // flash_tiled is lavapipe's: a GPU never runs it unless asked.
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let gpu_families = ["storage", "coop", "subgroup"].map(|f| dir.path().join(f));
    assert!(
        !files
            .iter()
            .any(|f| gpu_families.iter().any(|g| f.starts_with(g))
                && f.display().to_string().contains("flash-tiled")),
        "{names:?}"
    );
    assert!(names.iter().any(|f| f.contains("cpu/flash-tiled")));
    // The subgroup family past 8 lanes and the stand-in's emulated sources are left to the
    // static gates (`static_gates_ci`, which parse and validate every file): unrolled over
    // 16-64 lanes, naga takes minutes on them.
    let wide = ["-sg16.wgsl", "-sg32.wgsl", "-sg64.wgsl"];
    let stand_in = dir.path().join("stand-in");
    let checked = files.iter().filter(|f| {
        !f.starts_with(&stand_in) && !wide.iter().any(|w| f.display().to_string().ends_with(w))
    });
    for f in checked {
        let text = std::fs::read_to_string(f).unwrap();
        let module = naga::front::wgsl::parse_str(&text)
            .unwrap_or_else(|e| panic!("{}: {}", f.display(), e.emit_to_string(&text)));
        naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        )
        .validate(&module)
        .unwrap_or_else(|e| panic!("{}: {e:?}", f.display()));
    }
    // A file where a directory must go is an error, not a panic.
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, "").unwrap();
    assert!(matches!(
        tune::sources::write(&blocker, None),
        Err(crate::Error::Io { .. })
    ));
}

#[test]
fn buckets_round_down_so_the_measured_problem_is_never_larger_than_the_call() {
    let b = Bucket::of(12, 300);
    assert_eq!((b.groups, b.n), (8, 256));
    assert!((b.scale - 12.0 * 300.0 * 300.0 / (8.0 * 256.0 * 256.0)).abs() < 1e-9);
    let b = Bucket::of(1, 1024);
    assert_eq!((b.groups, b.n, b.scale), (1, 1024, 1.0));
    // Capped: the scale carries the rest.
    let b = Bucket::of(1000, 100_000);
    assert_eq!((b.groups, b.n), (64, 4096));
    assert!(b.scale > 1000.0);
}

#[test]
fn each_bucket_has_its_own_choice_and_tiny_calls_never_tune() {
    let ctx = Context::new()
        .unwrap()
        .with_tuning(true)
        .with_tune_cache(TuneCache::at(None));
    let fam = Kernels::available(&ctx);
    tune::flash(&ctx, (&fam, Dtype::F32), (16, 16), (1, MIN_TUNED_N - 1)).unwrap();
    assert!(ctx.tune_cache().keys().is_empty(), "a tiny call measured");
    tune::flash(&ctx, (&fam, Dtype::F32), (16, 16), (1, 300)).unwrap();
    tune::flash(&ctx, (&fam, Dtype::F32), (16, 16), (2, 300)).unwrap();
    let keys = ctx.tune_cache().keys();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(keys.iter().any(|k| k.ends_with("g~1 n~256")), "{keys:?}");
    assert!(keys.iter().any(|k| k.ends_with("g~2 n~256")), "{keys:?}");
}

#[test]
fn measuring_stops_before_passing_the_calls_estimated_time_and_resumes_later() {
    // Fake clock: each timed run advances it by the candidate's time; measuring one costs
    // 4 runs (a warm-up and three).
    let times = HashMap::from([(1, 10.0), (2, 9.0), (3, 1.0), (4, 2.0)]);
    let now = std::cell::Cell::new(0.0);
    let mut clock = || now.get();
    let runs = std::cell::RefCell::new(Vec::new());
    let time = |c: i32| {
        runs.borrow_mut().push(c);
        now.set(now.get() + times[&c]);
        Ok(times[&c])
    };
    // A call of the bucket's size: the default (1, 10 ms a run, 40 ms to measure) is all it
    // measures, since the next would cost about 40 ms more than its 10.
    let p = fastest_within(&[1, 2, 3, 4], None, 1.0, &mut clock, time)
        .unwrap()
        .unwrap();
    assert_eq!((p.best, p.ms, p.measured, p.cost), (1, 10.0, 1, 40.0));
    assert_eq!(*runs.borrow(), [1, 1, 1, 1]);
    // A call 4.5 times the bucket's work (estimate 45 ms) goes on: candidate 2 (predicted
    // 40, cost 36), then 36 + 36 would pass 45: 3 and 4 wait.
    runs.borrow_mut().clear();
    let p = fastest_within(&[1, 2, 3, 4], Some(p), 4.5, &mut clock, time)
        .unwrap()
        .unwrap();
    assert_eq!((p.best, p.measured, p.cost), (2, 2, 36.0));
    assert_eq!(*runs.borrow(), [2, 2, 2, 2]);
    // The next such call (estimate 9 × 4.5 = 40.5 ms): 3 (predicted 36, cost 4), then 4.
    runs.borrow_mut().clear();
    let p = fastest_within(&[1, 2, 3, 4], Some(p), 4.5, &mut clock, time)
        .unwrap()
        .unwrap();
    assert_eq!((p.best, p.ms, p.measured), (3, 1.0, 4));
    assert_eq!(*runs.borrow(), [3, 3, 3, 3, 4, 4, 4, 4]);
    // Unbudgeted (wgpu-attention tune): everything at once.
    let p = fastest_within(&[1, 2, 3, 4], None, f64::INFINITY, &mut clock, time)
        .unwrap()
        .unwrap();
    assert_eq!((p.best, p.measured), (3, 4));
}

#[test]
fn a_block_sparse_call_weighs_compiling_against_running() {
    use crate::tune::{choice_key, flash_bucket, sparse_flash, Measured, Progress};
    use crate::variant::FlashVariant;
    let dir = tempfile::tempdir().unwrap();
    let ctx = Context::new()
        .unwrap()
        .with_tuning(false)
        .with_tune_cache(TuneCache::at(Some(dir.path().join("tune.json"))));
    // Widths of 11 vec4s: a bucket no other test's calls share (the rent-or-buy account is
    // per bucket and per process).
    let fam = [Kernels::Subgroup, Kernels::Storage];
    let shape = ((44, 44), (1, 16384));
    let (r1, r4) = (
        FlashVariant::Subgroup { rows_per_lane: 1 },
        FlashVariant::Subgroup { rows_per_lane: 4 },
    );
    // At the bucket (one head of 4096 rows, 1/16 of the call's work): r=4 runs in 200 ms and
    // compiles in 400, r=1 runs in 250 and compiles in 60; a storage kernel of another
    // family, faster still, is never taken for a subgroup plan.
    let runs = vec![
        Measured {
            variant: r4,
            ms: 200.0,
            compile_ms: 400.0,
        },
        Measured {
            variant: r1,
            ms: 250.0,
            compile_ms: 60.0,
        },
        Measured {
            variant: FlashVariant::Tiled { keys: 32 },
            ms: 1.0,
            compile_ms: 0.0,
        },
    ];
    let key = choice_key(
        &ctx,
        &fam,
        "flash",
        &flash_bucket(shape.0, shape.1).1,
        Dtype::F32,
    );
    let progress = Progress {
        best: r4,
        ms: 200.0,
        measured: 3,
        cost: 0.0,
        runs,
    };
    ctx.tune_cache().put(&key, &progress);
    // Dense, or no measurements for the bucket: the tuner's choice.
    assert_eq!(
        sparse_flash(&ctx, (&fam, Dtype::F32), shape, r4, 1.0, |_| false),
        r4
    );
    let other = ((40, 40), (1, 16384));
    assert_eq!(
        sparse_flash(&ctx, (&fam, Dtype::F32), other, r4, 0.035, |_| false),
        r4
    );
    // 3.5 % of the blocks to visit (a 511-key window over 16384 causal rows): r=4 costs
    // 16 · 0.035 · 200 = 112 ms + 400 compiling, r=1 140 + 60. With r=4 made already, r=4.
    assert_eq!(
        sparse_flash(&ctx, (&fam, Dtype::F32), shape, r4, 0.035, |v| v == r4),
        r4
    );
    // Rent or buy: every r=1 call loses 28 ms to r=4, and once the loss passes r=4's
    // compiling less its 28 ms lead (372 ms: the 14th call), r=4 is compiled.
    let mut calls = 0;
    while sparse_flash(&ctx, (&fam, Dtype::F32), shape, r4, 0.035, |v| v == r1) == r1 {
        calls += 1;
        assert!(calls < 100, "r=4 is never compiled");
    }
    assert_eq!(calls, 14, "r=1 until its losses pay for r=4's compiling");
}

/// The H100's f16 failure came from here: the tuning cache's key had no dtype, so an f16 call
/// took a matmul measured for f32 (the cooperative-matrix one, never run with f16 storage).
/// Now each dtype has its own choices, and the tensor-core kernels (f16 inputs) are offered
/// to f16 calls only.
#[test]
fn an_f16_call_never_takes_a_choice_made_for_f32() {
    let ctx = Context::new()
        .unwrap()
        .with_tuning(false)
        .with_tune_cache(TuneCache::at(None));
    let fam = [Kernels::Storage];
    let f32_key = tune::choice_key(&ctx, &fam, "matmul", "", Dtype::F32);
    let f16_key = tune::choice_key(&ctx, &fam, "matmul", "", Dtype::F16);
    assert_ne!(f32_key, f16_key);
    assert!(f16_key.contains("f16"), "{f16_key}");
    // A choice remembered for f32 (a variant both dtypes may run) reaches f32 calls only.
    let chosen = crate::variant::MatmulVariant::Subgroup { rows_per_lane: 4 };
    let progress = tune::Progress {
        best: chosen,
        ms: 1.0,
        measured: 99,
        cost: 0.0,
        runs: Vec::new(),
    };
    let fam = [Kernels::Subgroup];
    ctx.tune_cache().put(
        &tune::choice_key(&ctx, &fam, "matmul", "", Dtype::F32),
        &progress,
    );
    assert_eq!(tune::matmul(&ctx, (&fam, Dtype::F32), 10).unwrap(), chosen);
    assert_eq!(
        tune::matmul(&ctx, (&fam, Dtype::F16), 10).unwrap(),
        tune::default_matmul(Kernels::Subgroup)
    );
    // tests/stand_in.rs: the tensor cores' f16 inputs are offered to f16 calls only.
}
