//! `run` and `sdpa` with `--grad-output G.npy`: one `grad_<flag>.npy` per input given, in
//! its input's shape, equal to the f64 reference's gradients; float16 with `--dtype f16`;
//! a dO of the wrong shape or with NaN is a one-line error.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use ndarray::{Array1, Array2, Array3, ArrayD, Ix2};
use wgpu_attention::{npy, reference, Attention, Inputs, Mask, Projections};

use common::{cli, ok};

/// The one-line error of a failed run.
fn err(out: &std::process::Output) -> String {
    assert!(!out.status.success(), "succeeded");
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    stderr
}

fn grad_files(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("grad_"))
        .collect()
}

/// The written gradient (from the GPU's backward, f32 arithmetic) equals the reference's to
/// 1e-4; one that is 0 in exact arithmetic (db_K: the softmax ignores a shift shared by every
/// key) to 1e-5 absolute.
fn assert_matches(dir: &Path, flag: &str, want: ArrayD<f64>) {
    let got = npy::read(&dir.join(format!("grad_{flag}.npy"))).unwrap();
    assert_eq!(got.shape(), want.shape(), "grad_{flag}");
    let (rel, max_abs) = reference::compare(&got, &want);
    if want.iter().all(|v| v.abs() < 1e-9) {
        assert!(max_abs < 1e-5, "grad_{flag}: absolute error {max_abs:e}");
    } else {
        assert!(rel < 1e-4, "grad_{flag}: relative error {rel:e}");
    }
}

fn view4(a: &ArrayD<f32>) -> ndarray::ArrayView4<'_, f32> {
    a.view().into_dimensionality().unwrap()
}

fn wave(shape: &[usize], salt: f32) -> ArrayD<f32> {
    let mut i = 0.0f32;
    ArrayD::from_shape_simple_fn(shape, || {
        i += 1.0;
        (i * salt).sin()
    })
}

#[test]
fn sdpa_writes_grad_q_k_v_equal_to_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    // Grouped-query (4 Q heads on 2 K/V heads), L ≠ S, E ≠ E_v, causal, mask and lengths.
    let q = wave(&[2, 4, 5, 3], 0.37);
    let k = wave(&[2, 2, 7, 3], 0.53);
    let v = wave(&[2, 2, 7, 2], 0.71);
    let d_o = wave(&[2, 4, 5, 2], 0.29);
    let keep = Array2::from_shape_fn((5, 7), |(i, j)| i != 3 && j != 1);
    let lengths = Array1::from(vec![7i64, 4]);
    for (name, a) in [("k", &k), ("v", &v), ("do", &d_o)] {
        ndarray_npy::write_npy(p(&format!("{name}.npy")), a).unwrap();
    }
    ndarray_npy::write_npy(p("q.npy"), &q).unwrap();
    ndarray_npy::write_npy(p("mask.npy"), &keep).unwrap();
    ndarray_npy::write_npy(p("len.npy"), &lengths).unwrap();
    let stdout = ok(&cli(&[
        "sdpa",
        "--q",
        &p("q.npy"),
        "--k",
        &p("k.npy"),
        "--v",
        &p("v.npy"),
        "--causal",
        "--scale",
        "0.6",
        "--mask",
        &p("mask.npy"),
        "--kv-lengths",
        &p("len.npy"),
        "--grad-output",
        &p("do.npy"),
        "--out",
        &p("out"),
    ]));
    assert!(
        stdout.contains("grad_q") && stdout.contains("(GPU)"),
        "{stdout}"
    );
    let out = dir.path().join("out");
    let names = ["grad_k.npy", "grad_q.npy", "grad_v.npy"];
    assert_eq!(grad_files(&out), names.map(String::from).into());

    let keep = keep.into_dyn();
    let mask = Mask::boolean(keep.view()).with_kv_lengths(&[7, 4]);
    let op = Attention::new().causal(true).scale(0.6);
    let inputs = Inputs::qkv(view4(&q), view4(&k), view4(&v)).mask(&mask);
    let g = reference::backward(&op, &inputs, d_o.view()).unwrap();
    assert_matches(&out, "q", g.q.unwrap());
    assert_matches(&out, "k", g.k.unwrap());
    assert_matches(&out, "v", g.v.unwrap());
}

