//! The command line end to end: `run` over .npy files (float32 and float64), `demo`,
//! `verify` and `devices`.

mod common;

use ndarray::{Array1, Array2, Array3, ArrayD};
use wgpu_attention::{reference, Attention, Inputs, Projections};

use common::{cli, ok};

#[test]
fn run_writes_context_and_weights_that_match_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let x = Array3::from_shape_fn((2, 11, 6), |(b, i, j)| {
        ((b * 5 + i * 3 + j) as f32 * 0.7).sin()
    });
    let wq = Array2::from_shape_fn((6, 8), |(i, j)| ((i * 8 + j) as f32 * 0.3).cos() * 0.5);
    let wk = Array2::from_shape_fn((6, 8), |(i, j)| ((i * 8 + j) as f32 * 0.17).sin() * 0.5);
    // W_V as float64: converted on read.
    let wv = Array2::from_shape_fn((6, 4), |(i, j)| ((i + 2 * j) as f64 * 0.21).sin());
    let bq = Array1::from_shape_fn(8, |i| i as f32 * 0.1);
    let bk = Array1::from_shape_fn(8, |i| -(i as f32) * 0.05);
    let bv = Array1::from_shape_fn(4, |i| i as f32);
    ndarray_npy::write_npy(p("x.npy"), &x).unwrap();
    ndarray_npy::write_npy(p("wq.npy"), &wq).unwrap();
    ndarray_npy::write_npy(p("wk.npy"), &wk).unwrap();
    ndarray_npy::write_npy(p("wv.npy"), &wv).unwrap();
    ndarray_npy::write_npy(p("bq.npy"), &bq).unwrap();
    ndarray_npy::write_npy(p("bk.npy"), &bk).unwrap();
    ndarray_npy::write_npy(p("bv.npy"), &bv).unwrap();
    let stdout = ok(&cli(&[
        "run",
        "--x",
        &p("x.npy"),
        "--wq",
        &p("wq.npy"),
        "--wk",
        &p("wk.npy"),
        "--wv",
        &p("wv.npy"),
        "--bq",
        &p("bq.npy"),
        "--bk",
        &p("bk.npy"),
        "--bv",
        &p("bv.npy"),
        "--heads",
        "2",
        "--causal",
        "--out",
        &p("out"),
    ]));
    assert!(stdout.contains("adapter"), "{stdout}");

    let context: ArrayD<f32> = ndarray_npy::read_npy(p("out/context.npy")).unwrap();
    let weights: ArrayD<f32> = ndarray_npy::read_npy(p("out/weights.npy")).unwrap();
    assert_eq!(context.shape(), &[2, 11, 4]);
    assert_eq!(weights.shape(), &[2, 2, 11, 11]);

    let wv32 = wv.mapv(|v| v as f32);
    let proj = Projections::new(wq.view(), wk.view(), wv32.view()).with_bias(
        bq.view(),
        bk.view(),
        bv.view(),
    );
    let op = Attention::new().heads(2).causal(true);
    let cpu = reference::run(&op, &Inputs::x(&x).projections(&proj)).unwrap();
    let (rel, _) = reference::compare(&context, &cpu.context);
    assert!(rel < 1e-5, "context rel err {rel}");
    let (rel, _) = reference::compare(&weights, cpu.weights.as_ref().unwrap());
    assert!(rel < 1e-5, "weights rel err {rel}");
}

#[test]
fn run_no_weights_writes_only_context_and_honours_scale() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let x = Array2::from_shape_fn((7, 3), |(i, j)| (i as f32 - j as f32) * 0.4);
    ndarray_npy::write_npy(p("x.npy"), &x).unwrap();
    ok(&cli(&[
        "run",
        "--x",
        &p("x.npy"),
        "--context-only",
        "--scale",
        "-0.25",
        "--out",
        &p("out"),
    ]));
    assert!(!dir.path().join("out/weights.npy").exists());
    let context: ArrayD<f32> = ndarray_npy::read_npy(p("out/context.npy")).unwrap();
    let cpu = reference::run(&Attention::new().scale(-0.25), &Inputs::x(&x)).unwrap();
    let (rel, _) = reference::compare(&context, &cpu.context);
    assert!(rel < 1e-5, "{rel}");
}

