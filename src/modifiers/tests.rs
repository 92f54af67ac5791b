//! The modifiers' checks and presets, without a GPU.

use super::*;
use crate::error::Error;

fn err(m: &Modifiers) -> String {
    m.check().unwrap_err().to_string()
}

#[test]
fn a_good_modifier_with_a_buffer_and_presets_checks() {
    let m = Modifiers::new()
        .score_mod(
            "slope.wgsl",
            "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    \
             return score + slope[h] * f32(kv);\n}\n",
        )
        .mask_mod(
            "docs.wgsl",
            "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool { return kv <= q + 3u; }",
        )
        .buffer("slope", BufferData::F32(vec![0.5, 0.25]))
        .preset(Preset::Window { left: 3, right: 0 })
        .preset(Preset::Softcap(30.0))
        .preset(Preset::Alibi(Preset::alibi_slopes(2)))
        .preset(Preset::Documents {
            ids: vec![0, 0, 1, 1],
            n: 4,
        })
        .preset(Preset::PrefixLm(2));
    m.check().unwrap();
    let wgsl = m.wgsl(1, 7);
    assert!(wgsl.contains("@group(1) @binding(7) var<storage, read> slope: array<f32>;"));
    assert!(wgsl.contains("fn wa_score(") && wgsl.contains("fn wa_mask("));
    // The caller's buffer, then the presets' data (ALiBi's slopes, the ids) packed in one.
    let buffers = m.all_buffers();
    assert_eq!(buffers.len(), 2);
    assert_eq!(buffers[1].name, "wa_presets");
    assert!(wgsl.contains("@group(1) @binding(8) var<storage, read> wa_presets: array<i32>;"));
}

#[test]
fn a_syntax_error_names_the_callers_file_line_and_column() {
    let m = Modifiers::new()
        .buffer("slope", BufferData::F32(vec![1.0]))
        .score_mod(
            "mine.wgsl",
            "// a comment\nfn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    \
             return score +;\n}\n",
        );
    let e = err(&m);
    assert!(e.contains("mine.wgsl:3:"), "{e}");
    assert!(!e.contains('\n'), "{e}");
}

#[test]
fn a_type_error_is_located_too() {
    // naga locates a validation error at the expression's span (here the argument `q`
    // the return reads) and says what is wrong.
    let m = Modifiers::new().mask_mod(
        "m.wgsl",
        "\nfn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {\n    return q;\n}\n",
    );
    let e = err(&m);
    assert!(e.contains("m.wgsl:2:"), "{e}");
    assert!(e.contains("does not match the declared return type"), "{e}");
    assert!(!e.contains('\n'), "{e}");
}

#[test]
fn bindings_workgroup_memory_barriers_and_atomics_are_refused() {
    let sig = "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool";
    for (src, what) in [
        (
            format!("@group(0) @binding(0) var<storage, read> x: array<f32>;\n{sig} {{ return x[0] > 0.0; }}"),
            "may not declare `var x`",
        ),
        (
            format!("var<workgroup> w: array<f32, 4>;\n{sig} {{ return w[0] > 0.0; }}"),
            "may not declare `var w`",
        ),
        (
            format!("var<private> p: f32;\n{sig} {{ return p > 0.0; }}"),
            "may not declare `var p`",
        ),
        (
            format!("{sig} {{ workgroupBarrier(); return true; }}"),
            "a barrier",
        ),
        (
            format!("{sig} {{ storageBarrier(); return true; }}"),
            "a barrier",
        ),
    ] {
        let e = err(&Modifiers::new().mask_mod("m.wgsl", src.clone()));
        assert!(e.contains(what), "{src}\n→ {e}");
    }
}

