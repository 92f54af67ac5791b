//! The GPU stand-in (`WGPU_ATTENTION_STAND_IN=gpu`, `Context::with_stand_in`): a CPU
//! adapter taking every decision a discrete GPU takes, and the two paths that gave wrong
//! answers on an H100 run through it against the f64 reference. CI runs the rest of the GPU's
//! variants under it with `verify --quick --variants` (.ci/run).

mod common;

use wgpu_attention::internals::{FlashVariant, MatmulVariant, StandIn};
use wgpu_attention::verify::{self, Case, MaskCase, ModsCase};
use wgpu_attention::{Context, Dtype, Kernels, TuneCache};

fn stand_in() -> &'static Context {
    static CTX: std::sync::OnceLock<Context> = std::sync::OnceLock::new();
    common::isolate();
    CTX.get_or_init(|| {
        Context::new()
            .expect("GPU tests need an adapter")
            .with_stand_in(StandIn::Gpu)
            .with_tuning(false)
            .with_tune_cache(TuneCache::at(None))
    })
}

#[test]
fn the_stand_in_takes_a_gpus_decisions() {
    let ctx = stand_in();
    let info = ctx.adapter_info();
    // The adapter's own workgroup memory: where it is less than the 48 KiB the stand-in plans
    // for (lavapipe's 32), the adapter line says so.
    let granted = Context::new()
        .expect("GPU tests need an adapter")
        .with_stand_in(StandIn::Off)
        .limits()
        .max_compute_workgroup_storage_size;
    let mut want = "standing in for a GPU (32-lane subgroups)".to_string();
    if granted < 48 << 10 {
        want += &format!(
            ", pretending 48 KiB of workgroup memory (the device grants {} KiB)",
            granted >> 10
        );
    }
    assert!(info.name.ends_with(&want), "{} / {want}", info.name);
    assert_eq!(
        info.device_type,
        wgpu_attention::wgpu::DeviceType::DiscreteGpu
    );
    assert_eq!(ctx.standing_in(), StandIn::Gpu);
    assert_eq!(ctx.subgroup_size(), Some(32));
    assert_eq!(ctx.limits().max_compute_workgroup_storage_size, 48 << 10);
    let coop = ctx.coop_shape().expect("emulated cooperative matrices");
    assert_eq!((coop.size, coop.f16_inputs), (8, true));
    // The storage family first, flash_blocked as its kernel, the GPU's matmuls; tensor
    // cores (f16 inputs) for f16 calls only, and only once they are trusted
    // (tune::COOP_TUNED).
    let fam = [Kernels::Storage];
    let f32_flash = wgpu_attention::bench::flash_candidates(ctx, &fam, 16, 16, Dtype::F32);
    assert!(
        f32_flash
            .iter()
            .all(|v| matches!(v, FlashVariant::Blocked { .. })),
        "{f32_flash:?}"
    );
    let coop_tuned = wgpu_attention::bench::COOP_TUNED;
    let f16_flash = wgpu_attention::bench::flash_candidates(ctx, &fam, 16, 16, Dtype::F16);
    assert_eq!(
        f16_flash.contains(&FlashVariant::Coop),
        coop_tuned,
        "{f16_flash:?}"
    );
    let f32_mm = wgpu_attention::bench::matmul_candidates(ctx, &fam, Dtype::F32);
    let f16_mm = wgpu_attention::bench::matmul_candidates(ctx, &fam, Dtype::F16);
    assert!(f32_mm.contains(&MatmulVariant::Blocked { per_thread: 8 }));
    assert!(!f32_mm.contains(&MatmulVariant::Coop), "{f32_mm:?}");
    assert_eq!(
        f16_mm.contains(&MatmulVariant::Coop),
        coop_tuned,
        "{f16_mm:?}"
    );
    // Other widths: Intel's 16, AMD's wave64; the switch's spellings.
    for (text, width) in [("gpu", 32), ("gpu:16", 16), ("gpu:32", 32), ("gpu:64", 64)] {
        let stand_in: StandIn = text.parse().unwrap();
        assert_eq!(stand_in.subgroup_width(), Some(width), "{text}");
    }
    for bad in ["gpu:8", "gpus", "cpu"] {
        let err = bad.parse::<StandIn>().unwrap_err().to_string();
        assert!(err.contains("WGPU_ATTENTION_STAND_IN"), "{err}");
    }
    let wide = Context::new()
        .unwrap()
        .with_stand_in(StandIn::GpuSubgroups(64))
        .with_tune_cache(TuneCache::at(None));
    assert_eq!(wide.subgroup_size(), Some(64));
    assert_eq!(wide.standing_in(), StandIn::GpuSubgroups(64));
    assert!(wide.adapter_info().name.contains("(64-lane subgroups)"));
    // Off again: lavapipe as it is.
    let plain = Context::new()
        .unwrap()
        .with_stand_in(StandIn::Off)
        .with_tune_cache(TuneCache::at(None));
    assert_eq!(
        plain.adapter_info().device_type,
        wgpu_attention::wgpu::DeviceType::Cpu
    );
    assert_eq!(plain.coop_shape(), None);
}

