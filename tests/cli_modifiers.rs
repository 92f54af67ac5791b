//! `sdpa`'s and `run`'s modifier flags: presets and a caller's WGSL files reading
//! a `--mod-buffer` against the library's f64 reference, the context and weights.npy; a WGSL
//! mistake is one `error:` line naming its line; a file declaring a binding is refused;
//! `--grad-output` through presets and a caller's `--score-mod` with its `--score-mod-grad`
//! against the reference backward (1e-4), and without its derivative one `error:` line.

mod common;

use std::path::Path;

use ndarray::{Array1, Array2, Array4, ArrayD};
use ndarray_npy::{read_npy, write_npy};
use wgpu_attention::modifiers::{Modifiers, Preset};
use wgpu_attention::{reference, Attention, Inputs, Mask};

fn write(dir: &Path, name: &str, a: &Array4<f32>) -> String {
    let p = dir.join(name);
    write_npy(&p, a).unwrap();
    p.display().to_string()
}

#[test]
fn presets_and_a_callers_files_match_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let [q, k, v] = common::sdpa_arrays(2, 4, 23, 23, 8, 8);
    let (qp, kp, vp) = (
        write(dir.path(), "q.npy", &q),
        write(dir.path(), "k.npy", &k),
        write(dir.path(), "v.npy", &v),
    );
    let slopes = Preset::alibi_slopes(4);
    let slopes_path = dir.path().join("slopes.npy");
    write_npy(&slopes_path, &Array1::from(slopes.clone())).unwrap();
    let ids: Vec<i32> = (0..2 * 23).map(|p: i32| (p % 23) / 6).collect();
    let ids_path = dir.path().join("ids.npy");
    write_npy(
        &ids_path,
        &Array2::from_shape_vec((2, 23), ids.clone()).unwrap(),
    )
    .unwrap();
    let table: Vec<f32> = (0..16 * 4).map(|i| (i as f32 * 0.41).sin()).collect();
    let table_path = dir.path().join("t5.npy");
    write_npy(
        &table_path,
        &Array2::from_shape_vec((16, 4), table.clone()).unwrap(),
    )
    .unwrap();
    let table_s = table_path.display().to_string();
    let score = dir.path().join("score.wgsl");
    std::fs::write(
        &score,
        "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    \
         return score + slope[h] * (f32(kv) - f32(q));\n}\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    let base = [
        "sdpa",
        "--q",
        &qp,
        "--k",
        &kp,
        "--v",
        &vp,
        "--causal",
        "--context-only",
        "--out",
    ];
    let slopes_s = slopes_path.display().to_string();
    let ids_s = ids_path.display().to_string();
    let score_s = score.display().to_string();
    let buffer = format!("slope={slopes_s}");
    let cases: Vec<(Vec<&str>, Modifiers)> = vec![
        (
            vec!["--window", "4,0"],
            Modifiers::new().preset(Preset::Window { left: 4, right: 0 }),
        ),
        (
            // The CLI's order: ALiBi, then the soft-cap, whatever the flags' order.
            vec!["--softcap", "1.5", "--alibi", &slopes_s],
            Modifiers::new()
                .preset(Preset::Alibi(slopes.clone()))
                .preset(Preset::Softcap(1.5)),
        ),
        (
            vec!["--document-ids", &ids_s, "--prefix-length", "3"],
            Modifiers::new()
                .preset(Preset::Documents {
                    ids: ids.clone(),
                    n: 23,
                })
                .preset(Preset::PrefixLm(3)),
        ),
        (
            vec![
                "--relative-bias",
                &table_s,
                "--relative-bias-max-distance",
                "10",
                "--relative-bias-unidirectional",
            ],
            Modifiers::new().preset(Preset::RelativeBias {
                table: table.clone(),
                buckets: 16,
                max_distance: 10,
                bidirectional: false,
            }),
        ),
        // The caller's file with its buffer computes ALiBi: the preset is its reference.
        (
            vec!["--score-mod", &score_s, "--mod-buffer", &buffer],
            Modifiers::new().preset(Preset::Alibi(slopes.clone())),
        ),
    ];
    for (flags, mods) in cases {
        let mut args = base.to_vec();
        args.push(out.to_str().unwrap());
        args.extend(flags.iter().copied());
        common::ok(&common::cli(&args));
        let got: ArrayD<f32> = read_npy(out.join("context.npy")).unwrap();
        let mask = Mask::none().with_modifiers(&mods);
        let op = Attention::new().causal(true);
        let want = reference::run(&op, &Inputs::qkv(&q, &k, &v).mask(&mask)).unwrap();
        let (rel, _) = reference::compare(&got, &want.context);
        assert!(rel < 1e-5, "{flags:?}: {rel:.2e}");
    }
}