#[test]
fn run_writes_one_gradient_per_flag_given_plus_grad_x() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let x = Array3::from_shape_fn((2, 5, 4), |(b, i, j)| {
        ((b * 20 + i * 4 + j) as f32 * 0.4).sin()
    });
    let inputs: [(&str, ArrayD<f32>); 8] = [
        ("wq", wave(&[4, 6], 0.3)),
        ("wk", wave(&[4, 6], 0.7)),
        ("wv", wave(&[4, 4], 1.1)),
        ("bq", wave(&[6], 0.9)),
        ("bk", wave(&[6], 1.3)),
        ("bv", wave(&[4], 0.2)),
        ("wo", wave(&[4, 3], 0.6)),
        ("bo", wave(&[3], 0.8)),
    ];
    ndarray_npy::write_npy(p("x.npy"), &x).unwrap();
    for (flag, a) in &inputs {
        ndarray_npy::write_npy(p(&format!("{flag}.npy")), a).unwrap();
    }
    let bias = Array2::from_shape_fn((5, 5), |(i, j)| {
        if j > i + 2 {
            f32::NEG_INFINITY
        } else {
            0.3 * j as f32
        }
    });
    ndarray_npy::write_npy(p("mask.npy"), &bias).unwrap();
    let w = |i: usize| inputs[i].1.view().into_dimensionality::<Ix2>().unwrap();
    let b = |i: usize| inputs[i].1.view().into_dimensionality().unwrap();
    let bias_d = bias.clone().into_dyn();
    let mask = Mask::additive(bias_d.view());
    let op = Attention::new().heads(2);

    // Every flag, with the output projection: dO is (2, 5, 3).
    let d_o = wave(&[2, 5, 3], 0.45);
    ndarray_npy::write_npy(p("do.npy"), &d_o).unwrap();
    let mut args = vec![
        "run".to_string(),
        "--x".into(),
        p("x.npy"),
        "--heads".into(),
        "2".into(),
    ];
    for (flag, _) in &inputs {
        args.extend([format!("--{flag}"), p(&format!("{flag}.npy"))]);
    }
    args.extend([
        "--mask".into(),
        p("mask.npy"),
        "--grad-output".into(),
        p("do.npy"),
    ]);
    args.extend(["--out".into(), p("all")]);
    ok(&cli(&args.iter().map(String::as_str).collect::<Vec<_>>()));
    let out = dir.path().join("all");
    let mut want: BTreeSet<String> = inputs
        .iter()
        .map(|(f, _)| format!("grad_{f}.npy"))
        .collect();
    want.insert("grad_x.npy".into());
    assert_eq!(grad_files(&out), want);
    let proj = Projections::new(w(0), w(1), w(2))
        .with_bias(b(3), b(4), b(5))
        .with_output(w(6), Some(b(7)));
    let inputs = Inputs::x(&x).projections(&proj).mask(&mask);
    let g = reference::backward(&op, &inputs, d_o.view()).unwrap();
    assert_matches(&out, "x", g.x.unwrap());
    let grads2 = [("wq", g.w_q), ("wk", g.w_k), ("wv", g.w_v), ("wo", g.w_o)];
    for (flag, a) in grads2 {
        assert_matches(&out, flag, a.unwrap());
    }
    for (flag, a) in [("bq", g.b_q), ("bk", g.b_k), ("bv", g.b_v), ("bo", g.b_o)] {
        assert_matches(&out, flag, a.unwrap());
    }

    // No weights: grad_x only, (2, 5, 4) like X.
    let d_o = wave(&[2, 5, 4], 0.45);
    ndarray_npy::write_npy(p("do_x.npy"), &d_o).unwrap();
    ok(&cli(&[
        "run",
        "--x",
        &p("x.npy"),
        "--causal",
        "--grad-output",
        &p("do_x.npy"),
        "--out",
        &p("bare"),
    ]));
    let out = dir.path().join("bare");
    assert_eq!(grad_files(&out), ["grad_x.npy".to_string()].into());
    let op = Attention::new().causal(true);
    let g = reference::backward(&op, &Inputs::x(&x), d_o.view()).unwrap();
    assert_matches(&out, "x", g.x.unwrap());
}

#[test]
fn dtype_f16_writes_float16_gradients() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    for (name, shape) in [
        ("q", [1, 2, 3, 4]),
        ("k", [1, 1, 5, 4]),
        ("v", [1, 1, 5, 2]),
        ("do", [1, 2, 3, 2]),
    ] {
        ndarray_npy::write_npy(p(&format!("{name}.npy")), &wave(&shape, 0.3)).unwrap();
    }
    ok(&cli(&[
        "sdpa",
        "--q",
        &p("q.npy"),
        "--k",
        &p("k.npy"),
        "--v",
        &p("v.npy"),
        "--dtype",
        "f16",
        "--grad-output",
        &p("do.npy"),
        "--out",
        &p("out"),
    ]));
    for flag in ["q", "k", "v"] {
        let bytes = std::fs::read(dir.path().join(format!("out/grad_{flag}.npy"))).unwrap();
        let header = String::from_utf8_lossy(&bytes[..bytes.len().min(128)]).into_owned();
        assert!(header.contains("'<f2'"), "grad_{flag}: {header}");
    }
    let g = npy::read(&dir.path().join("out/grad_k.npy")).unwrap();
    assert_eq!(g.shape(), &[1, 1, 5, 4]);
}