#[test]
fn demo_prints_a_labelled_table_of_the_sentence() {
    let stdout = ok(&cli(&["demo", "the cat sat on the mat"]));
    assert!(
        stdout.contains("vocabulary: [\"cat\", \"mat\", \"on\", \"sat\", \"the\"]"),
        "{stdout}"
    );
    let table_rows = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("the "))
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|v| v.parse::<f32>().is_ok())
        })
        .count();
    assert_eq!(table_rows, 2, "{stdout}");
    // A row of the table sums to 1.
    let row: f32 = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("cat "))
        .unwrap()
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse::<f32>().unwrap())
        .sum();
    assert!((row - 1.0).abs() < 1e-3, "{row}");
}

#[test]
fn verify_passes_and_reports_a_table() {
    // The quick sweep: the whole one runs in CI under the validation layers and SwiftShader,
    // and every case of it through the library in tests/gpu_matches_reference.rs.
    let stdout = ok(&cli(&["verify", "--quick", "--trials", "3", "--seed", "5"]));
    assert!(stdout.contains("0 failed"), "{stdout}");
    assert!(stdout.contains("ctx rel"), "{stdout}");
}

#[test]
fn devices_lists_at_least_one_adapter() {
    let stdout = ok(&cli(&["devices"]));
    assert!(stdout.contains("[0] "), "{stdout}");
    assert!(stdout.contains("max storage binding"), "{stdout}");
}

#[test]
fn verbose_flag_logs_adapter_and_plan_to_stderr_and_quiet_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x.npy");
    ndarray_npy::write_npy(&x, &Array2::<f32>::ones((5, 4))).unwrap();
    let out_dir = dir.path().join("o");
    let args = [
        "run",
        "--x",
        x.to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
    ];
    let quiet = cli(&args);
    ok(&quiet);
    let stderr = String::from_utf8_lossy(&quiet.stderr);
    assert!(!stderr.contains("INFO"), "{stderr}");
    let mut verbose_args = vec!["-vv"];
    verbose_args.extend(args);
    let loud = cli(&verbose_args);
    ok(&loud);
    let stderr = String::from_utf8_lossy(&loud.stderr);
    for want in ["adapter:", "attention batch=1 n=5", "workgroups as"] {
        assert!(stderr.contains(want), "no {want:?} in:\n{stderr}");
    }
}

/// Q (2, 2, 9, 4) and K (2, 2, 13, 4) for the `sdpa` tests.
fn sdpa_q_k() -> [ndarray::Array4<f32>; 2] {
    let f = |salt: f32| {
        move |(a, b, c, d): (usize, usize, usize, usize)| {
            ((a * 50 + b * 20 + c * 5 + d) as f32 * salt).sin()
        }
    };
    [
        ndarray::Array4::from_shape_fn((2, 2, 9, 4), f(0.11)),
        ndarray::Array4::from_shape_fn((2, 2, 13, 4), f(0.07)),
    ]
}

#[test]
fn sdpa_writes_pytorch_layout_outputs_that_match_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let [q, k] = sdpa_q_k();
    // V as float64: converted on read.
    let v = ndarray::Array4::from_shape_fn((2, 2, 13, 5), |(a, b, c, d)| {
        ((a + b + c * d) as f64 * 0.3).cos()
    });
    ndarray_npy::write_npy(p("q.npy"), &q).unwrap();
    ndarray_npy::write_npy(p("k.npy"), &k).unwrap();
    ndarray_npy::write_npy(p("v.npy"), &v).unwrap();
    ok(&cli(&[
        "sdpa",
        "--q",
        &p("q.npy"),
        "--k",
        &p("k.npy"),
        "--v",
        &p("v.npy"),
        "--causal",
        "--out",
        &p("o"),
    ]));
    let context: ArrayD<f32> = ndarray_npy::read_npy(p("o/context.npy")).unwrap();
    let weights: ArrayD<f32> = ndarray_npy::read_npy(p("o/weights.npy")).unwrap();
    let v32 = v.mapv(|x| x as f32);
    let want = reference::run(&Attention::new().causal(true), &Inputs::qkv(&q, &k, &v32)).unwrap();
    assert_eq!(context.shape(), &[2, 2, 9, 5]);
    assert_eq!(weights.shape(), &[2, 2, 9, 13]);
    assert!(reference::compare(&context, &want.context).0 < 1e-5);
    assert!(reference::compare(&weights, want.weights.as_ref().unwrap()).0 < 1e-5);

    // A 3-D K is named as such, in one line.
    ndarray_npy::write_npy(p("k3.npy"), &Array3::<f32>::zeros((2, 13, 4))).unwrap();
    let out = cli(&[
        "sdpa",
        "--q",
        &p("q.npy"),
        "--k",
        &p("k3.npy"),
        "--v",
        &p("v.npy"),
        "--out",
        &p("o2"),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("expected a 4-D array"), "{stderr}");
}

