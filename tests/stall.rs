//! The first call: where its time goes (`--timings`), tiny calls planned for the least
//! compiling, and `wgpu-attention tune` warming the caches ahead of time (no first call stalls).

mod common;

#[test]
fn timings_flag_reports_every_phase_of_demo() {
    let out = common::bin()
        .args(["demo", "--timings"])
        .output()
        .expect("binary runs");
    common::ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("timings"))
        .unwrap_or_else(|| panic!("no timings line in:\n{stderr}"));
    for phase in [
        "adapter",
        "compile",
        "pipelines",
        "tune",
        "upload",
        "record",
        "dispatch",
        "readback",
        "total",
    ] {
        assert!(line.contains(phase), "{phase} missing from {line}");
    }
}

#[test]
fn info_log_has_each_calls_timings() {
    let out = common::bin()
        .args(["demo"])
        .env("RUST_LOG", "wgpu_attention=info")
        .output()
        .expect("binary runs");
    common::ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("timings: adapter") && stderr.contains("dispatch"),
        "{stderr}"
    );
}

use wgpu_attention::internals::MatmulVariant;
use wgpu_attention::internals::TINY_ROWS;
use wgpu_attention::ndarray::{Array1, Array2, Array3, ArrayD, Dimension, IxDyn};
use wgpu_attention::{reference, Attention, Dims, Inputs, Kernels, Mask, Options, Projections};

fn smooth(shape: &[usize], salt: usize) -> ArrayD<f32> {
    ArrayD::from_shape_fn(IxDyn(shape), |i| {
        let k: usize = i.slice().iter().enumerate().map(|(a, v)| v * (a + 3)).sum();
        (((k * 7 + salt * 13) % 29) as f32 - 14.0) / 9.0
    })
}

#[test]
fn tiny_calls_plan_the_variants_cheapest_to_compile() {
    let ctx = common::ctx();
    let dims = |batch: usize, n: usize| {
        // Dims are read from inputs: an X of that shape.
        let x = ArrayD::<f32>::zeros(IxDyn(&[batch, n, 32]));
        Dims::new(&Attention::new().heads(4), &Inputs::x(&x)).unwrap()
    };
    let lavapipe_like = ctx.subgroup_size().is_some()
        && ctx.adapter_info().device_type == wgpu_attention::wgpu::DeviceType::Cpu;
    for weights in [true, false] {
        let op = Attention::new().heads(4).return_weights(weights);
        let plan = op.plan(ctx, &dims(2, TINY_ROWS / 2)).unwrap();
        if lavapipe_like {
            // One row per lane, scores → softmax → weighted sum with or without the weights:
            // no flash_subgroup, no statistics-epilogue matmul.
            assert_eq!(plan.matmul, MatmulVariant::Subgroup { rows_per_lane: 1 });
            assert!(!plan.fused && !plan.weights_from_stats(), "{plan}");
            assert_eq!(plan.family(), Kernels::Storage);
        } else {
            assert_eq!(plan.fused, !weights);
            assert_eq!(plan.matmul, MatmulVariant::Tiled);
        }
        // A forced family or variant is obeyed whatever the size.
        let storage = Options::default().kernels(Kernels::Storage);
        let forced = op.options(storage).plan(ctx, &dims(1, 5)).unwrap();
        assert_eq!(forced.family(), Kernels::Storage);
        assert_eq!(forced.fused, !weights);
    }
    if lavapipe_like {
        // Past the threshold the family's default (two rows per lane) comes back: on a
        // context whose tuning cache is empty (the tests' shared one may remember a choice).
        let fresh = wgpu_attention::Context::new()
            .unwrap()
            .with_tuning(false)
            .with_tune_cache(wgpu_attention::TuneCache::at(None));
        let big = Attention::new()
            .heads(4)
            .plan(&fresh, &dims(1, TINY_ROWS + 1))
            .unwrap();
        assert_ne!(big.matmul, MatmulVariant::Subgroup { rows_per_lane: 1 });
    }
}