#[test]
fn sdpa_writes_the_weights_with_the_modifiers() {
    // Without --context-only: weights.npy as the reference's, grouped-query heads, L ≠ S.
    let dir = tempfile::tempdir().unwrap();
    let [q, k, v] = common::sdpa_arrays(1, 4, 19, 26, 8, 8);
    let kv_heads = ndarray::s![.., ..2, .., ..];
    let (k, v) = (k.slice(kv_heads).to_owned(), v.slice(kv_heads).to_owned());
    let (qp, kp, vp) = (
        write(dir.path(), "q.npy", &q),
        write(dir.path(), "k.npy", &k),
        write(dir.path(), "v.npy", &v),
    );
    let out = dir.path().join("out");
    // Temporary paths hold no blanks.
    let line = format!(
        "sdpa --q {qp} --k {kp} --v {vp} --causal --softcap 2.5 --window 6,0 --out {}",
        out.display()
    );
    let args: Vec<&str> = line.split_whitespace().collect();
    let mods = Modifiers::new()
        .preset(Preset::Softcap(2.5))
        .preset(Preset::Window { left: 6, right: 0 });
    let mask = Mask::none().with_modifiers(&mods);
    let inputs = Inputs::qkv(&q, &k, &v).mask(&mask);
    writes_the_references_outputs(&args, &out, &Attention::new().causal(true), inputs);
}

#[test]
fn run_takes_the_modifier_flags() {
    // Self-attention on X with projections, 2 heads, ALiBi and documents, causal.
    let dir = tempfile::tempdir().unwrap();
    let (b, n, d) = (2, 21, 8);
    let x = ndarray::Array3::from_shape_fn((b, n, d), |(i, j, m)| {
        ((i * 97 + j * 13 + m * 3) as f32 * 0.07).sin()
    });
    let w = |salt: usize| {
        Array2::from_shape_fn((d, d), |(i, j)| {
            (((i * d + j) * salt) as f32 * 0.11).cos() * 0.5
        })
    };
    let (wq, wk, wv) = (w(3), w(5), w(7));
    let path = |name: &str| dir.path().join(name).display().to_string();
    write_npy(path("x.npy"), &x).unwrap();
    for (name, a) in [("wq.npy", &wq), ("wk.npy", &wk), ("wv.npy", &wv)] {
        write_npy(path(name), a).unwrap();
    }
    let slopes = Preset::alibi_slopes(2);
    write_npy(path("slopes.npy"), &Array1::from(slopes.clone())).unwrap();
    let ids: Vec<i32> = (0..b * n).map(|p| ((p % n) / 8) as i32).collect();
    write_npy(
        path("ids.npy"),
        &Array2::from_shape_vec((b, n), ids.clone()).unwrap(),
    )
    .unwrap();
    let out = dir.path().join("out");
    let (xp, wqp, wkp, wvp, sp, ip) = (
        path("x.npy"),
        path("wq.npy"),
        path("wk.npy"),
        path("wv.npy"),
        path("slopes.npy"),
        path("ids.npy"),
    );
    let line = format!(
        "run --x {xp} --wq {wqp} --wk {wkp} --wv {wvp} --heads 2 --causal --alibi {sp} \
         --document-ids {ip} --out {}",
        out.display()
    );
    let args: Vec<&str> = line.split_whitespace().collect();
    let mods = Modifiers::new()
        .preset(Preset::Alibi(slopes))
        .preset(Preset::Documents { ids, n: n as u32 });
    let mask = Mask::none().with_modifiers(&mods);
    let proj = wgpu_attention::Projections::new(wq.view(), wk.view(), wv.view());
    let inputs = Inputs::x(&x).projections(&proj).mask(&mask);
    let op = Attention::new().causal(true).heads(2);
    writes_the_references_outputs(&args, &out, &op, inputs);
}