#[test]
fn run_with_an_output_projection_matches_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let x = Array3::from_shape_fn((2, 9, 6), |(b, i, j)| {
        ((b * 3 + i * 6 + j) as f32 * 0.3).sin()
    });
    let w = |r: usize, c: usize, s: f32| {
        Array2::from_shape_fn((r, c), move |(i, j)| ((i * c + j) as f32 * s).cos() * 0.4)
    };
    let (wq, wk, wv, wo) = (w(6, 8, 0.2), w(6, 8, 0.13), w(6, 8, 0.31), w(8, 5, 0.17));
    let bo = Array1::from_shape_fn(5, |i| i as f32 * 0.25);
    for (name, a) in [("wq", &wq), ("wk", &wk), ("wv", &wv), ("wo", &wo)] {
        ndarray_npy::write_npy(p(&format!("{name}.npy")), a).unwrap();
    }
    ndarray_npy::write_npy(p("x.npy"), &x).unwrap();
    ndarray_npy::write_npy(p("bo.npy"), &bo).unwrap();
    ok(&cli(&[
        "run",
        "--x",
        &p("x.npy"),
        "--wq",
        &p("wq.npy"),
        "--wk",
        &p("wk.npy"),
        "--wv",
        &p("wv.npy"),
        "--wo",
        &p("wo.npy"),
        "--bo",
        &p("bo.npy"),
        "--heads",
        "2",
        "--out",
        &p("o"),
    ]));
    let context: ArrayD<f32> = ndarray_npy::read_npy(p("o/context.npy")).unwrap();
    assert_eq!(context.shape(), &[2, 9, 5]);
    let proj =
        Projections::new(wq.view(), wk.view(), wv.view()).with_output(wo.view(), Some(bo.view()));
    let want = reference::run(
        &Attention::new().heads(2),
        &Inputs::x(&x).projections(&proj),
    )
    .unwrap();
    assert!(reference::compare(&context, &want.context).0 < 1e-5);
}

