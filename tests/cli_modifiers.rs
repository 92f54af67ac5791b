//! `sdpa`'s modifier flags (issue 24): presets and a caller's WGSL files reading a
//! `--mod-buffer` against the library's f64 reference; a WGSL mistake is one `error:` line
//! naming its line; a file declaring a binding is refused.

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
            vec!["--softcap", "1.5", "--alibi", &slopes_s],
            Modifiers::new()
                .preset(Preset::Softcap(1.5))
                .preset(Preset::Alibi(slopes.clone())),
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