#[test]
fn a_bad_grad_output_is_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    ndarray_npy::write_npy(p("x.npy"), &wave(&[3, 4], 0.3)).unwrap();
    ndarray_npy::write_npy(p("do_wrong.npy"), &wave(&[4, 3], 0.3)).unwrap();
    let mut nan = wave(&[3, 4], 0.3);
    nan[[2, 1]] = f32::NAN;
    ndarray_npy::write_npy(p("do_nan.npy"), &nan).unwrap();
    let run = |d_o: &str| {
        cli(&[
            "run",
            "--x",
            &p("x.npy"),
            "--grad-output",
            &p(d_o),
            "--out",
            &p("out"),
        ])
    };
    let e = err(&run("do_wrong.npy"));
    assert!(
        e.contains("--grad-output") && e.contains("[4, 3] but the output is [3, 4]"),
        "{e}"
    );
    let e = err(&run("do_nan.npy"));
    assert!(e.contains("dO") && e.contains("[2, 1]"), "{e}");
    let e = err(&run("missing.npy"));
    assert!(e.contains("missing.npy"), "{e}");
    assert!(
        !dir.path().join("out").exists(),
        "nothing written before the error"
    );
}

#[test]
fn run_with_a_checkpoint_writes_grad_x_only() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    // nn.MultiheadAttention(4, 2)'s in_proj_weight, (3·4, 4), without biases or out_proj.
    let in_w = wave(&[12, 4], 0.21);
    let bytes: Vec<u8> = in_w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![12, 4], &bytes).unwrap();
    let file = safetensors::serialize([("attn.in_proj_weight", view)], None).unwrap();
    std::fs::write(p("mha.safetensors"), file).unwrap();
    let x = wave(&[6, 4], 0.5);
    let d_o = wave(&[6, 4], 0.8);
    ndarray_npy::write_npy(p("x.npy"), &x).unwrap();
    ndarray_npy::write_npy(p("do.npy"), &d_o).unwrap();
    ok(&cli(&[
        "run",
        "--x",
        &p("x.npy"),
        "--weights",
        &p("mha.safetensors"),
        "--prefix",
        "attn",
        "--heads",
        "2",
        "--grad-output",
        &p("do.npy"),
        "--out",
        &p("out"),
    ]));
    let out = dir.path().join("out");
    assert_eq!(grad_files(&out), ["grad_x.npy".to_string()].into());
    let layer =
        wgpu_attention::checkpoint::load(&dir.path().join("mha.safetensors"), "attn").unwrap();
    let op = Attention::new().heads(2);
    let proj = layer.projections();
    let g = reference::backward(&op, &Inputs::x(&x).projections(&proj), d_o.view()).unwrap();
    assert_matches(&out, "x", g.x.unwrap());
}

#[test]
fn sdpa_with_a_bad_grad_output_is_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    for (name, shape) in [
        ("q", [1, 2, 3, 4]),
        ("k", [1, 1, 5, 4]),
        ("v", [1, 1, 5, 2]),
    ] {
        ndarray_npy::write_npy(p(&format!("{name}.npy")), &wave(&shape, 0.3)).unwrap();
    }
    let mut nan = wave(&[1, 2, 3, 2], 0.3);
    nan[[0, 1, 2, 1]] = f32::INFINITY;
    ndarray_npy::write_npy(p("do_inf.npy"), &nan).unwrap();
    ndarray_npy::write_npy(p("do_wrong.npy"), &wave(&[1, 2, 3, 4], 0.3)).unwrap();
    let sdpa = |d_o: &str| {
        let (q, k, v, g) = (p("q.npy"), p("k.npy"), p("v.npy"), p(d_o));
        let args = ["sdpa", "--q", &q, "--k", &k, "--v", &v, "--grad-output", &g];
        cli(&[&args[..], &["--out", &p("out")]].concat())
    };
    let e = err(&sdpa("do_inf.npy"));
    assert!(e.contains("dO") && e.contains("[0, 1, 2, 1]"), "{e}");
    let e = err(&sdpa("do_wrong.npy"));
    assert!(e.contains("[1, 2, 3, 4] but the context"), "{e}");
    assert!(!dir.path().join("out").exists(), "nothing written");
}