/// Runs the command line with `args`, then checks the context.npy and weights.npy it wrote
/// into `out` against the reference's outputs of `op` on `inputs`.
fn writes_the_references_outputs(args: &[&str], out: &Path, op: &Attention, inputs: Inputs<'_>) {
    common::ok(&common::cli(args));
    let want = reference::run(op, &inputs).unwrap();
    let weights: ArrayD<f32> = read_npy(out.join("weights.npy")).unwrap();
    let context: ArrayD<f32> = read_npy(out.join("context.npy")).unwrap();
    let (rel_w, _) = reference::compare(&weights, want.weights.as_ref().unwrap());
    let (rel_c, _) = reference::compare(&context, &want.context);
    assert!(
        rel_w < 1e-5 && rel_c < 1e-5,
        "{args:?}: weights {rel_w:.2e}, context {rel_c:.2e}"
    );
}

#[test]
fn a_wgsl_mistake_is_one_error_line_naming_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let [q, k, v] = common::sdpa_arrays(1, 1, 4, 4, 4, 4);
    let (qp, kp, vp) = (
        write(dir.path(), "q.npy", &q),
        write(dir.path(), "k.npy", &k),
        write(dir.path(), "v.npy", &v),
    );
    let bad = dir.path().join("bad.wgsl");
    std::fs::write(
        &bad,
        "// mine\nfn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    return score *;\n}\n",
    )
    .unwrap();
    let binding = dir.path().join("binding.wgsl");
    std::fs::write(
        &binding,
        "@group(0) @binding(9) var<storage, read> x: array<f32>;\n\
         fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool { return x[kv] > 0.0; }\n",
    )
    .unwrap();
    let out = dir.path().join("out").display().to_string();
    let (bad_s, binding_s) = (bad.display().to_string(), binding.display().to_string());
    for (flag, file, needle) in [
        ("--score-mod", bad_s.as_str(), "bad.wgsl:3:"),
        ("--mask-mod", binding_s.as_str(), "may not declare `var x`"),
    ] {
        let args = [
            "sdpa", "--q", &qp, "--k", &kp, "--v", &vp, "--out", &out, flag, file,
        ];
        let o = common::cli(&args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}");
        let lines: Vec<_> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{stderr}");
        assert!(
            lines[0].starts_with("error: ") && lines[0].contains(needle),
            "{stderr}"
        );
    }
}