#[test]
fn a_wrong_signature_is_refused_with_the_expected_one() {
    for src in [
        "fn mask_mod(b: u32, h: u32, q: u32) -> bool { return true; }",
        "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> f32 { return 1.0; }",
        "fn mask_mod(b: i32, h: u32, q: u32, kv: u32) -> bool { return true; }",
        "fn other(b: u32) -> bool { return true; }",
    ] {
        let e = err(&Modifiers::new().mask_mod("m.wgsl", src));
        assert!(e.contains(MASK_MOD_SIGNATURE), "{src}\n→ {e}");
    }
    let e = err(&Modifiers::new().score_mod(
        "s.wgsl",
        "fn score_mod(score: f32, b: u32, h: u32, q: u32) -> f32 { return score; }",
    ));
    assert!(e.contains(SCORE_MOD_SIGNATURE), "{e}");
}

#[test]
fn buffer_names_must_be_identifiers_and_unique() {
    let good = "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool { return true; }";
    for (m, what) in [
        (
            Modifiers::new().buffer("1x", BufferData::F32(vec![1.0])),
            "identifier",
        ),
        (
            Modifiers::new().buffer("wa_x", BufferData::F32(vec![1.0])),
            "identifier",
        ),
        (
            Modifiers::new()
                .buffer("a", BufferData::F32(vec![1.0]))
                .buffer("a", BufferData::I32(vec![1])),
            "twice",
        ),
        (
            Modifiers::new().buffer("a", BufferData::F32(vec![])),
            "empty",
        ),
    ] {
        let e = err(&m.mask_mod("m.wgsl", good));
        assert!(e.contains(what), "{e}");
    }
}

#[test]
fn a_callers_score_mod_needs_its_derivative_for_gradients() {
    let s =
        "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 { return 2.0 * score; }";
    let m = Modifiers::new().score_mod("s.wgsl", s);
    assert!(matches!(
        m.check_differentiable(),
        Err(Error::Unsupported { .. })
    ));
    let g = "fn score_mod_grad(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 { return 2.0; }";
    // Without it there is no wa_score_grad (only the backward calls it, and it is refused).
    assert!(!m.wgsl(1, 0).contains("fn wa_score_grad("));
    let m = m.score_mod_grad("g.wgsl", g).preset(Preset::Softcap(5.0));
    m.check().unwrap();
    m.check_differentiable().unwrap();
    // The chain rule in the score modifiers' order: each derivative at its own input.
    let code = m.wgsl(1, 0);
    let chain = &code[code.find("fn wa_score_grad(").unwrap()..];
    let steps: Vec<_> = chain.lines().map(str::trim).skip(3).take(4).collect();
    assert_eq!(
        steps,
        [
            "g *= score_mod_grad(s, b, h, q, kv);",
            "s = score_mod(s, b, h, q, kv);",
            "g *= wa_p0_grad(s, b, h, q, kv);",
            "s = wa_p0(s, b, h, q, kv);",
        ]
    );
}

#[test]
fn the_score_presets_derivatives_on_the_cpu() {
    let c = Preset::Softcap(2.0);
    for s in [-3.0, -0.5, 0.0, 1.0, 4.0] {
        let h = 1e-6;
        let numeric =
            (c.apply(s + h, 0, 0, 0, 0).unwrap() - c.apply(s - h, 0, 0, 0, 0).unwrap()) / (2.0 * h);
        assert!((c.grad(s, 0, 0, 0, 0) - numeric).abs() < 1e-8, "{s}");
    }
    assert_eq!(Preset::Alibi(vec![0.5]).grad(3.0, 0, 0, 2, 7), 1.0);
}

#[test]
fn presets_on_the_cpu_do_what_their_wgsl_says() {
    let w = Preset::Window { left: 2, right: 1 };
    assert_eq!(w.apply(1.0, 0, 0, 5, 3), Some(1.0));
    assert_eq!(w.apply(1.0, 0, 0, 5, 2), None);
    assert_eq!(w.apply(1.0, 0, 0, 5, 6), Some(1.0));
    assert_eq!(w.apply(1.0, 0, 0, 5, 7), None);
    let c = Preset::Softcap(2.0).apply(100.0, 0, 0, 0, 0).unwrap();
    assert!((c - 2.0).abs() < 1e-9);
    let d = Preset::Documents {
        ids: vec![0, 0, 1, 1, 5, 5, 5, 6],
        n: 4,
    };
    assert_eq!(d.apply(1.0, 0, 0, 1, 0), Some(1.0));
    assert_eq!(d.apply(1.0, 0, 0, 2, 1), None);
    assert_eq!(d.apply(1.0, 1, 0, 3, 2), None);
    let p = Preset::PrefixLm(3);
    assert_eq!(p.apply(1.0, 0, 0, 0, 2), Some(1.0));
    assert_eq!(p.apply(1.0, 0, 0, 4, 5), None);
    assert_eq!(Preset::alibi_slopes(8)[0], 0.5);
    assert_eq!(Preset::alibi_slopes(8)[7], 1.0 / 256.0);
    assert_eq!(Preset::alibi_slopes(12).len(), 12);
}