#[test]
fn sdpa_and_run_take_a_mask_and_key_lengths_from_npy_files() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let [q, k] = sdpa_q_k();
    let v = k
        .mapv(|x| (x * 3.0).cos())
        .slice_move(ndarray::s![.., .., .., ..3]);
    ndarray_npy::write_npy(p("q.npy"), &q).unwrap();
    ndarray_npy::write_npy(p("k.npy"), &k).unwrap();
    ndarray_npy::write_npy(p("v.npy"), &v).unwrap();
    // A boolean (L, S) mask and int64 key lengths, as NumPy writes them.
    let mask = Array2::from_shape_fn((9, 13), |(i, j)| (i + 2 * j) % 5 != 0).into_dyn();
    ndarray_npy::write_npy(p("mask.npy"), &mask).unwrap();
    ndarray_npy::write_npy(p("len.npy"), &Array1::from(vec![13i64, 6])).unwrap();
    let args = |extra: &[&str]| {
        let mut a: Vec<String> = ["sdpa", "--q", &p("q.npy"), "--k", &p("k.npy")]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(["--v".into(), p("v.npy"), "--out".into(), p("o")]);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let run = |extra: &[&str]| {
        let a = args(extra);
        cli(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    ok(&run(&[
        "--mask",
        &p("mask.npy"),
        "--kv-lengths",
        &p("len.npy"),
    ]));
    let context: ArrayD<f32> = ndarray_npy::read_npy(p("o/context.npy")).unwrap();
    let weights: ArrayD<f32> = ndarray_npy::read_npy(p("o/weights.npy")).unwrap();
    let m = wgpu_attention::Mask::boolean(mask.view()).with_kv_lengths(&[13, 6]);
    let want = reference::run(&Attention::new(), &Inputs::qkv(&q, &k, &v).mask(&m)).unwrap();
    assert!(reference::compare(&context, &want.context).0 < 1e-5);
    assert!(reference::compare(&weights, want.weights.as_ref().unwrap()).0 < 1e-5);
    assert!(weights
        .slice(ndarray::s![1, .., .., 6..])
        .iter()
        .all(|&w| w == 0.0));

    // A float mask on `run`, broadcast over the batch and heads.
    let x = Array3::from_shape_fn((2, 6, 4), |(a, b, c)| {
        ((a * 9 + b * 4 + c) as f32 * 0.2).cos()
    });
    ndarray_npy::write_npy(p("x.npy"), &x).unwrap();
    let fm = Array2::from_shape_fn((6, 6), |(i, j)| {
        if j > i + 1 {
            f32::NEG_INFINITY
        } else {
            0.3 * j as f32
        }
    })
    .into_dyn();
    ndarray_npy::write_npy(p("fm.npy"), &fm).unwrap();
    ok(&cli(&[
        "run",
        "--x",
        &p("x.npy"),
        "--mask",
        &p("fm.npy"),
        "--out",
        &p("r"),
    ]));
    let context: ArrayD<f32> = ndarray_npy::read_npy(p("r/context.npy")).unwrap();
    let fm_mask = wgpu_attention::Mask::additive(fm.view());
    let want = reference::run(&Attention::new(), &Inputs::x(&x).mask(&fm_mask)).unwrap();
    assert!(reference::compare(&context, &want.context).0 < 1e-5);

    // Bad values: an int mask, a mask that does not broadcast, float or negative lengths,
    // lengths past S, a missing file. Each is one clear line and a failure exit.
    ndarray_npy::write_npy(p("imask.npy"), &Array2::<i32>::zeros((9, 13))).unwrap();
    ndarray_npy::write_npy(p("wide.npy"), &Array2::<bool>::from_elem((9, 14), true)).unwrap();
    ndarray_npy::write_npy(p("flen.npy"), &Array1::from(vec![1.0f32, 2.0])).unwrap();
    ndarray_npy::write_npy(p("neg.npy"), &Array1::from(vec![3i32, -1])).unwrap();
    ndarray_npy::write_npy(p("long.npy"), &Array1::from(vec![3u8, 14])).unwrap();
    for (flag, file, says) in [
        ("--mask", "imask.npy", "bool, float16, float32 or float64"),
        ("--mask", "wide.npy", "does not broadcast"),
        ("--mask", "absent.npy", "absent.npy"),
        ("--kv-lengths", "flen.npy", "integer"),
        ("--kv-lengths", "neg.npy", "-1"),
        ("--kv-lengths", "long.npy", "kv_lengths[1] = 14"),
    ] {
        let out = run(&[flag, &p(file)]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {file} was accepted");
        assert!(err.contains(says), "{flag} {file}: {err}");
    }
}

#[test]
fn dtype_f16_reads_and_writes_float16_npy_and_verify_reports_its_accuracy() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let [q, k] = sdpa_q_k();
    // Q as float16, written the way NumPy does (`np.save` of a float16 array).
    wgpu_attention::npy::write_f16(std::path::Path::new(&p("q16.npy")), &q.clone().into_dyn())
        .unwrap();
    ndarray_npy::write_npy(p("k.npy"), &k).unwrap();
    let args = [
        "sdpa",
        "--q",
        &p("q16.npy"),
        "--k",
        &p("k.npy"),
        "--v",
        &p("k.npy"),
        "--dtype",
        "f16",
        "--out",
        &p("o"),
    ];
    ok(&cli(&args));
    for name in ["o/context.npy", "o/weights.npy"] {
        let bytes = std::fs::read(p(name)).unwrap();
        let header = String::from_utf8_lossy(&bytes[..64.min(bytes.len())]).into_owned();
        assert!(header.contains("'descr': '<f2'"), "{name}: {header}");
    }
    let context = wgpu_attention::npy::read(std::path::Path::new(&p("o/context.npy"))).unwrap();
    let q16 = wgpu_attention::npy::read(std::path::Path::new(&p("q16.npy"))).unwrap();
    let q16 = q16.into_dimensionality::<ndarray::Ix4>().unwrap();
    let want = reference::run(&Attention::new(), &Inputs::qkv(&q16, &k, &k)).unwrap();
    let (rel, _) = reference::compare(&context, &want.context);
    assert!(rel < 1e-2, "{rel:e}");

    // The quick sweep (~20 s here; the whole one, ~6 minutes of lavapipe's f16, is checked
    // case by case against its error bounds in tests/f16_bounds.rs).
    let out = ok(&cli(&[
        "verify", "--quick", "--dtype", "f16", "--trials", "0",
    ]));
    assert!(out.contains(" f16 ") && out.contains(" 0 failed"), "{out}");
    let bad = cli(&["verify", "--dtype", "bf16", "--trials", "0"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("f32 or f16"));
}

#[test]
fn propagate_nan_lets_non_finite_inputs_through_and_the_default_names_them() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let mut x = Array2::from_shape_fn((6, 4), |(i, j)| ((i * 4 + j) as f32 * 0.3).sin());
    x[[2, 1]] = f32::NAN;
    ndarray_npy::write_npy(p("x.npy"), &x).unwrap();
    let out = cli(&["run", "--x", &p("x.npy"), "--out", &p("o")]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("X holds a non-finite value") && err.contains("[2, 1]"),
        "{err}"
    );
    ok(&cli(&[
        "run",
        "--x",
        &p("x.npy"),
        "--causal",
        "--propagate-nan",
        "--out",
        &p("o"),
    ]));
    let context: Array2<f32> = ndarray_npy::read_npy(p("o/context.npy")).unwrap();
    // Causal: rows 0 and 1 never see key 2; rows 2.. do, and so does every query through q_2.
    assert!(context
        .slice(ndarray::s![..2, ..])
        .iter()
        .all(|v| v.is_finite()));
    assert!(context
        .slice(ndarray::s![2.., ..])
        .iter()
        .all(|v| v.is_nan()));
}

#[test]
fn bench_resident_times_the_kernels_on_a_tensor() {
    let out = ok(&cli(&[
        "bench",
        "--n",
        "16",
        "--d",
        "8",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--matmul",
        "0",
        "--kernels",
        "storage",
        "--fused-only",
        "--resident",
        "--no-cpu",
    ]));
    assert!(out.contains("gpu storage resident"), "{out}");
    assert!(out.contains("gpu storage fused"), "{out}");
}

#[test]
fn bench_model_times_the_array_api_resident_layers_and_the_cpu() {
    let out = ok(&cli(&[
        "bench",
        "--model",
        "--batch",
        "2",
        "--n",
        "7",
        "--d",
        "16",
        "--heads",
        "2",
        "--repeats",
        "1",
        "--warmup",
        "0",
    ]));
    for way in ["array API", "resident layers + tensors", "CPU f32"] {
        assert!(out.contains(way), "{out}");
    }
    assert!(out.contains("2 causal layers"), "{out}");
}

#[test]
fn stderr_stays_quiet_on_a_machine_without_a_display() {
    // Mesa's device-select Vulkan layer connects to Wayland while adapters are enumerated and,
    // with no XDG_RUNTIME_DIR, prints an "error:" line twice; the CLI turns that layer off.
    let out = common::bin()
        .args(["devices"])
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("NODEVICE_SELECT")
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.trim().is_empty(), "stderr: {stderr}");
}

/// A fresh clone's first run: Mesa's shader cache directory (.cargo/config.toml points it at
/// target/tmp) does not exist yet, and Mesa would print a warning per driver instead of
/// caching; the crate makes it first.
#[test]
fn a_missing_mesa_shader_cache_directory_is_made_not_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("not/yet/there");
    let out = common::bin()
        .env("MESA_SHADER_CACHE_DIR", &cache)
        .arg("demo")
        .output()
        .unwrap();
    common::ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("Failed to create"), "{stderr}");
    assert!(cache.is_dir());
}
