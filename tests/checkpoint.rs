//! Weights from `.safetensors` checkpoints, built here with the safetensors crate the way
//! PyTorch stores `nn.Linear` (`(out, in)`, transposed on load): BERT's `attention.self`
//! (Q/K/V only) and its parent `attention` (with `output.dense`), separate q/k/v/o
//! projections in f16 and bf16, `nn.MultiheadAttention`'s stacked `in_proj_weight`, biases on
//! some projections only, grouped-query K/V heads, head counts from `config.json`; the
//! forward pass with them against the reference; and every way a file can be wrong, each
//! error listing what the file has.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ndarray::{Array1, Array2, ArrayD, IxDyn};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use wgpu_attention::checkpoint::{self, Biases, Layout};
use wgpu_attention::{reference, Attention, Dims, Inputs, Options};

/// A tensor to store: dtype, shape, f32 values (converted to the dtype's bytes).
struct T(Dtype, Vec<usize>, Vec<f32>);

fn bytes_of(t: &T) -> Vec<u8> {
    match t.0 {
        Dtype::F32 => t.2.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::F64 => {
            t.2.iter()
                .flat_map(|&v| f64::from(v).to_le_bytes())
                .collect()
        }
        Dtype::F16 => {
            t.2.iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect()
        }
        Dtype::BF16 => {
            t.2.iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect()
        }
        Dtype::I32 => t.2.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect(),
        other => panic!("test does not write {other:?}"),
    }
}

/// Writes `tensors` as a safetensors file named `name` in `dir`.
fn save<S: AsRef<str>>(dir: &Path, name: &str, tensors: Vec<(S, T)>) -> PathBuf {
    let data: Vec<(String, T, Vec<u8>)> = tensors
        .into_iter()
        .map(|(n, t)| {
            let b = bytes_of(&t);
            (n.as_ref().to_string(), t, b)
        })
        .collect();
    let views: HashMap<String, TensorView<'_>> = data
        .iter()
        .map(|(n, t, b)| (n.clone(), TensorView::new(t.0, t.1.clone(), b).unwrap()))
        .collect();
    let path = dir.join(name);
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
    path
}

/// A PyTorch `nn.Linear(d_in, d_out).weight`, `(d_out, d_in)`, with distinct values.
fn linear(d_out: usize, d_in: usize, salt: f32) -> Array2<f32> {
    Array2::from_shape_fn((d_out, d_in), |(o, i)| {
        ((o * d_in + i) as f32 * salt).sin() * 0.5
    })
}

fn vector(n: usize, salt: f32) -> Array1<f32> {
    Array1::from_shape_fn(n, |i| (i as f32 * salt).cos() * 0.1)
}

fn t2(dtype: Dtype, a: &Array2<f32>) -> T {
    T(dtype, a.shape().to_vec(), a.iter().copied().collect())
}

fn t1(dtype: Dtype, a: &Array1<f32>) -> T {
    T(dtype, vec![a.len()], a.to_vec())
}

fn x(n: usize, d: usize) -> ArrayD<f32> {
    ArrayD::from_shape_fn(IxDyn(&[2, n, d]), |ix| {
        ((ix[0] * 31 + ix[1] * 7 + ix[2]) as f32 * 0.23).sin()
    })
}

/// The GPU forward pass with `layer`'s projections against the reference.
fn forward_matches(layer: &checkpoint::LayerWeights, heads: usize, d: usize) {
    let ctx = common::ctx();
    let x = x(13, d);
    let proj = layer.projections();
    let op = Attention::new()
        .heads(heads)
        .causal(true)
        .options(Options::default().nan_fill(true));
    let inputs = Inputs::x(&x).projections(&proj);
    let got = op.run(ctx, inputs.clone()).unwrap();
    let want = reference::run(&op, &inputs).unwrap();
    let (rel, _) = reference::compare(&got.context, &want.context);
    assert!(rel < 1e-5, "rel {rel:e}");
}