#[test]
fn t5_buckets_are_hugging_faces() {
    // transformers' T5Attention._relative_position_bucket (torch 2.15, float32) at
    // d = j − i = −140 … 140, for (bidirectional, buckets, max_distance).
    let cases = [
        (true, 32, 128, "15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,14,14,14,14,14,14,14,14,14,14,14,14,14,14,14,14,14,14,14,14,14,14,14,14,14,14,14,13,13,13,13,13,13,13,13,13,13,13,13,13,13,13,13,13,13,12,12,12,12,12,12,12,12,12,12,12,12,12,12,11,11,11,11,11,11,11,11,11,10,10,10,10,10,10,10,9,9,9,9,8,8,8,8,7,6,5,4,3,2,1,0,17,18,19,20,21,22,23,24,24,24,24,25,25,25,25,26,26,26,26,26,26,26,27,27,27,27,27,27,27,27,27,28,28,28,28,28,28,28,28,28,28,28,28,28,28,29,29,29,29,29,29,29,29,29,29,29,29,29,29,29,29,29,29,30,30,30,30,30,30,30,30,30,30,30,30,30,30,30,30,30,30,30,30,30,30,30,30,30,30,30,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31"),
        (false, 32, 128, "31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,31,30,30,30,30,30,30,30,30,30,30,30,30,30,30,29,29,29,29,29,29,29,29,29,29,29,29,28,28,28,28,28,28,28,28,28,28,27,27,27,27,27,27,27,27,27,27,26,26,26,26,26,26,26,26,25,25,25,25,25,25,25,24,24,24,24,24,24,23,23,23,23,23,23,22,22,22,22,22,21,21,21,21,20,20,20,20,19,19,19,18,18,18,17,17,16,16,16,15,14,13,12,11,10,9,8,7,6,5,4,3,2,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0"),
        (true, 16, 20, "7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,6,6,6,6,6,5,5,5,4,4,3,2,1,0,9,10,11,12,12,13,13,13,14,14,14,14,14,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15,15"),
    ];
    for (bidirectional, buckets, max_distance, want) in cases {
        let got: Vec<String> = (-140..=140)
            .map(|d| Preset::t5_bucket(d, buckets, max_distance, bidirectional).to_string())
            .collect();
        assert_eq!(
            got.join(","),
            want,
            "({bidirectional}, {buckets}, {max_distance})"
        );
    }
}

#[test]
fn cpu_forms_change_neither_the_wgsl_nor_what_the_kernels_share() {
    let own = Modifiers::new()
        .score_mod(
            "s.wgsl",
            "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 { return -score; }",
        )
        .mask_mod(
            "m.wgsl",
            "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool { return kv <= q; }",
        )
        .preset(Preset::Softcap(5.0));
    let cpu = own
        .clone()
        .score_mod_cpu(|s, _, _, _, _| -s)
        .mask_mod_cpu(|_, _, q, kv| kv <= q);
    assert_eq!(cpu.wgsl(1, 3), own.wgsl(1, 3));
    assert_eq!(cpu.kernel_key(), own.kernel_key());
    assert!(cpu.same_kernels(&own));
    assert!(!cpu.is_empty() && Modifiers::new().mask_mod_cpu(|_, _, _, _| true).is_empty());
    // Debug says a closure is there; equality is the same closure, shared by clones.
    let debug = format!("{cpu:?}");
    assert!(debug.contains("score_mod_cpu: Some(<closure>)"), "{debug}");
    assert!(debug.contains("mask_mod_cpu: Some(<closure>)"), "{debug}");
    assert!(debug.contains("score_mod_grad_cpu: None"), "{debug}");
    assert_eq!(cpu.clone(), cpu);
    assert_ne!(cpu, own);
    assert_ne!(
        cpu,
        own.clone()
            .score_mod_cpu(|s, _, _, _, _| -s)
            .mask_mod_cpu(|_, _, q, kv| kv <= q)
    );
}