/// Runs `case` on the stand-in and asserts it passes.
fn passes(case: Case) {
    let result = verify::run_case(stand_in(), &case, 7).unwrap();
    assert!(result.passed(), "{result}");
}

/// The H100's first wrong answer: `[storage] f16` through the weights path and through the
/// projections, where the tuner had handed f16 calls the cooperative-matrix matmul chosen
/// for f32. The coop matmul with f16 storage, forced, on both paths.
#[test]
fn f16_through_the_coop_matmul_matches_the_reference() {
    for case in [
        Case::new(7, 5, 5, 5).weights(false),
        Case::new(37, 13, 10, 6).bias(true),
    ] {
        passes(
            case.on(Kernels::Storage, false)
                .dtype(Dtype::F16)
                .matmul(MatmulVariant::Coop),
        );
    }
}

/// The H100's second wrong answer: a left window with causal, context only, batch 2, four
/// heads, a few dozen rows of width 16: what a GPU plans for it (flash_blocked 64 × 64,
/// double-buffered, subgroup reductions over 16 of 32 lanes), with key lengths, and at 300
/// rows, where the GPU splits the keys (flash_combine).
#[test]
fn a_left_window_with_causal_matches_the_reference() {
    for (n, mask) in [
        (23, MaskCase::None),
        (70, MaskCase::Lengths),
        (300, MaskCase::None),
    ] {
        passes(
            Case::new(n, 16, 64, 64)
                .on(Kernels::Auto, true)
                .sdpa((n, 4))
                .heads(4)
                .batch(2)
                .causal(true)
                .mods(ModsCase::WindowLeft)
                .mask(mask),
        );
    }
}

