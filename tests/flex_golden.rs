//! Golden cases of the modifier presets from PyTorch (tests/python/make_flex_cases.py, run
//! where torch is installed; its files are committed under tests/data/flex): FlexAttention's
//! output in float64 for every preset (sliding window, soft-capping, ALiBi, document ids,
//! prefix-LM, T5's relative position bias with transformers' buckets), causal and not, with `L ≠ S`, grouped-query heads and a scale. The crate's fused
//! forward with the matching `Preset`, NaN-prefilled, must agree to 1e-5 relative on both
//! families that apply modifiers; and the gradients of a `d_o` (torch autograd in float64)
//! from a saved forward and its fused backward to 1e-4 (T5's table's own gradient too).
//! Checked to fail: with the presets left out, every case but `prefix_lm_causal` (plain causal
//! attention, as prefix-LM and-ed with causal is) fails, relative errors 0.07–0.86.

mod common;

use std::path::Path;

use ndarray::{Array1, Array2, Array4, ArrayD};
use serde_json::Value;
use wgpu_attention::modifiers::{Modifiers, Preset};
use wgpu_attention::{npy, reference, Attention, Inputs, Kernels, Mask, Options};

fn four(dir: &Path, name: &str) -> Array4<f32> {
    npy::read(&dir.join(format!("{name}.npy")))
        .unwrap()
        .into_dimensionality()
        .unwrap()
}

fn uint(meta: &Value, key: &str) -> u32 {
    meta[key]
        .as_u64()
        .unwrap_or_else(|| panic!("meta.json: {key}")) as u32
}

/// The case's preset, from its `meta.json` and its own arrays.
fn preset(dir: &Path, meta: &Value) -> Preset {
    match meta["preset"].as_str().unwrap() {
        "window" => Preset::Window {
            left: uint(meta, "left"),
            right: uint(meta, "right"),
        },
        "softcap" => Preset::Softcap(meta["cap"].as_f64().unwrap() as f32),
        "alibi" => {
            let slopes: Array1<f32> = ndarray_npy::read_npy(dir.join("slopes.npy")).unwrap();
            // PyTorch's side computed its own standard slopes: the crate's must be the same.
            assert_eq!(slopes.to_vec(), Preset::alibi_slopes(slopes.len()));
            Preset::Alibi(slopes.to_vec())
        }
        "documents" => {
            let ids: Array2<i32> = ndarray_npy::read_npy(dir.join("ids.npy")).unwrap();
            Preset::Documents {
                n: ids.ncols() as u32,
                ids: ids.iter().copied().collect(),
            }
        }
        "prefix_lm" => Preset::PrefixLm(uint(meta, "length")),
        "relative_bias" => {
            let table: Array2<f32> = ndarray_npy::read_npy(dir.join("table.npy")).unwrap();
            Preset::RelativeBias {
                buckets: uint(meta, "buckets"),
                table: table.iter().copied().collect(),
                max_distance: uint(meta, "max_distance"),
                bidirectional: meta["bidirectional"].as_bool().unwrap(),
            }
        }
        other => panic!("unknown preset {other}"),
    }
}

#[test]
fn every_flex_attention_case_agrees_on_both_families() {
    let mut failures = Vec::new();
    for common::Case { dir, name, meta } in &common::cases("flex", 16) {
        let (q, k, v) = (four(dir, "q"), four(dir, "k"), four(dir, "v"));
        let want: ArrayD<f64> = ndarray_npy::read_npy(dir.join("context.npy")).unwrap();
        let mods = Modifiers::new().preset(preset(dir, meta));
        let mask = Mask::none().with_modifiers(&mods);
        for kernels in [Kernels::Storage, Kernels::Subgroup] {
            let mut op = Attention::new()
                .causal(meta["causal"].as_bool().unwrap())
                .return_weights(false)
                .options(Options::default().kernels(kernels).nan_fill(true));
            if let Some(s) = meta["scale"].as_f64() {
                op = op.scale(s as f32);
            }
            let got = match op.run(common::ctx(), Inputs::qkv(&q, &k, &v).mask(&mask)) {
                Ok(out) => out.context.into_dyn(),
                Err(e) => {
                    failures.push(format!("{name} {kernels:?}: {e}"));
                    continue;
                }
            };
            let (rel, max) = reference::compare(&got, &want);
            // NaN (a slot the kernel never wrote) fails too.
            if rel.is_nan() || rel > 1e-5 {
                failures.push(format!(
                    "{name} {kernels:?}: rel {rel:.2e}, max abs {max:.2e}"
                ));
            }
            if let Err(e) = gradients_agree(dir, op, [&q, &k, &v], &mask) {
                failures.push(format!("{name} {kernels:?}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The case's gradients (`grad_q`, `grad_k`, `grad_v` for `d_o`) against a saved forward of
/// `op` and its fused backward, to 1e-4 relative: the failures, one line.
fn gradients_agree(
    dir: &Path,
    op: Attention,
    [q, k, v]: [&Array4<f32>; 3],
    mask: &Mask<'_>,
) -> Result<(), String> {
    let ctx = common::ctx();
    let d_o = four(dir, "d_o");
    let out = op
        .save_for_backward(true)
        .run(ctx, Inputs::qkv(q, k, v).mask(mask))
        .map_err(|e| e.to_string())?;
    let saved = out.saved.ok_or("no saved state")?;
    let g = saved.backward(ctx, d_o.view()).map_err(|e| e.to_string())?;
    let mut bad = Vec::new();
    // T5's table has a gradient of its own exactly when the case has one.
    let table = dir.join("grad_table.npy");
    if table.exists() != g.relative_bias.is_some() {
        return Err(format!("a table gradient: {}", g.relative_bias.is_some()));
    }
    let named = [
        ("grad_q", g.q),
        ("grad_k", g.k),
        ("grad_v", g.v),
        ("grad_table", g.relative_bias),
    ];
    for (name, got) in named.into_iter().filter(|(_, g)| g.is_some()) {
        let want: ArrayD<f64> = ndarray_npy::read_npy(dir.join(format!("{name}.npy"))).unwrap();
        let (rel, max) = reference::compare(&got.ok_or("no gradient")?, &want);
        if rel.is_nan() || rel > 1e-4 {
            bad.push(format!("{name} rel {rel:.2e}, max abs {max:.2e}"));
        }
    }
    match bad.is_empty() {
        true => Ok(()),
        false => Err(bad.join("; ")),
    }
}