#[test]
fn tiny_calls_match_the_reference_with_and_without_weights() {
    let ctx = common::ctx();
    let (d, dk, dv, heads) = (12, 8, 12, 2);
    let wq = Array2::from_shape_fn((d, dk), |(i, j)| ((i * 5 + j * 3) % 7) as f32 / 7.0 - 0.4);
    let wk = Array2::from_shape_fn((d, dk), |(i, j)| ((i * 3 + j * 5) % 11) as f32 / 11.0 - 0.5);
    let wv = Array2::from_shape_fn((d, dv), |(i, j)| ((i + j * 7) % 13) as f32 / 13.0 - 0.5);
    let (bq, bk, bv) = (
        Array1::from_elem(dk, 0.1f32),
        Array1::from_elem(dk, -0.2f32),
        Array1::from_elem(dv, 0.3f32),
    );
    let proj = Projections::new(wq.view(), wk.view(), wv.view()).with_bias(
        bq.view(),
        bk.view(),
        bv.view(),
    );
    for (batch, n) in [(1, 1), (1, 7), (2, 7), (1, 37)] {
        let mut x = smooth(&[batch, n, d], n);
        x[[0, 0, 0]] = 60.0; // large logits in the first row
        let keep = Array3::from_shape_fn((batch, n, n), |(b, i, j)| (i + j + b) % 5 != 1 || j == 0);
        let masks = [Mask::none(), Mask::boolean(keep.view().into_dyn())];
        for causal in [false, true] {
            for (m, mask) in masks.iter().enumerate() {
                for weights in [true, false] {
                    let op = Attention::new()
                        .heads(heads)
                        .causal(causal)
                        .return_weights(weights)
                        .options(Options::default().nan_fill(true));
                    let case =
                        format!("batch {batch} n {n} causal {causal} mask {m} weights {weights}");
                    let inputs = Inputs::x(&x).projections(&proj).mask(mask);
                    let got = op.run(ctx, inputs.clone()).unwrap();
                    let want = reference::run(&op, &inputs).unwrap();
                    let (rel, max) = reference::compare(&got.context, &want.context);
                    assert!(
                        rel < 1e-5 && max < 1e-4,
                        "{case}: context rel {rel:e} max {max:e}"
                    );
                    assert_eq!(got.weights.is_some(), weights, "{case}");
                    if let (Some(g), Some(w)) = (&got.weights, &want.weights) {
                        let (rel, max) = reference::compare(g, w);
                        assert!(
                            rel < 1e-5 && max < 1e-5,
                            "{case}: weights rel {rel:e} max {max:e}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn tune_command_fills_both_caches_in_the_directory_named() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("tune.json");
    let out = common::bin()
        .args(["tune", "--n", "7,256", "--d", "16", "--kernels", "storage"])
        .env("WGPU_ATTENTION_TUNE_CACHE", &cache)
        .env_remove("WGPU_ATTENTION_TUNE")
        .output()
        .expect("binary runs");
    let stdout = common::ok(&out);
    assert!(stdout.contains(&cache.display().to_string()), "{stdout}");
    // One line per length and path, naming the variants chosen.
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("n ")).count(),
        4,
        "{stdout}"
    );
    assert!(stdout.contains("flash-tiled"), "{stdout}");
    let choices = std::fs::read_to_string(&cache).expect("tune.json written");
    assert!(choices.contains("flash f32 storage"), "{choices}");
    // The compiled pipelines beside it, where the driver has a pipeline cache.
    let ctx = common::ctx();
    let info = ctx.adapter_info();
    let supported = ctx
        .device()
        .features()
        .contains(wgpu_attention::wgpu::Features::PIPELINE_CACHE);
    if let Some(key) = wgpu_attention::wgpu::util::pipeline_cache_key(&info).filter(|_| supported) {
        assert!(dir.path().join(format!("{key}.bin")).exists());
    }
}

#[test]
fn tune_command_without_a_width_is_a_clear_error() {
    let out = common::cli(&["tune", "--n", "9"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--d"), "{stderr}");
}
