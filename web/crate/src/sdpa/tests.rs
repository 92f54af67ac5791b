//! `Session::sdpa`'s request handling natively (lavapipe here): the checks the browser test
//! makes, run without a browser.

use serde_json::{json, Value};
use wgpu_attention::Context;

use super::{run_parsed, Response};

fn ctx() -> Context {
    Context::new().expect("a native adapter (lavapipe in CI)")
}

/// `(1, heads, n, e)` of deterministic values.
fn tensor(heads: usize, n: usize, e: usize, seed: usize) -> Value {
    let data: Vec<f32> = (0..heads * n * e)
        .map(|i| (((i * 7 + seed * 13) % 23) as f32 * 0.37).sin())
        .collect();
    json!({ "shape": [1, heads, n, e], "data": data })
}

fn request(extra: Value) -> String {
    let mut r =
        json!({ "q": tensor(2, 12, 8, 1), "k": tensor(2, 12, 8, 2), "v": tensor(2, 12, 8, 3) });
    r.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    r.to_string()
}

fn call(ctx: &Context, extra: Value) -> Result<Response, String> {
    pollster::block_on(run_parsed(ctx, &request(extra)))
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter()
        .zip(b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs() / scale))
}

#[test]
fn presets_match_the_reference() {
    let ctx = ctx();
    let r = call(
        &ctx,
        json!({ "presets": [{ "window": [3, 1] }, { "softcap": 2.5 }], "weights": true, "reference": true }),
    )
    .unwrap();
    assert_eq!(r.shape, [1, 2, 12, 8]);
    let c = r.reference.expect("compared");
    assert!(c.output_rel < 1e-5, "{c:?}");
    assert!(c.weights_rel.unwrap() < 1e-5, "{c:?}");
    // The window is there: query 0 gives key 5 no weight.
    assert_eq!(r.weights.unwrap()[5], 0.0);
}

#[test]
fn own_mask_mod_reading_a_buffer_equals_the_documents_preset() {
    let ctx = ctx();
    let ids = [0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 3];
    let preset = call(
        &ctx,
        json!({ "causal": true, "presets": [{ "documents": [ids] }], "reference": true }),
    )
    .unwrap();
    assert!(preset.reference.unwrap().output_rel < 1e-5);
    let own = call(
        &ctx,
        json!({
            "causal": true,
            "mask_mod": { "origin": "docs.wgsl", "wgsl":
                "fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {\n    return doc[q] == doc[kv];\n}\n" },
            "buffers": [{ "name": "doc", "i32": ids }],
            "reference": true,
        }),
    )
    .unwrap();
    assert!(max_rel(&own.output, &preset.output) < 1e-6);
    // The reference has no CPU form of a caller's WGSL: said, not failed.
    assert!(own.reference.is_none());
    assert!(own.reference_skipped.unwrap().contains("has no CPU form"));
}

#[test]
fn a_syntax_error_names_the_origin_line_and_column() {
    let e = call(
        &ctx(),
        json!({ "score_mod": { "origin": "bad.wgsl", "wgsl":
            "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    return score +* 2.0;\n}\n" } }),
    )
    .unwrap_err();
    assert!(e.starts_with("invalid modifier: bad.wgsl:2:"), "{e}");
    assert!(!e.contains('\n'), "{e}");
}

#[test]
fn a_binding_is_refused() {
    let e = call(
        &ctx(),
        json!({ "score_mod": { "wgsl":
            "@group(0) @binding(0) var<storage, read> t: array<f32>;\n\
             fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 { return score + t[h]; }\n" } }),
    )
    .unwrap_err();
    assert!(e.contains("may not declare `var t`"), "{e}");
}

#[test]
fn bad_requests_are_refused_with_what_is_wrong() {
    let ctx = ctx();
    let e = call(&ctx, json!({ "casual": true })).unwrap_err();
    assert!(e.starts_with("sdpa request: unknown field `casual`"), "{e}");
    let e = call(&ctx, json!({ "q": { "shape": [1, 2, 12], "data": [] } })).unwrap_err();
    assert!(e.contains("q: expected a shape of 4 axes"), "{e}");
    let e = call(
        &ctx,
        json!({ "q": { "shape": [1, 2, 12, 9], "data": [0.0] } }),
    )
    .unwrap_err();
    assert!(e.contains("has 216 elements, data has 1"), "{e}");
    let e = call(
        &ctx,
        json!({ "buffers": [{ "name": "x", "f32": [1.0], "i32": [1] }] }),
    )
    .unwrap_err();
    assert!(e.contains("exactly one of"), "{e}");
    // The library's own check: one ALiBi slope per query head.
    let e = call(&ctx, json!({ "presets": [{ "alibi": [0.5] }] })).unwrap_err();
    assert!(e.contains("ALiBi has 1 slopes"), "{e}");
    // And a soft-cap finite and positive (Modifiers::check): the crate checks nothing itself.
    let e = call(&ctx, json!({ "presets": [{ "softcap": -2.0 }] })).unwrap_err();
    assert!(
        e.contains("softcap: -2 is not a finite positive number"),
        "{e}"
    );
}

/// Every modifier rule gives the library's message, the one the CLI and Python give
/// (tests/data/modifier_rules.json, read by the root crate's tests and Python's too).
#[test]
fn every_modifier_rule_gives_the_librarys_message() {
    let doc: Value =
        serde_json::from_str(include_str!("../../../../tests/data/modifier_rules.json")).unwrap();
    // The problem the requests here are: (batch, heads, L, S, E).
    assert_eq!(doc["problem"], json!([1, 2, 12, 12, 8]));
    let ctx = ctx();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 13);
    for case in cases {
        let e = call(&ctx, json!({ "presets": case["presets"] })).unwrap_err();
        assert_eq!(e, case["message"].as_str().unwrap(), "{}", case["rule"]);
    }
}