/// The same call through the CLI under the environment switch, as the H100 ran it.
#[test]
fn the_cli_says_it_stands_in_and_computes_the_window_right() {
    let dir = tempfile::tempdir().unwrap();
    let [q, k, v] = common::sdpa_arrays(2, 4, 23, 23, 16, 16);
    let path = |name: &str| dir.path().join(name).display().to_string();
    for (name, a) in [("q.npy", &q), ("k.npy", &k), ("v.npy", &v)] {
        wgpu_attention::npy::write(&dir.path().join(name), &a.clone().into_dyn()).unwrap();
    }
    let out = common::bin()
        .env("WGPU_ATTENTION_STAND_IN", "gpu")
        .args([
            "sdpa",
            "--q",
            &path("q.npy"),
            "--k",
            &path("k.npy"),
            "--v",
            &path("v.npy"),
            "--window",
            "4,0",
            "--causal",
            "--context-only",
            "--out",
            &path("out"),
        ])
        .output()
        .unwrap();
    common::ok(&out);
    let got = wgpu_attention::npy::read(&dir.path().join("out/context.npy")).unwrap();
    let mods = wgpu_attention::Modifiers::new()
        .preset(wgpu_attention::Preset::Window { left: 4, right: 0 });
    let mask = wgpu_attention::Mask::none().with_modifiers(&mods);
    let op = wgpu_attention::Attention::new().causal(true);
    let inputs = wgpu_attention::Inputs::qkv(q.view(), k.view(), v.view()).mask(&mask);
    let want = wgpu_attention::reference::run(&op, &inputs).unwrap();
    let (rel, max) = wgpu_attention::reference::compare(&got, &want.context);
    assert!(rel < 1e-5, "rel {rel:e}, max abs {max:e}");
    // A misspelt switch is one error line naming the variable.
    let bad = common::bin()
        .env("WGPU_ATTENTION_STAND_IN", "gpus")
        .args(["demo"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("WGPU_ATTENTION_STAND_IN"),
        "{err}"
    );
    let demo = common::bin()
        .env("WGPU_ATTENTION_STAND_IN", "gpu")
        .args(["demo"])
        .output()
        .unwrap();
    let text = common::ok(&demo);
    assert!(text.contains("standing in for a GPU"), "{text}");
}

/// CI's coverage check: every fused-kernel and matmul variant the tuner may offer a GPU
/// (the storage and subgroup families, at every head width `shaders --out` writes, in f32
/// and f16) is among those `verify --quick --variants` forces in turn under the stand-in,
/// which .ci/run runs for both dtypes. A variant offered only at a width the quick cases lack
/// fails here until a quick case reaches it.
#[test]
fn ci_forces_every_variant_a_gpu_may_be_offered() {
    use std::collections::BTreeSet;
    let ctx = stand_in();
    let mut offered = BTreeSet::new();
    let mut forced = BTreeSet::new();
    for dtype in [Dtype::F32, Dtype::F16] {
        for fam in [[Kernels::Storage], [Kernels::Subgroup]] {
            for d in [8u32, 16, 24, 32, 48, 64, 80, 96, 128, 160, 192, 256] {
                let w4 = d.div_ceil(4);
                for v in wgpu_attention::bench::flash_candidates(ctx, &fam, w4, w4, dtype) {
                    offered.insert(format!("{v} {dtype}"));
                }
            }
            for v in wgpu_attention::bench::matmul_candidates(ctx, &fam, dtype) {
                offered.insert(format!("{v} {dtype}"));
            }
        }
        let cases: Vec<Case> = verify::on_every_path(ctx, &verify::quick_cases())
            .into_iter()
            .map(|c| c.dtype(dtype))
            .collect();
        for case in verify::with_every_variant(ctx, &cases) {
            if let Some(v) = case.flash {
                forced.insert(format!("{v} {dtype}"));
            }
            if let Some(v) = case.matmul {
                forced.insert(format!("{v} {dtype}"));
            }
        }
    }
    let missing: Vec<_> = offered.difference(&forced).collect();
    assert!(
        missing.is_empty(),
        "offered to a GPU but never forced by CI's verify: {missing:?}"
    );
    eprintln!("CI forces {} variants: {forced:?}", forced.len());
}

/// Q `(b, h, n, d)`, K and V `(b, kvh, n, d)`: smooth values in [-1.5, 1.5].
fn arrays(b: usize, h: usize, kvh: usize, n: usize, d: usize) -> [ndarray::Array4<f32>; 3] {
    [
        common::smooth((b, h, n, d), 1, 1.5),
        common::smooth((b, kvh, n, d), 2, 1.5),
        common::smooth((b, kvh, n, d), 3, 1.5),
    ]
}

/// The GPU's backward (flash_blocked's saved forward, the GPU tiles of flash_backward_dot,
/// the storage backward kernels) with grouped-query heads and a left window with causal,
/// against the f64 reference.
#[test]
fn the_gpu_backward_matches_the_reference() {
    use wgpu_attention::{reference, Attention, Inputs, Mask, Modifiers, Options, Preset};
    let ctx = &profiled();
    let [q, k, v] = arrays(2, 4, 2, 45, 16);
    let d_o = ndarray::Array4::from_shape_fn((2, 4, 45, 16), |(i, j, l, m)| {
        ((i * 7 + j * 5 + l * 3 + m) as f32 * 0.11).cos()
    });
    let mods = Modifiers::new().preset(Preset::Window { left: 4, right: 0 });
    for mods in [None, Some(&mods)] {
        let mask = match mods {
            Some(m) => Mask::none().with_modifiers(m),
            None => Mask::none(),
        };
        let op = Attention::new()
            .causal(true)
            .options(Options::default().nan_fill(true));
        let inputs = Inputs::qkv(&q, &k, &v).mask(&mask);
        let want = reference::backward(&op, &inputs, d_o.view().into_dyn()).unwrap();
        let out = op
            .return_weights(false)
            .save_for_backward(true)
            .run(ctx, inputs.clone())
            .unwrap();
        let g = out.saved.unwrap().backward(ctx, d_o.view()).unwrap();
        for (name, got, want) in [
            ("dQ", &g.q, &want.q),
            ("dK", &g.k, &want.k),
            ("dV", &g.v, &want.v),
        ] {
            let (rel, max) = reference::compare(got.as_ref().unwrap(), want.as_ref().unwrap());
            assert!(
                rel < 1e-5,
                "window {}: {name} rel {rel:e}, max abs {max:e}",
                mods.is_some()
            );
        }
    }
    ran(
        ctx,
        &[
            "flash_backward_dot.wgsl",
            "flash_backward_kv.wgsl",
            "flash_backward_q.wgsl",
        ],
    );
}

/// A stand-in context of its own with per-kernel times on (which kernels ran).
fn profiled() -> Context {
    let ctx = Context::new()
        .unwrap()
        .with_stand_in(StandIn::Gpu)
        .with_tuning(false)
        .with_tune_cache(TuneCache::at(None));
    ctx.set_profiling(true);
    ctx
}

/// Asserts each of `kernels` ran in the last call on `ctx` (see [`profiled`]).
fn ran(ctx: &Context, kernels: &[&str]) {
    let times = ctx.kernel_times();
    let names: Vec<_> = times.iter().map(|t| t.kernel).collect();
    for k in kernels {
        assert!(names.contains(k), "{k} never ran: {names:?}");
    }
}

/// The GPU's decode kernel (decode_partial_gpu, its key blocks and the combine) through a KV
/// cache, prefill then one-token steps, f32 and f16 caches, against the causal reference.
#[test]
fn the_gpu_decode_step_matches_the_reference() {
    use wgpu_attention::{reference, Attention, Decoder, Inputs, KvCache, KvCacheSpec};
    let ctx = &profiled();
    for dtype in [Dtype::F32, Dtype::F16] {
        let [q, k, v] = arrays(2, 4, 2, 300, 16);
        let round = |a: &ndarray::Array4<f32>| match dtype {
            Dtype::F16 => a.mapv(|x| wgpu_attention::half::f16::from_f32(x).to_f32()),
            Dtype::F32 => a.clone(),
        };
        let op = Attention::new().causal(true);
        let want = reference::run(&op, &Inputs::qkv(&q, &round(&k), &round(&v)))
            .unwrap()
            .context;
        let spec = KvCacheSpec::new(300, 2, 2, 16, 16).dtype(dtype);
        let mut cache = KvCache::new(ctx, spec).unwrap();
        let dec = Decoder::new().nan_fill(true);
        let mut outs = Vec::new();
        for (from, to) in [(0, 297), (297, 298), (298, 299), (299, 300)] {
            let r = ndarray::s![.., .., from..to, ..];
            match dtype {
                Dtype::F32 => cache.append(ctx, k.slice(r), v.slice(r)).unwrap(),
                Dtype::F16 => {
                    let half = |a: &ndarray::Array4<f32>| {
                        a.slice(r).mapv(wgpu_attention::half::f16::from_f32)
                    };
                    cache.append(ctx, half(&k).view(), half(&v).view()).unwrap()
                }
            }
            outs.push(dec.step(ctx, &cache, q.slice(r)).unwrap());
        }
        let views: Vec<_> = outs.iter().map(|o| o.view()).collect();
        let got = ndarray::concatenate(ndarray::Axis(2), &views).unwrap();
        let (rel, max) = reference::compare(&got.into_dyn(), &want);
        assert!(rel < 1e-5, "{dtype}: rel {rel:e}, max abs {max:e}");
    }
    ran(ctx, &["decode_partial_gpu.wgsl", "decode_combine.wgsl"]);
}