#[test]
fn bert_self_prefix_is_qkv_only_and_the_parent_prefix_adds_its_output_dense() {
    let dir = tempfile::tempdir().unwrap();
    let (d, dk) = (8, 8);
    let (q, k, v, o) = (
        linear(dk, d, 0.1),
        linear(dk, d, 0.2),
        linear(dk, d, 0.3),
        linear(d, dk, 0.4),
    );
    let (bq, bk, bv, bo) = (
        vector(dk, 1.0),
        vector(dk, 2.0),
        vector(dk, 3.0),
        vector(d, 4.0),
    );
    let p = "encoder.layer.0.attention";
    let path = save(
        dir.path(),
        "bert.safetensors",
        vec![
            (format!("{p}.self.query.weight"), t2(Dtype::F32, &q)),
            (format!("{p}.self.key.weight"), t2(Dtype::F32, &k)),
            (format!("{p}.self.value.weight"), t2(Dtype::F32, &v)),
            (format!("{p}.self.query.bias"), t1(Dtype::F32, &bq)),
            (format!("{p}.self.key.bias"), t1(Dtype::F32, &bk)),
            (format!("{p}.self.value.bias"), t1(Dtype::F32, &bv)),
            (format!("{p}.output.dense.weight"), t2(Dtype::F32, &o)),
            (format!("{p}.output.dense.bias"), t1(Dtype::F32, &bo)),
            (format!("{p}.output.LayerNorm.weight"), t1(Dtype::F32, &bo)),
        ],
    );
    // `….attention.self` is BertSelfAttention: its output is the context, whatever the
    // parent holds beside it.
    let own = checkpoint::load(&path, &format!("{p}.self")).unwrap();
    // `….attention` is BertAttention: the same Q/K/V (under `self`) and its `output.dense`.
    let parent = checkpoint::load(&path, p).unwrap();
    for layer in [&own, &parent] {
        assert_eq!(layer.layout, Layout::Bert);
        assert_eq!(layer.weights.0, q.t());
        assert_eq!(layer.weights.1, k.t());
        assert_eq!(layer.weights.2, v.t());
        let b = &layer.biases;
        assert_eq!(
            (&b.q, &b.k, &b.v),
            (&Some(bq.clone()), &Some(bk.clone()), &Some(bv.clone()))
        );
        forward_matches(layer, 2, d);
    }
    assert!(own.output.is_none());
    let (w_o, b_o) = parent.output.as_ref().unwrap();
    assert_eq!(w_o, &o.t());
    assert_eq!(b_o.as_ref().unwrap(), &bo);
}

#[test]
fn separate_projections_in_f16_and_bf16_without_biases() {
    let dir = tempfile::tempdir().unwrap();
    let (q, k, v, o) = (
        linear(6, 10, 0.1),
        linear(6, 10, 0.2),
        linear(4, 10, 0.3),
        linear(10, 4, 0.5),
    );
    for dtype in [Dtype::F16, Dtype::BF16, Dtype::F64] {
        let path = save(
            dir.path(),
            "llama.safetensors",
            vec![
                ("model.layers.3.self_attn.q_proj.weight", t2(dtype, &q)),
                ("model.layers.3.self_attn.k_proj.weight", t2(dtype, &k)),
                ("model.layers.3.self_attn.v_proj.weight", t2(dtype, &v)),
                ("model.layers.3.self_attn.o_proj.weight", t2(dtype, &o)),
            ],
        );
        let layer = checkpoint::load(&path, "model.layers.3.self_attn").unwrap();
        assert_eq!(layer.layout, Layout::Separate);
        assert_eq!(layer.biases, Biases::default());
        // Converted from the stored type: within that type's rounding.
        let tol = if dtype == Dtype::F64 { 0.0 } else { 4e-3 };
        let max = (&layer.weights.0 - &q.t())
            .mapv(f32::abs)
            .fold(0.0f32, |a, &b| a.max(b));
        assert!(max <= tol, "{dtype:?}: {max}");
        assert_eq!(layer.output.as_ref().unwrap().0.dim(), (4, 10));
        forward_matches(&layer, 2, 10);
    }
}

