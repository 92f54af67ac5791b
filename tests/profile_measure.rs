//! `profile --measure`: the predicted calls run again on the adapter at hand, one
//! `model-check:` line per kernel with both times and their ratio (what a real GPU run greps
//! for); `--device auto` names the description it took.

use wgpu_attention::profile::DeviceSpec;

mod common;

fn profile(args: &[&str]) -> String {
    common::ok(&common::cli(&[&["profile"], args].concat()))
}

/// The `model-check:` lines with both times: a positive prediction, a measurement and their
/// ratio (a kernel on one side only says `-` on the other).
fn checks(text: &str) -> Vec<(f64, f64)> {
    text.lines()
        .filter(|l| l.contains("model-check:") && l.contains(" ratio "))
        .map(|l| {
            let num = |after: &str| -> f64 {
                let rest = &l[l.find(after).unwrap_or_else(|| panic!("{l}")) + after.len()..];
                rest.split_whitespace().next().unwrap().parse().unwrap()
            };
            let (p, m, r) = (num("predicted "), num("measured "), num("ratio "));
            assert!(p > 0.0 && m > 0.0, "{l}");
            // Times printed to three decimals: measured / ratio is the unrounded prediction,
            // within half a printed unit of the printed one (a tiny prediction rounds by
            // more than any fixed share of it).
            assert!(
                (m / r - p).abs() <= 0.0005 * (1.0 + r.recip()) + 0.01 * p,
                "{l}"
            );
            (p, m)
        })
        .collect()
}

#[test]
fn the_fused_call_is_measured_beside_each_variants_prediction() {
    let text = profile(&[
        "--batch",
        "1",
        "--heads",
        "1",
        "--n",
        "40",
        "--d",
        "16",
        "--causal",
        "--device",
        "auto",
        "--measure",
        "--repeats",
        "1",
        "--sample",
        "2",
    ]);
    // lavapipe has no shipped description: generic, and it says so.
    assert!(text.contains("no description of"), "{text}");
    // Every variant measured or said not to be (flash-coop: lavapipe has no tensor cores).
    let variants = text.lines().filter(|l| l.contains(": predicted ")).count();
    let unmeasured = text.lines().filter(|l| l.contains("not measured:")).count();
    let lines = checks(&text);
    assert!(
        unmeasured < variants && lines.len() + unmeasured >= variants,
        "{text}"
    );
    assert!(
        text.lines()
            .filter(|l| l.contains("model-check:"))
            .all(|l| l.contains("flash_blocked") || l.contains("flash_")),
        "{text}"
    );
}

#[test]
fn a_decoding_step_is_measured_beside_its_prediction() {
    let text = profile(&[
        "--decode",
        "--batch",
        "1",
        "--heads",
        "2",
        "--d",
        "16",
        "--n",
        "64",
        "--measure",
        "--repeats",
        "1",
    ]);
    assert!(!checks(&text).is_empty(), "{text}");
}

#[test]
fn auto_finds_the_h100_and_the_h200_by_their_adapter_names() {
    let name = |a: &str| DeviceSpec::for_adapter(a).map(|d| d.name);
    assert_eq!(name("NVIDIA H100 80GB HBM3"), Some("h100"));
    assert_eq!(name("NVIDIA H200"), Some("h200"));
    assert_eq!(name("llvmpipe (LLVM 15.0.6, 256 bits)"), None);
    let (h100, h200) = (DeviceSpec::h100(), DeviceSpec::h200());
    assert!(h200.dram_bandwidth > h100.dram_bandwidth);
    assert_eq!(h200.fma_flops, h100.fma_flops);
}
