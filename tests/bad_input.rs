//! Bad input is a clear `Err` naming what is wrong, never a panic or a wrong answer: from the
//! library and from the CLI.

mod common;

use ndarray::{Array1, Array2, Array3, ArrayD, IxDyn};
use wgpu_attention::{Attention, Error, Inputs, Projections};

fn forward_err(x: &ArrayD<f32>, proj: Option<&Projections<'_>>, op: Attention) -> Error {
    // The reference must reject exactly what the GPU path rejects.
    let inputs = Inputs::x(x).projections(proj);
    let cpu = wgpu_attention::reference::run(&op, &inputs).unwrap_err();
    let gpu = op.run(common::ctx(), inputs).unwrap_err();
    assert_eq!(cpu.to_string(), gpu.to_string());
    gpu
}

fn x(n: usize, d: usize) -> ArrayD<f32> {
    Array2::from_shape_fn((n, d), |(i, j)| (i + j) as f32 * 0.1).into_dyn()
}

fn w(r: usize, c: usize) -> Array2<f32> {
    Array2::from_elem((r, c), 0.1)
}

#[test]
fn each_weight_must_have_d_rows() {
    let x = x(5, 4);
    let (good_k, good_v) = (w(4, 3), w(4, 2));
    for (name, wq, wk, wv) in [
        ("W_Q", w(3, 3), good_k.clone(), good_v.clone()),
        ("W_K", w(4, 3), w(5, 3), good_v.clone()),
        ("W_V", w(4, 3), good_k.clone(), w(2, 2)),
    ] {
        let p = Projections::new(wq.view(), wk.view(), wv.view());
        let e = forward_err(&x, Some(&p), Attention::new());
        assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
        assert!(e.to_string().contains(name), "{name}: {e}");
        assert!(e.to_string().contains("d = 4"), "{e}");
    }
}

#[test]
fn queries_and_keys_must_share_d_k() {
    let (wq, wk, wv) = (w(4, 3), w(4, 5), w(4, 2));
    let p = Projections::new(wq.view(), wk.view(), wv.view());
    let e = forward_err(&x(5, 4), Some(&p), Attention::new());
    assert!(
        e.to_string().contains("[4, 3]") && e.to_string().contains("[4, 5]"),
        "{e}"
    );
}

#[test]
fn each_bias_must_match_its_projection() {
    let (wq, wk, wv) = (w(4, 3), w(4, 3), w(4, 2));
    let (b3, b2) = (Array1::<f32>::zeros(3), Array1::<f32>::zeros(2));
    for (name, bq, bk, bv) in [
        ("b_Q", b2.clone(), b3.clone(), b2.clone()),
        ("b_K", b3.clone(), b2.clone(), b2.clone()),
        ("b_V", b3.clone(), b3.clone(), b3.clone()),
    ] {
        let p = Projections::new(wq.view(), wk.view(), wv.view()).with_bias(
            bq.view(),
            bk.view(),
            bv.view(),
        );
        let e = forward_err(&x(5, 4), Some(&p), Attention::new());
        assert!(e.to_string().contains(name), "{name}: {e}");
    }
}

#[test]
fn heads_must_divide_d_k_and_d_v() {
    let (wq, wk, wv) = (w(4, 6), w(4, 6), w(4, 4));
    let p = Projections::new(wq.view(), wk.view(), wv.view());
    let e = forward_err(&x(5, 4), Some(&p), Attention::new().heads(4));
    assert!(e.to_string().contains("d_k = 6"), "{e}");
    let e = forward_err(&x(5, 4), Some(&p), Attention::new().heads(3));
    assert!(e.to_string().contains("d_v = 4"), "{e}");
    let e = forward_err(&x(5, 4), None, Attention::new().heads(0));
    assert!(e.to_string().contains("heads"), "{e}");
}