#[test]
fn the_reference_needs_each_cpu_form_with_its_wgsl() {
    let score =
        "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 { return score; }";
    let mask = "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool { return true; }";
    let invalid = |m: &Modifiers, backward: bool, says: &str| match m.check_cpu(backward) {
        Err(e @ Error::InvalidArgument { .. }) => assert!(e.to_string().contains(says), "{e}"),
        other => panic!("expected InvalidArgument saying {says:?}, got {other:?}"),
    };
    let s = Modifiers::new().score_mod("s.wgsl", score);
    invalid(&s, false, "score_mod has no CPU form");
    invalid(
        &s.clone().score_mod_grad_cpu(|_, _, _, _, _| 1.0),
        true,
        "Modifiers::score_mod_cpu",
    );
    let m = Modifiers::new().mask_mod("m.wgsl", mask);
    invalid(&m, false, "mask_mod has no CPU form");
    invalid(
        &Modifiers::new().mask_mod_cpu(|_, _, _, _| true),
        false,
        "mask_mod_cpu without its WGSL",
    );
    invalid(
        &Modifiers::new().score_mod_cpu(|s, _, _, _, _| s),
        false,
        "score_mod_cpu without its WGSL",
    );
    // With its CPU form the forward is fine; the backward needs the derivative's too.
    let s = s.score_mod_cpu(|s, _, _, _, _| s);
    s.check_cpu(false).unwrap();
    match s.check_cpu(true) {
        Err(Error::Unsupported { feature, hint, .. }) => {
            assert!(feature.contains("score_mod_grad"), "{feature}");
            assert!(hint.contains("Modifiers::score_mod_grad_cpu("), "{hint}");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    s.score_mod_grad_cpu(|_, _, _, _, _| 1.0)
        .check_cpu(true)
        .unwrap();
    m.mask_mod_cpu(|_, _, _, _| true).check_cpu(true).unwrap();
    // Presets alone need nothing.
    Modifiers::new()
        .preset(Preset::Softcap(2.0))
        .check_cpu(true)
        .unwrap();
}

#[test]
fn each_presets_own_rules_are_the_librarys_check() {
    // What the CLI, Python and the browser relied on checking by hand.
    let refused = |p: Preset, wanted: &str| {
        let m = Modifiers::new().preset(p);
        for e in [
            m.check().unwrap_err(),
            m.check_problem([1, 1, 4, 4]).unwrap_err(),
        ] {
            assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
            assert!(
                e.to_string().contains(wanted),
                "{wanted:?} missing from: {e}"
            );
        }
    };
    for cap in [0.0, -2.0, f32::NAN, f32::INFINITY] {
        refused(Preset::Softcap(cap), "is not a finite positive number");
    }
    refused(Preset::Alibi(vec![f32::NAN]), "finite");
    refused(Preset::Alibi(Vec::new()), "one per query head");
    let bias = |table: Vec<f32>, buckets, max_distance| Preset::RelativeBias {
        table,
        buckets,
        max_distance,
        bidirectional: true,
    };
    refused(bias(vec![0.0], 1, 128), "at least 2");
    refused(bias(vec![f32::INFINITY, 0.0], 2, 128), "finite");
    refused(bias(vec![0.0; 32], 32, 8), "max_distance 8 must exceed");
    refused(
        Preset::Documents {
            ids: Vec::new(),
            n: 0,
        },
        "0 positions",
    );
    Modifiers::new()
        .preset(Preset::Softcap(30.0))
        .preset(Preset::Alibi(vec![0.5]))
        .check()
        .unwrap();
}
