//! Independent cases produced by PyTorch itself (tests/python/make_torch_cases.py, run where
//! torch is installed; its outputs are committed under tests/data/torch): its
//! `scaled_dot_product_attention` with L ≠ S, causal, grouped-query heads, a scale, boolean
//! and float masks; layers loaded from the `.safetensors` PyTorch wrote: `nn.MultiheadAttention`
//! with key padding and a mask, a BERT block under its `attention.self` prefix (the context)
//! and its parent `attention` prefix (with `output.dense`), a Llama-style grouped-query layer
//! without biases whose head counts come from its `config.json`, a layer with query and value
//! biases but no key bias, and all-MiniLM-L6-v2's first layer against transformers'
//! `BertSelfAttention`. Each must agree with PyTorch to float32 accuracy, on every kernel path.

mod common;

use std::path::{Path, PathBuf};

use ndarray::{Array4, ArrayD};
use wgpu_attention::{checkpoint, npy, reference, verify, Attention, Inputs, Options};

fn load(dir: &Path, name: &str) -> Option<ArrayD<f32>> {
    let path = dir.join(format!("{name}.npy"));
    path.exists().then(|| npy::read(&path).unwrap())
}

fn four(a: ArrayD<f32>) -> Array4<f32> {
    a.into_dimensionality().unwrap()
}

/// Relative error against PyTorch's float32 output (not an f64 truth: both sides round).
fn agrees(what: &str, got: &ArrayD<f32>, torch: &ArrayD<f32>, tol: f64) -> Result<(), String> {
    if got.shape() != torch.shape() {
        return Err(format!(
            "{what}: shape {:?} vs {:?}",
            got.shape(),
            torch.shape()
        ));
    }
    let (rel, max) = reference::compare(got, &torch.mapv(f64::from));
    if rel > tol {
        return Err(format!("{what}: rel {rel:e}, max abs {max:e}"));
    }
    Ok(())
}

#[test]
fn every_pytorch_case_agrees_on_every_path() {
    let ctx = common::ctx();
    let mut failures = Vec::new();
    for common::Case { dir, name, meta } in &common::cases("torch", 13) {
        let want_context = load(dir, "context").unwrap();
        let want_weights = load(dir, "weights").unwrap();
        let tol = meta["tolerance"].as_f64().unwrap_or(2e-5);
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
            let base = Attention::new()
                .options(Options::default().kernels(kernels))
                .return_weights(!fused);
            let got = match meta["kind"].as_str().unwrap() {
                "sdpa" => {
                    let mut op = base.causal(meta["causal"].as_bool().unwrap());
                    if let Some(s) = meta["scale"].as_f64() {
                        op = op.scale(s as f32);
                    }
                    let [q, k, v] = ["q", "k", "v"].map(|n| four(load(dir, n).unwrap()));
                    op.run(ctx, Inputs::qkv(&q, &k, &v).mask(&mask))
                }
                _ => {
                    let prefix = meta["prefix"].as_str().unwrap();
                    let file = dir.join("layer.safetensors");
                    // The head counts from meta.json, or else from the case's config.json.
                    let (heads, kv_heads) = match meta["heads"].as_u64() {
                        Some(h) => (h as usize, None),
                        None => {
                            let c = checkpoint::heads_from_config(&file).unwrap().unwrap();
                            (c.heads, c.kv_heads)
                        }
                    };
                    let layer = checkpoint::load(&file, prefix).unwrap();
                    // Grouped-query layers run as they are, K/V heads shared.
                    layer.check_kv_heads(heads, kv_heads).unwrap();
                    let x = load(dir, "x").unwrap();
                    let causal = meta["causal"].as_bool().unwrap_or(false);
                    let proj = layer.projections();
                    let inputs = Inputs::x(&x).projections(&proj).mask(&mask);
                    base.heads(heads).causal(causal).run(ctx, inputs)
                }
            };
            let got = match got {
                Ok(g) => g,
                Err(e) => {
                    failures.push(format!("{label}: {e}"));
                    continue;
                }
            };
            if let Err(e) = agrees("context", &got.context, &want_context, tol) {
                failures.push(format!("{label} {e}"));
            }
            if let Some(w) = &got.weights {
                if let Err(e) = agrees("weights", w, &want_weights, tol) {
                    failures.push(format!("{label} {e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn cli_runs_minilm_self_attention_with_heads_from_its_config_json() {
    // `run --weights … --prefix encoder.layer.0.attention.self` with no --heads: the 12
    // heads come from the model's config.json, and the output is BertSelfAttention's.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch/minilm_l6_layer0");
    let out_dir = tempfile::tempdir().unwrap();
    let arg = |p: PathBuf| p.to_str().unwrap().to_string();
    let out = common::bin()
        .args([
            "run",
            "--prefix",
            "encoder.layer.0.attention.self",
            "--context-only",
        ])
        .args(["--weights", &arg(dir.join("layer.safetensors"))])
        .args(["--x", &arg(dir.join("x.npy"))])
        .args(["--kv-lengths", &arg(dir.join("kv_lengths.npy"))])
        .args(["--out", &arg(out_dir.path().to_path_buf())])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("heads 12"), "{stdout}");
    assert!(stdout.contains("output projection none"), "{stdout}");
    let got = npy::read(&out_dir.path().join("context.npy")).unwrap();
    agrees("context", &got, &load(&dir, "context").unwrap(), 1e-5).unwrap();
}