#[test]
fn multihead_attention_in_proj_is_split_in_thirds() {
    let dir = tempfile::tempdir().unwrap();
    let e = 8;
    let in_w = linear(3 * e, e, 0.07);
    let in_b = vector(3 * e, 0.9);
    let (out_w, out_b) = (linear(e, e, 0.3), vector(e, 0.4));
    let path = save(
        dir.path(),
        "mha.safetensors",
        vec![
            ("attn.in_proj_weight", t2(Dtype::F32, &in_w)),
            ("attn.in_proj_bias", t1(Dtype::F32, &in_b)),
            ("attn.out_proj.weight", t2(Dtype::F32, &out_w)),
            ("attn.out_proj.bias", t1(Dtype::F32, &out_b)),
        ],
    );
    let layer = checkpoint::load(&path, "attn").unwrap();
    assert_eq!(layer.layout, Layout::InProj);
    assert_eq!(layer.weights.1, in_w.slice(ndarray::s![e..2 * e, ..]).t());
    assert_eq!(
        layer.biases.v.as_ref().unwrap(),
        in_b.slice(ndarray::s![2 * e..])
    );
    assert_eq!(layer.output.as_ref().unwrap().0, out_w.t());
    forward_matches(&layer, 4, e);
}

#[test]
fn bad_checkpoints_are_errors_that_list_what_the_file_has() {
    let dir = tempfile::tempdir().unwrap();
    let err = |path: &Path, prefix: &str| checkpoint::load(path, prefix).unwrap_err().to_string();
    let (q, k) = (linear(4, 6, 0.1), linear(4, 6, 0.2));
    let good = vec![
        ("l.query.weight", t2(Dtype::F32, &q)),
        ("l.key.weight", t2(Dtype::F32, &k)),
        ("l.value.weight", t2(Dtype::F32, &k)),
    ];
    let path = save(dir.path(), "ok.safetensors", good);

    let e = err(&dir.path().join("absent.safetensors"), "l");
    assert!(
        e.contains("absent.safetensors") && e.contains("cannot read"),
        "{e}"
    );
    std::fs::write(dir.path().join("empty"), b"").unwrap();
    let e = err(&dir.path().join("empty"), "l");
    assert!(e.contains("not a valid safetensors file"), "{e}");
    let e = err(dir.path(), "l");
    assert!(e.contains("is a directory"), "{e}");
    std::fs::write(dir.path().join("junk"), b"not a checkpoint at all").unwrap();
    let e = err(&dir.path().join("junk"), "l");
    assert!(e.contains("not a valid safetensors file"), "{e}");
    // A prefix with nothing under it: the layouts looked for, and the file's names.
    let e = err(&path, "encoder.layer.0");
    assert!(
        e.contains("no attention layer") && e.contains("l.query.weight"),
        "{e}"
    );

    // A BERT layer `l` with `query` and `key` as given, `value` good, and `extra` tensors;
    // `None` leaves a tensor out.
    let layer = |name: &str, query: Option<T>, key: Option<T>, extra: Vec<(&str, T)>| {
        let mut tensors: Vec<(&str, T)> = vec![("l.value.weight", t2(Dtype::F32, &k))];
        tensors.extend(query.map(|t| ("l.query.weight", t)));
        tensors.extend(key.map(|t| ("l.key.weight", t)));
        tensors.extend(extra);
        save(dir.path(), name, tensors)
    };
    let (good_q, good_k) = (|| Some(t2(Dtype::F32, &q)), || Some(t2(Dtype::F32, &k)));
    let e = err(&layer("missing", good_q(), None, vec![]), "l");
    assert!(
        e.contains("missing tensor l.key.weight") && e.contains("l.value.weight F32 [4, 6]"),
        "{e}"
    );
    let narrow = Some(t2(Dtype::F32, &linear(4, 5, 0.2)));
    let e = err(&layer("shape", good_q(), narrow, vec![]), "l");
    assert!(
        e.contains("l.key.weight takes 5 inputs") && e.contains("takes 6"),
        "{e}"
    );
    let cube = Some(T(Dtype::F32, vec![2, 2, 6], vec![0.0; 24]));
    assert!(err(&layer("3d", cube, good_k(), vec![]), "l").contains("expected a 2-D"));
    let ints = Some(t2(Dtype::I32, &q));
    assert!(err(&layer("int", ints, good_k(), vec![]), "l")
        .contains("I32: expected F32, F16, BF16 or F64"));
    let wrong_bias = vec![
        ("l.query.bias", t1(Dtype::F32, &vector(3, 1.0))),
        ("l.key.bias", t1(Dtype::F32, &vector(4, 1.0))),
        ("l.value.bias", t1(Dtype::F32, &vector(4, 1.0))),
    ];
    assert!(
        err(&layer("wrongbias", good_q(), good_k(), wrong_bias), "l")
            .contains("l.query.bias has 3 values")
    );
    let bad_in_proj = save(
        dir.path(),
        "inproj.safetensors",
        vec![("m.in_proj_weight", t2(Dtype::F32, &linear(7, 4, 0.1)))],
    );
    assert!(err(&bad_in_proj, "m").contains("expected (3·E, E)"));
    // Heads that do not divide the loaded widths: the op's own error.
    let layer = checkpoint::load(&path, "l").unwrap();
    let e = Attention::new()
        .heads(3)
        .run(
            common::ctx(),
            Inputs::x(&x(3, 6)).projections(&layer.projections()),
        )
        .unwrap_err();
    assert!(e.to_string().contains("divide"), "{e}");
}

