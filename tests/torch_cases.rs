//! Independent cases produced by PyTorch itself (tests/python/make_torch_cases.py, run where
//! torch is installed; its outputs are committed under tests/data/torch): its
//! `scaled_dot_product_attention` with L ≠ S, causal, grouped-query heads, a scale, boolean
//! and float masks; `nn.MultiheadAttention` with key padding and a mask, and a BERT-named
//! self-attention block with its output dense, both loaded from the `.safetensors` PyTorch
//! wrote. Each must agree with PyTorch to float32 accuracy, on every kernel path.

mod common;

use std::path::{Path, PathBuf};

use ndarray::{Array4, ArrayD};
use wgpu_attention::{checkpoint, npy, reference, verify, Attention};

fn cases() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("meta.json").exists())
        .collect();
    out.sort();
    out
}

fn load(dir: &Path, name: &str) -> Option<ArrayD<f32>> {
    let path = dir.join(format!("{name}.npy"));
    path.exists().then(|| npy::read(&path).unwrap())
}

fn four(a: ArrayD<f32>) -> Array4<f32> {
    a.into_dimensionality().unwrap()
}

/// Relative error against PyTorch's float32 output (not an f64 truth: both sides round).
fn agrees(what: &str, got: &ArrayD<f32>, torch: &ArrayD<f32>) -> Result<(), String> {
    if got.shape() != torch.shape() {
        return Err(format!(
            "{what}: shape {:?} vs {:?}",
            got.shape(),
            torch.shape()
        ));
    }
    let (rel, max) = reference::compare(got, &torch.mapv(f64::from));
    if rel > 2e-5 {
        return Err(format!("{what}: rel {rel:e}, max abs {max:e}"));
    }
    Ok(())
}

#[test]
fn every_pytorch_case_agrees_on_every_path() {
    let ctx = common::ctx();
    let cases = cases();
    assert!(
        cases.len() >= 9,
        "expected the committed cases, found {}",
        cases.len()
    );
    let mut failures = Vec::new();
    for dir in &cases {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
        let want_context = load(dir, "context").unwrap();
        let want_weights = load(dir, "weights").unwrap();
        let mask_array = dir
            .join("mask.npy")
            .exists()
            .then(|| npy::read_mask(&dir.join("mask.npy")).unwrap());
        let lengths = dir
            .join("kv_lengths.npy")
            .exists()
            .then(|| npy::read_lengths(&dir.join("kv_lengths.npy")).unwrap());
        let mut mask = mask_array.as_ref().map(|m| m.mask()).unwrap_or_default();
        if let Some(l) = &lengths {
            mask = mask.with_kv_lengths(l);
        }
        for (kernels, fused) in verify::paths(ctx) {
            let label = format!("{name} {kernels} fused={fused}");
            let base = Attention::new().kernels(kernels).return_weights(!fused);
            let got = match meta["kind"].as_str().unwrap() {
                "sdpa" => {
                    let mut op = base.causal(meta["causal"].as_bool().unwrap());
                    if let Some(s) = meta["scale"].as_f64() {
                        op = op.scale(s as f32);
                    }
                    let [q, k, v] = ["q", "k", "v"].map(|n| four(load(dir, n).unwrap()));
                    op.sdpa_masked(ctx, q.view(), k.view(), v.view(), &mask)
                }
                _ => {
                    let prefix = meta["prefix"].as_str().unwrap();
                    let layer = checkpoint::load(&dir.join("layer.safetensors"), prefix).unwrap();
                    let heads = meta["heads"].as_u64().unwrap() as usize;
                    let x = load(dir, "x").unwrap();
                    base.heads(heads).forward_masked(
                        ctx,
                        x.view(),
                        Some(&layer.projections()),
                        &mask,
                    )
                }
            };
            let got = match got {
                Ok(g) => g,
                Err(e) => {
                    failures.push(format!("{label}: {e}"));
                    continue;
                }
            };
            if let Err(e) = agrees("context", &got.context, &want_context) {
                failures.push(format!("{label} {e}"));
            }
            if let Some(w) = &got.weights {
                if let Err(e) = agrees("weights", w, &want_weights) {
                    failures.push(format!("{label} {e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