#[test]
fn empty_sequence_batch_or_width_is_an_error() {
    let e = forward_err(&x(0, 4), None, Attention::new());
    assert!(e.to_string().contains("empty sequence"), "{e}");
    let e = forward_err(
        &Array3::<f32>::zeros((0, 3, 4)).into_dyn(),
        None,
        Attention::new(),
    );
    assert!(e.to_string().contains("empty batch"), "{e}");
    let e = forward_err(&x(3, 0), None, Attention::new());
    assert!(e.to_string().contains("d = 0"), "{e}");
}

#[test]
fn x_must_be_two_or_three_dimensional() {
    let e = forward_err(&ArrayD::zeros(IxDyn(&[4])), None, Attention::new());
    assert!(e.to_string().contains("(n, d) or (batch, n, d)"), "{e}");
    let e = forward_err(&ArrayD::zeros(IxDyn(&[1, 2, 3, 4])), None, Attention::new());
    assert!(e.to_string().contains("[1, 2, 3, 4]"), "{e}");
}

#[test]
fn nan_and_inf_are_rejected_with_array_and_index() {
    let mut bad = x(5, 4);
    bad[[3, 2]] = f32::NAN;
    let e = forward_err(&bad, None, Attention::new());
    assert!(
        matches!(&e, Error::NonFinite { array, index, .. } if array == "X" && index == &vec![3, 2]),
        "{e}"
    );
    let mut wv = w(4, 2);
    wv[[1, 1]] = f32::INFINITY;
    let (wq, wk) = (w(4, 3), w(4, 3));
    let p = Projections::new(wq.view(), wk.view(), wv.view());
    let e = forward_err(&x(5, 4), Some(&p), Attention::new());
    assert!(
        e.to_string().contains("W_V") && e.to_string().contains("inf"),
        "{e}"
    );
}

#[test]
fn non_finite_scale_is_rejected() {
    let e = forward_err(&x(5, 4), None, Attention::new().scale(f32::NAN));
    assert!(e.to_string().contains("scale"), "{e}");
}

#[test]
fn problems_over_the_device_limits_are_errors_not_panics() {
    // One sequence whose X alone exceeds the binding limit (128 MiB on lavapipe): no split
    // of the batch, heads or query rows can help (every row block needs every key).
    let limit = common::ctx().limits().max_storage_buffer_binding_size;
    let n = (limit / 4) as usize + 1;
    let x = ArrayD::<f32>::zeros(IxDyn(&[n, 1]));
    let e = Attention::new()
        .run(common::ctx(), Inputs::x(&x))
        .unwrap_err();
    assert!(matches!(e, Error::LimitExceeded { .. }), "{e}");
    assert!(
        e.to_string().contains("max_storage_buffer_binding_size"),
        "{e}"
    );
}

// ---- the CLI ----

fn cli(args: &[&str]) -> std::process::Output {
    common::bin().args(args).output().expect("binary runs")
}