#[test]
fn cli_run_takes_weights_and_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let e = 8;
    let in_w = linear(3 * e, e, 0.07);
    let out_w = linear(e, e, 0.3);
    let path = save(
        dir.path(),
        "mha.safetensors",
        vec![
            ("attn.in_proj_weight", t2(Dtype::F32, &in_w)),
            ("attn.out_proj.weight", t2(Dtype::F32, &out_w)),
        ],
    );
    let xs = x(9, e);
    ndarray_npy::write_npy(p("x.npy"), &xs).unwrap();
    let weights = path.to_str().unwrap();
    let (x_npy, out_dir) = (p("x.npy"), p("o"));
    // `run --x X --weights CKPT` with `extra` flags.
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--x",
            &x_npy,
            "--weights",
            weights,
            "--out",
            &out_dir,
        ];
        args.extend_from_slice(extra);
        common::bin().args(&args).output().unwrap()
    };
    let out = run(&["--prefix", "attn", "--heads", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let context: ArrayD<f32> = ndarray_npy::read_npy(p("o/context.npy")).unwrap();
    let layer = checkpoint::load(&path, "attn").unwrap();
    let want = reference::run(
        &Attention::new().heads(2),
        &Inputs::x(&xs).projections(&layer.projections()),
    )
    .unwrap();
    assert!(reference::compare(&context, &want.context).0 < 1e-5);
    // A wrong prefix names what the file has; --weights with --wq, or without --prefix, is
    // refused by clap.
    let failure = |extra: &[&str], says: &str| {
        let out = run(extra);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !out.status.success() && stderr.contains(says),
            "{extra:?}: {stderr}"
        );
    };
    failure(&["--prefix", "layer.0"], "attn.in_proj_weight");
    let w = x_npy.as_str();
    failure(
        &["--prefix", "attn", "--wq", w, "--wk", w, "--wv", w],
        "cannot be used with",
    );
    failure(&[], "--prefix");
}

