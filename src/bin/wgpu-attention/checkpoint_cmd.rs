//! `run --weights CKPT --prefix P`: the checkpoint's layer and its head count.

use std::path::Path;

use wgpu_attention::checkpoint::{self, LayerWeights};
use wgpu_attention::{Error, Result};

/// The layer `prefix` names in `file`, ready for `heads` query heads (`--heads`, else the
/// `config.json` beside the file); grouped-query layers run with their K/V heads shared.
pub fn layer(file: &Path, prefix: &str, heads: Option<usize>) -> Result<(LayerWeights, usize)> {
    let layer = checkpoint::load(file, prefix)?;
    let (heads, kv_heads) = match heads {
        Some(h) => (h, None),
        None => match checkpoint::heads_from_config(file)? {
            Some(c) => (c.heads, c.kv_heads),
            None => {
                return Err(Error::invalid(
                    "--heads",
                    format!(
                        "not given, and there is no config.json beside {} to read \
                         num_attention_heads from: give --heads",
                        file.display()
                    ),
                ))
            }
        },
    };
    layer.check_kv_heads(heads, kv_heads)?;
    println!(
        "layer     {prefix} ({:?} layout): Q/K/V{}, output projection {}",
        layer.layout,
        match (&layer.biases.q, &layer.biases.k, &layer.biases.v) {
            (None, None, None) => " without biases".to_string(),
            (Some(_), Some(_), Some(_)) => " with biases".to_string(),
            (q, k, v) => format!(
                " with biases on {}",
                [("Q", q.is_some()), ("K", k.is_some()), ("V", v.is_some())]
                    .iter()
                    .filter(|(_, has)| *has)
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
        if layer.output.is_some() {
            "applied"
        } else {
            "none (the output is the context)"
        }
    );
    Ok((layer, heads))
}