#[test]
fn grad_output_through_the_modifiers_matches_the_reference() {
    // GQA (4 Q heads on 2 K/V heads), L ≠ S, causal and not, presets and a caller's files
    // with the derivative of its score_mod; grad_q/k/v against the f64 reference backward.
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).display().to_string();
    let f = |salt: f32| {
        move |(a, b, c, d): (usize, usize, usize, usize)| {
            ((a * 31 + b * 17 + c * 7 + d) as f32 * salt).sin() * 2.0
        }
    };
    let q = Array4::from_shape_fn((2, 4, 19, 8), f(0.13));
    let k = Array4::from_shape_fn((2, 2, 26, 8), f(0.29));
    let v = Array4::from_shape_fn((2, 2, 26, 6), f(0.41));
    let d_o = Array4::from_shape_fn((2, 4, 19, 6), f(0.07));
    for (name, a) in [("q", &q), ("k", &k), ("v", &v), ("do", &d_o)] {
        write(dir.path(), &format!("{name}.npy"), a);
    }
    let slopes = Preset::alibi_slopes(4);
    write_npy(p("slopes.npy"), &Array1::from(slopes.clone())).unwrap();
    let ids: Vec<i32> = (0..2 * 26).map(|x: i32| (x % 26) / 7 + x / 26).collect();
    write_npy(
        p("ids.npy"),
        &Array2::from_shape_vec((2, 26), ids.clone()).unwrap(),
    )
    .unwrap();
    // A soft-cap of 1.5 as the caller's own file, with its derivative.
    std::fs::write(
        p("cap.wgsl"),
        "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    \
         return cap[0] * tanh(score / cap[0]);\n}\n",
    )
    .unwrap();
    std::fs::write(
        p("cap_grad.wgsl"),
        "fn score_mod_grad(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    \
         let t = tanh(score / cap[0]);\n    return 1.0 - t * t;\n}\n",
    )
    .unwrap();
    write_npy(p("cap.npy"), &Array1::from(vec![1.5f32])).unwrap();
    // T5's bias, (16 buckets, 4 heads): its table gets a gradient of its own.
    let table: Vec<f32> = (0..16 * 4).map(|i| (i as f32 * 0.37).sin()).collect();
    write_npy(
        p("table.npy"),
        &Array2::from_shape_vec((16, 4), table.clone()).unwrap(),
    )
    .unwrap();
    let table_s = p("table.npy");
    let (slopes_s, ids_s) = (p("slopes.npy"), p("ids.npy"));
    let (cap_s, cap_grad_s, cap_buf) = (
        p("cap.wgsl"),
        p("cap_grad.wgsl"),
        format!("cap={}", p("cap.npy")),
    );
    let cases: Vec<(Vec<&str>, Modifiers)> = vec![
        (
            vec!["--window", "6,2", "--softcap", "1.5", "--alibi", &slopes_s],
            Modifiers::new()
                .preset(Preset::Window { left: 6, right: 2 })
                .preset(Preset::Alibi(slopes.clone()))
                .preset(Preset::Softcap(1.5)),
        ),
        (
            vec!["--document-ids", &ids_s, "--prefix-length", "5"],
            Modifiers::new()
                .preset(Preset::Documents {
                    ids: ids.clone(),
                    n: 26,
                })
                .preset(Preset::PrefixLm(5)),
        ),
        (
            vec![
                "--score-mod",
                &cap_s,
                "--score-mod-grad",
                &cap_grad_s,
                "--mod-buffer",
                &cap_buf,
            ],
            Modifiers::new().preset(Preset::Softcap(1.5)),
        ),
        (
            vec![
                "--softcap",
                "1.5",
                "--relative-bias",
                &table_s,
                "--relative-bias-max-distance",
                "20",
            ],
            // The soft-cap after the bias: the table's gradient goes back through it.
            Modifiers::new()
                .preset(Preset::RelativeBias {
                    table: table.clone(),
                    buckets: 16,
                    max_distance: 20,
                    bidirectional: true,
                })
                .preset(Preset::Softcap(1.5)),
        ),
    ];
    let out = p("out");
    let (q_s, k_s, v_s, do_s) = (p("q.npy"), p("k.npy"), p("v.npy"), p("do.npy"));
    let base = [
        "sdpa",
        "--q",
        &q_s,
        "--k",
        &k_s,
        "--v",
        &v_s,
        "--grad-output",
        &do_s,
        "--context-only",
        "--out",
        &out,
    ];
    for causal in [false, true] {
        for (flags, mods) in &cases {
            let mut args = base.to_vec();
            if causal {
                args.push("--causal");
            }
            args.extend(flags.iter().copied());
            // Each case writes only its own gradients.
            let _ = std::fs::remove_file(Path::new(&out).join("grad_relative_bias.npy"));
            common::ok(&common::cli(&args));
            let mask = Mask::none().with_modifiers(mods);
            let op = Attention::new().causal(causal);
            let inputs = Inputs::qkv(&q, &k, &v).mask(&mask);
            let want = reference::backward(&op, &inputs, d_o.view().into_dyn()).unwrap();
            let table_path = Path::new(&out).join("grad_relative_bias.npy");
            assert_eq!(
                table_path.exists(),
                want.relative_bias.is_some(),
                "{flags:?}"
            );
            let named = [
                ("q", want.q),
                ("k", want.k),
                ("v", want.v),
                ("relative_bias", want.relative_bias),
            ];
            for (name, want) in named.into_iter().filter(|(_, w)| w.is_some()) {
                let got: ArrayD<f32> =
                    read_npy(Path::new(&out).join(format!("grad_{name}.npy"))).unwrap();
                let (rel, _) = reference::compare(&got, &want.unwrap());
                assert!(
                    rel < 1e-4,
                    "{flags:?} causal={causal} grad_{name}: {rel:.2e}"
                );
            }
        }
    }
    // A score_mod without its derivative: one error line asking for it.
    let mut args = base.to_vec();
    args.extend(["--score-mod", &cap_s, "--mod-buffer", &cap_buf]);
    let o = common::cli(&args);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    let lines: Vec<_> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("error: ") && lines[0].contains("score_mod_grad"),
        "{stderr}"
    );
}