#[test]
fn query_and_value_biases_without_a_key_bias() {
    // Whisper's attention: `k_proj` has no bias (a key bias adds the same amount to every
    // score of a query row, which the softmax cancels).
    let dir = tempfile::tempdir().unwrap();
    let d = 8;
    let path = save(
        dir.path(),
        "whisper.safetensors",
        vec![
            ("attn.q_proj.weight", t2(Dtype::F32, &linear(d, d, 0.1))),
            ("attn.q_proj.bias", t1(Dtype::F32, &vector(d, 1.0))),
            ("attn.k_proj.weight", t2(Dtype::F32, &linear(d, d, 0.2))),
            ("attn.v_proj.weight", t2(Dtype::F32, &linear(d, d, 0.3))),
            ("attn.v_proj.bias", t1(Dtype::F32, &vector(d, 3.0))),
            ("attn.out_proj.weight", t2(Dtype::F32, &linear(d, d, 0.4))),
        ],
    );
    let layer = checkpoint::load(&path, "attn").unwrap();
    let b = &layer.biases;
    assert_eq!(b.q.as_ref().unwrap(), &vector(d, 1.0));
    assert!(b.k.is_none());
    assert_eq!(b.v.as_ref().unwrap(), &vector(d, 3.0));
    let p = layer.projections();
    assert!(p.b_q.is_some() && p.b_k.is_none() && p.b_v.is_some());
    // The GPU path takes b_Q and b_V without b_K, as the reference does...
    forward_matches(&layer, 2, d);
    // ...which reads the absent b_K as zero, and applies b_Q and b_V.
    let op = Attention::new().heads(2);
    let xs = x(7, d);
    let run = |p: &wgpu_attention::Projections<'_>| {
        reference::run(&op, &Inputs::x(&xs).projections(p))
            .unwrap()
            .context
    };
    let zero = Array1::zeros(d);
    let with_zero_k = run(&p.with_biases(p.b_q, Some(zero.view()), p.b_v));
    assert!(reference::compare(&run(&p).mapv(|v| v as f32), &with_zero_k).0 < 1e-6);
    for dropped in [
        p.with_biases(None, p.b_k, p.b_v),
        p.with_biases(p.b_q, p.b_k, None),
    ] {
        assert!(reference::compare(&run(&dropped).mapv(|v| v as f32), &with_zero_k).0 > 1e-3);
    }
}

#[test]
fn grouped_query_layers_run_as_such_and_repeat_to_the_same_multi_head_layer() {
    // Llama-style, no biases: 4 query heads of width 3 sharing 2 K/V heads.
    let dir = tempfile::tempdir().unwrap();
    let d = 10;
    let (q, k, v, o) = (
        linear(12, d, 0.1),
        linear(6, d, 0.2),
        linear(6, d, 0.3),
        linear(d, 12, 0.4),
    );
    let p = "model.layers.0.self_attn";
    let path = save(
        dir.path(),
        "llama.safetensors",
        vec![
            (format!("{p}.q_proj.weight"), t2(Dtype::F32, &q)),
            (format!("{p}.k_proj.weight"), t2(Dtype::F32, &k)),
            (format!("{p}.v_proj.weight"), t2(Dtype::F32, &v)),
            (format!("{p}.o_proj.weight"), t2(Dtype::F32, &o)),
        ],
    );
    let layer = checkpoint::load(&path, p).unwrap();
    assert_eq!(layer.kv_heads(4).unwrap(), 2);
    // As loaded, K is half Q's width: the op runs it as grouped-query attention, 2 K/V heads,
    // and matches the reference; a head count the widths do not allow is refused.
    let op = Attention::new().heads(4);
    let x5 = Array2::<f32>::zeros((5, d));
    let proj = layer.projections();
    let inputs = Inputs::x(&x5).projections(&proj);
    assert_eq!(Dims::new(&op, &inputs).unwrap().kv_heads, 2);
    assert!(Dims::new(&Attention::new().heads(3), &inputs).is_err());
    forward_matches(&layer, 4, d);
    assert_eq!(layer.check_kv_heads(4, Some(2)).unwrap(), 2);
    let r = layer.clone().repeat_kv_heads(4, Some(2)).unwrap();
    // Query heads 0 and 1 share K/V head 0; 2 and 3 share head 1.
    for (h, c) in (0..4).flat_map(|h| (0..3).map(move |c| (h, c))) {
        assert_eq!(r.weights.1.column(h * 3 + c), k.t().column((h / 2) * 3 + c));
        assert_eq!(r.weights.2.column(h * 3 + c), v.t().column((h / 2) * 3 + c));
    }
    forward_matches(&r, 4, d);
    // (tests/torch_cases.rs checks the result against PyTorch's `enable_gqa`.)
    // A count the widths do not allow, or that config.json contradicts, is an error.
    let e = |r: wgpu_attention::Result<checkpoint::LayerWeights>| r.unwrap_err().to_string();
    assert!(e(layer.clone().repeat_kv_heads(4, Some(4))).contains("hold 2"));
    assert!(e(layer.clone().repeat_kv_heads(5, None)).contains("does not divide"));
    assert!(e(layer.clone().repeat_kv_heads(3, None)).contains("K/V heads"));
    assert!(layer.kv_heads(0).is_err());
    // A multi-head layer comes back unchanged.
    let mha = r.clone().repeat_kv_heads(4, Some(4)).unwrap();
    assert_eq!(mha.weights, r.weights);
}

