//! Every modifier rule the library checks gives one message whichever front end passed the
//! modifier: tests/data/modifier_rules.json's cases through the library's schema
//! ([`ModifierSpec`], as the browser sends it) and a call, and through `sdpa`'s flags (their
//! arrays as .npy files). web/crate's tests and python/tests/test_modifier_rules.py read the
//! same cases.

mod common;

use std::path::Path;

use ndarray::{Array1, Array2, Array4};
use ndarray_npy::write_npy;
use serde_json::Value;
use wgpu_attention::modifiers::{ModifierSpec, PresetSpec};
use wgpu_attention::{Attention, Inputs, Mask};

struct Case {
    rule: String,
    json_only: bool,
    presets: Vec<PresetSpec>,
    message: String,
}

/// The problem `(batch, heads, L, S, E)` and the cases.
fn cases() -> ([usize; 5], Vec<Case>) {
    let text = include_str!("data/modifier_rules.json");
    let doc: Value = serde_json::from_str(text).expect("modifier_rules.json parses");
    let problem: Vec<usize> = serde_json::from_value(doc["problem"].clone()).unwrap();
    let cases = doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            rule: c["rule"].as_str().unwrap().into(),
            json_only: c["json_only"].as_bool().unwrap_or(false),
            presets: serde_json::from_value(c["presets"].clone()).expect("presets parse"),
            message: c["message"].as_str().unwrap().into(),
        })
        .collect::<Vec<_>>();
    assert!(cases.len() >= 13, "the cases went missing");
    (problem.try_into().unwrap(), cases)
}

fn operand(b: usize, h: usize, n: usize, e: usize) -> Array4<f32> {
    common::smooth((b, h, n, e), n, 1.0)
}

#[test]
fn the_library_gives_each_rules_message() {
    let ([b, h, l, s, e], cases) = cases();
    let (q, k, v) = (
        operand(b, h, l, e),
        operand(b, h, s, e),
        operand(b, h, s, e),
    );
    for case in cases {
        let mut spec = ModifierSpec::new();
        spec.presets = case.presets.clone();
        // What a Rust caller sees: the schema's check, then the call's.
        let got = spec.modifiers().and_then(|mods| {
            let mask = Mask::none().with_modifiers(&mods);
            let inputs = Inputs::qkv(q.view(), k.view(), v.view()).mask(&mask);
            Attention::new().run(common::ctx(), inputs).map(drop)
        });
        let e = got.expect_err(&case.rule).to_string();
        assert_eq!(e, case.message, "{}", case.rule);
        // And the problem-free rules before any call.
        if !case.message.starts_with("shape mismatch") {
            assert_eq!(spec.modifiers().unwrap_err().to_string(), case.message);
        }
    }
}

/// `sdpa`'s flags for `presets`, their arrays written to `dir`.
fn flags(dir: &Path, presets: &[PresetSpec]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let push = |out: &mut Vec<String>, a: &str, b: String| out.extend([a.to_string(), b]);
    for (i, p) in presets.iter().enumerate() {
        let file = |ext: &str| dir.join(format!("p{i}.{ext}")).display().to_string();
        match p {
            PresetSpec::Softcap(c) => push(&mut out, "--softcap", c.to_string()),
            PresetSpec::Window([l, r]) => push(&mut out, "--window", format!("{l},{r}")),
            PresetSpec::PrefixLm(n) => push(&mut out, "--prefix-length", n.to_string()),
            PresetSpec::Alibi(slopes) => {
                write_npy(file("npy"), &Array1::from(slopes.clone())).unwrap();
                push(&mut out, "--alibi", file("npy"));
            }
            PresetSpec::Documents(rows) => {
                let n = rows[0].len();
                let ids = Array2::from_shape_vec((rows.len(), n), rows.concat()).unwrap();
                write_npy(file("npy"), &ids.mapv(i64::from)).unwrap();
                push(&mut out, "--document-ids", file("npy"));
            }
            PresetSpec::RelativeBias(r) => {
                let heads = r.table.len() / r.buckets as usize;
                let shape = (r.buckets as usize, heads);
                let table = Array2::from_shape_vec(shape, r.table.clone()).unwrap();
                write_npy(file("npy"), &table).unwrap();
                push(&mut out, "--relative-bias", file("npy"));
                let md = r.max_distance.to_string();
                push(&mut out, "--relative-bias-max-distance", md);
                if !r.bidirectional {
                    out.push("--relative-bias-unidirectional".into());
                }
            }
            other => panic!("no flag for {other:?}"),
        }
    }
    out
}

#[test]
fn the_cli_gives_each_rules_message() {
    let ([b, h, l, s, e], cases) = cases();
    let dir = tempfile::tempdir().unwrap();
    let mut base = Vec::new();
    for (name, n) in [("q", l), ("k", s), ("v", s)] {
        let p = dir.path().join(format!("{name}.npy"));
        write_npy(&p, &operand(b, h, n, e)).unwrap();
        base.push(format!("--{name}"));
        base.push(p.display().to_string());
    }
    base.extend(["--out".into(), dir.path().join("out").display().to_string()]);
    for case in cases.iter().filter(|c| !c.json_only) {
        let mut args = vec!["sdpa".to_string()];
        args.extend(base.iter().cloned());
        args.extend(flags(dir.path(), &case.presets));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = common::cli(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{}: it ran", case.rule);
        assert_eq!(
            stderr.trim_end(),
            format!("error: {}", case.message),
            "{}",
            case.rule
        );
    }
}

#[test]
fn array_front_ends_name_the_argument_of_a_wrong_shape() {
    let e = PresetSpec::documents_array("document_ids", &[5], &[0; 5]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid modifier: document_ids must be 2-D (batch, n), got shape (5,)"
    );
    let e = PresetSpec::relative_bias_array("--relative-bias", &[32], vec![0.0; 32], None, None)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid modifier: --relative-bias must be 2-D (buckets, heads), got shape (32,)"
    );
    let e = PresetSpec::alibi_array("alibi_slopes", &[2, 2], vec![1.0; 4]).unwrap_err();
    assert!(e.to_string().contains("alibi_slopes must be 1-D"), "{e}");
    // T5's defaults where the caller gives none: the schema's, for every front end.
    let p = PresetSpec::relative_bias_array("t", &[32, 2], vec![0.0; 64], None, None).unwrap();
    let PresetSpec::RelativeBias(r) = p else {
        unreachable!()
    };
    assert_eq!((r.max_distance, r.bidirectional), (128, true));
    let from_json: PresetSpec =
        serde_json::from_str(r#"{"relative_bias": {"table": [], "buckets": 32}}"#).unwrap();
    let PresetSpec::RelativeBias(j) = from_json else {
        unreachable!()
    };
    assert_eq!((j.max_distance, j.bidirectional), (128, true));
    // An unknown field is an error, not ignored.
    assert!(serde_json::from_str::<ModifierSpec>(r#"{"preset": []}"#).is_err());
}