fn assert_one_line_error(out: &std::process::Output, needle: &str) {
    assert!(!out.status.success(), "expected failure");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Mesa may print its own "error: XDG_RUNTIME_DIR ..." warnings first; ours is the last line.
    // The message is that line, and for clap's usage errors the lines under it.
    let at = stderr
        .rfind("\nerror: ")
        .map(|i| i + 1)
        .or_else(|| stderr.starts_with("error: ").then_some(0))
        .unwrap_or_else(|| panic!("no error line in {stderr}"));
    let message = &stderr[at..];
    assert!(
        message.contains(needle),
        "{message:?} does not mention {needle:?}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn cli_missing_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = cli(&[
        "run",
        "--x",
        "/nonexistent/x.npy",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert_one_line_error(&out, "/nonexistent/x.npy");
}

#[test]
fn cli_non_npy_and_wrong_dtype_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.npy");
    std::fs::write(&junk, b"this is not numpy").unwrap();
    let out = cli(&[
        "run",
        "--x",
        junk.to_str().unwrap(),
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert_one_line_error(&out, "not a valid .npy");

    let ints = dir.path().join("ints.npy");
    ndarray_npy::write_npy(&ints, &ndarray::Array2::<i32>::zeros((3, 4))).unwrap();
    let out = cli(&[
        "run",
        "--x",
        ints.to_str().unwrap(),
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert_one_line_error(&out, "unsupported dtype");
}

#[test]
fn cli_shape_errors_name_the_arrays() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    ndarray_npy::write_npy(p("x.npy"), &Array2::<f32>::zeros((5, 4))).unwrap();
    ndarray_npy::write_npy(p("w.npy"), &Array2::<f32>::zeros((4, 3))).unwrap();
    ndarray_npy::write_npy(p("bad.npy"), &Array2::<f32>::zeros((3, 3))).unwrap();
    ndarray_npy::write_npy(p("vec.npy"), &Array1::<f32>::zeros(3)).unwrap();
    let out = cli(&[
        "run",
        "--x",
        &p("x.npy"),
        "--wq",
        &p("w.npy"),
        "--wk",
        &p("bad.npy"),
        "--wv",
        &p("w.npy"),
        "--out",
        &p("o"),
    ]);
    assert_one_line_error(&out, "W_K");
    let out = cli(&[
        "run",
        "--x",
        &p("x.npy"),
        "--wq",
        &p("vec.npy"),
        "--wk",
        &p("w.npy"),
        "--wv",
        &p("w.npy"),
        "--out",
        &p("o"),
    ]);
    assert_one_line_error(&out, "expected a 2-D array");
    let out = cli(&["run", "--x", &p("x.npy"), "--heads", "3", "--out", &p("o")]);
    assert_one_line_error(&out, "does not divide");
    let out = cli(&["run", "--x", &p("vec.npy"), "--out", &p("o")]);
    assert_one_line_error(&out, "(n, d) or (batch, n, d)");
}

/// `wgpu-attention run` on a small valid X with one extra flag and its value.
fn run_with(flag: &str, value: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x.npy");
    ndarray_npy::write_npy(&x, &Array2::<f32>::ones((3, 2))).unwrap();
    let out_dir = dir.path().join("o");
    cli(&[
        "run",
        "--x",
        x.to_str().unwrap(),
        flag,
        value,
        "--out",
        out_dir.to_str().unwrap(),
    ])
}

#[test]
fn cli_unknown_backend_and_missing_adapter_are_clear_errors() {
    let out = run_with("--backend", "cuda");
    assert!(!out.status.success());
    assert_one_line_error(&out, "unknown backend \"cuda\"; expected one of vulkan");
    let out = run_with("--adapter", "no-such-gpu-xyz");
    assert_one_line_error(&out, "mesa-vulkan-drivers");
}

#[test]
fn cli_bad_kernel_family_and_bench_sizes_are_clear_errors() {
    let out = run_with("--kernels", "cuda");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("auto, storage or subgroup"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(&["bench", "--n", "256,0", "--matmul", "0"]);
    assert_one_line_error(&out, "--n");
    let out = cli(&["bench", "--d", "64", "--heads", "3", "--matmul", "0"]);
    assert_one_line_error(&out, "does not divide");
    let out = cli(&["bench", "--kernels", "fastest", "--matmul", "0"]);
    assert_one_line_error(&out, "auto, storage, subgroup or all");
}

#[test]
fn output_projection_with_the_wrong_shape_is_named() {
    let w = |r: usize, c: usize| Array2::<f32>::ones((r, c));
    let (wq, wk, wv) = (w(4, 6), w(4, 6), w(4, 6));
    let wo_bad = w(5, 3);
    let p = Projections::new(wq.view(), wk.view(), wv.view()).with_output(wo_bad.view(), None);
    let e = forward_err(&x(5, 4), Some(&p), Attention::new());
    assert!(
        e.to_string().contains("W_O") && e.to_string().contains("6 rows"),
        "{e}"
    );
    let wo = w(6, 3);
    let bo = ndarray::Array1::<f32>::ones(4);
    let p =
        Projections::new(wq.view(), wk.view(), wv.view()).with_output(wo.view(), Some(bo.view()));
    let e = forward_err(&x(5, 4), Some(&p), Attention::new());
    assert!(e.to_string().contains("b_O"), "{e}");
    let mut wo_nan = wo.clone();
    wo_nan[[2, 1]] = f32::NAN;
    let p = Projections::new(wq.view(), wk.view(), wv.view()).with_output(wo_nan.view(), None);
    let e = forward_err(&x(5, 4), Some(&p), Attention::new());
    assert!(
        e.to_string().contains("W_O") && e.to_string().contains("[2, 1]"),
        "{e}"
    );
}

#[test]
fn cli_bad_values_for_demo_verify_and_bench_outputs_are_clear_errors() {
    assert_one_line_error(&cli(&["demo", " ,;. "]), "no words");
    let out = cli(&["verify", "--trials", "many"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--trials"));
    let out = cli(&[
        "bench",
        "--n",
        "8",
        "--matmul",
        "0",
        "--repeats",
        "1",
        "--no-cpu",
        "--fused-only",
        "--json",
        "/nonexistent-dir/bench.json",
    ]);
    assert_one_line_error(&out, "/nonexistent-dir/bench.json");
}

#[test]
fn every_remaining_flag_with_a_bad_value_is_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    ndarray_npy::write_npy(p("x.npy"), &Array2::<f32>::ones((3, 4))).unwrap();
    ndarray_npy::write_npy(p("w.npy"), &Array2::<f32>::ones((4, 2))).unwrap();
    ndarray_npy::write_npy(p("b3.npy"), &Array1::<f32>::ones(3)).unwrap();
    ndarray_npy::write_npy(p("q.npy"), &ndarray::Array4::<f32>::ones((1, 1, 3, 2))).unwrap();
    std::fs::write(p("file"), b"a file, not a directory").unwrap();
    let (x, w, b3, q) = (p("x.npy"), p("w.npy"), p("b3.npy"), p("q.npy"));
    let out = p("o");
    let under_file = p("file/o");
    let run = |extra: &[&str]| {
        let mut a = vec!["run", "--x", &x];
        a.extend_from_slice(extra);
        if !extra.contains(&"--out") {
            a.extend(["--out", &out]);
        }
        cli(&a)
    };
    let weights = ["--wq", &w, "--wk", &w, "--wv", &w];
    let cases: Vec<(std::process::Output, &str)> = vec![
        (run(&["--scale", "abc"]), "--scale"),
        (run(&["--scale", "nan"]), "scale"),
        (run(&["--scale", "inf"]), "scale"),
        (run(&["--heads", "0"]), "heads"),
        (run(&["--heads", "-2"]), "'-2'"),
        (run(&["--dtype", "bf16"]), "f32 or f16"),
        (run(&["--causal=maybe"]), "--causal"),
        (run(&["--context-only=1"]), "--context-only"),
        (run(&["--propagate-nan=x"]), "--propagate-nan"),
        (run(&["--out", &under_file]), "file/o"),
        (run(&["--bo", &b3]), "--wo"),
        (run(&["--wq", &w]), "--wk"),
        (
            run(&[weights.as_slice(), &["--bq", &b3, "--bk", &b3, "--bv", &b3]].concat()),
            "b_Q",
        ),
        (
            cli(&[
                "sdpa", "--q", &q, "--k", &q, "--v", &q, "--dtype", "f8", "--out", &out,
            ]),
            "f32 or f16",
        ),
        (
            cli(&[
                "sdpa", "--q", &q, "--k", &q, "--v", &q, "--heads", "2", "--out", &out,
            ]),
            "--heads",
        ),
        (cli(&["verify", "--seed", "-1"]), "'-1'"),
        (cli(&["bench", "--warmup", "x"]), "--warmup"),
        (cli(&["bench", "--batch", "0", "--matmul", "0"]), "batch"),
        (cli(&["bench", "--heads", "0", "--matmul", "0"]), "heads"),
        (
            cli(&["bench", "--repeats", "0", "--matmul", "0"]),
            "repeats",
        ),
        (cli(&["bench", "--matmul", "x"]), "--matmul"),
        (cli(&["demo", "--seed", "abc"]), "--seed"),
        (cli(&["devices", "--backend", "glide"]), "--backend"),
    ];
    for (out, needle) in &cases {
        assert_one_line_error(out, needle);
    }
}