#[test]
fn head_counts_come_from_the_config_json_beside_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("model.safetensors");
    let heads = || checkpoint::heads_from_config(&ckpt).map(|h| h.map(|h| (h.heads, h.kv_heads)));
    assert_eq!(heads().unwrap(), None);
    let config = |text: &str| std::fs::write(dir.path().join("config.json"), text).unwrap();
    config(r#"{"model_type": "bert", "hidden_size": 384, "num_attention_heads": 12}"#);
    let want = |heads, kv_heads| Some((heads, kv_heads));
    assert_eq!(heads().unwrap(), want(12, None));
    config(r#"{"num_attention_heads": 32, "num_key_value_heads": 8}"#);
    assert_eq!(heads().unwrap(), want(32, Some(8)));
    for (text, says) in [
        ("{not json", "not valid JSON"),
        (r#"{"hidden_size": 8}"#, "has no num_attention_heads"),
        (
            r#"{"num_attention_heads": 0}"#,
            "expected a positive integer",
        ),
        (
            r#"{"num_attention_heads": 4, "num_key_value_heads": "2"}"#,
            "num_key_value_heads",
        ),
    ] {
        config(text);
        let e = heads().unwrap_err().to_string();
        assert!(e.contains("config.json") && e.contains(says), "{text}: {e}");
    }
}

#[test]
fn cli_run_takes_heads_from_config_json_and_applies_only_the_named_modules_output() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let d = 8;
    let a = "enc.layer.0.attention";
    let path = save(
        dir.path(),
        "model.safetensors",
        vec![
            (
                format!("{a}.self.query.weight"),
                t2(Dtype::F32, &linear(d, d, 0.1)),
            ),
            (
                format!("{a}.self.key.weight"),
                t2(Dtype::F32, &linear(d, d, 0.2)),
            ),
            (
                format!("{a}.self.value.weight"),
                t2(Dtype::F32, &linear(d, d, 0.3)),
            ),
            (
                format!("{a}.output.dense.weight"),
                t2(Dtype::F32, &linear(d, d, 0.4)),
            ),
        ],
    );
    let xs = x(9, d);
    ndarray_npy::write_npy(p("x.npy"), &xs).unwrap();
    let (x_npy, out_dir) = (p("x.npy"), p("o"));
    let run = |prefix: &str, extra: &[&str]| {
        let mut args = vec!["run", "--x", &x_npy, "--weights", path.to_str().unwrap()];
        args.extend_from_slice(&["--prefix", prefix, "--out", &out_dir]);
        args.extend_from_slice(extra);
        common::bin().args(&args).output().unwrap()
    };
    let self_prefix = format!("{a}.self");
    // Neither --heads nor a config.json: one clear line.
    let out = run(&self_prefix, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--heads") && stderr.contains("config.json"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    std::fs::write(p("config.json"), r#"{"num_attention_heads": 2}"#).unwrap();
    // (prefix, --heads flags, heads expected)
    for (prefix, extra, heads) in [
        (self_prefix.as_str(), &[][..], 2),
        (a, &[][..], 2),
        (self_prefix.as_str(), &["--heads", "4"][..], 4),
    ] {
        let out = run(prefix, extra);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let layer = checkpoint::load(&path, prefix).unwrap();
        let applied = if prefix == a { "applied" } else { "none" };
        assert!(
            stdout.contains(&format!("output projection {applied}")),
            "{stdout}"
        );
        let context: ArrayD<f32> = ndarray_npy::read_npy(p("o/context.npy")).unwrap();
        let op = Attention::new().heads(heads);
        let want = reference::run(&op, &Inputs::x(&xs).projections(&layer.projections())).unwrap();
        assert!(
            reference::compare(&context, &want.context).0 < 1e-5,
            "{prefix} {extra:?}"
        );
    }
}
