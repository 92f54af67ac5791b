//! The pipeline of the post "Building the Self-Attention Mechanism of Large Language Models
//! from scratch", end to end: a sentence's words sorted into a vocabulary, the sentence
//! as indices, a seeded random embedding (d = 16), seeded weights (d_k = 24, d_v = 28), and
//! attention over it.

use ndarray::{Array2, Ix2};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

use crate::error::{Error, Result};

/// The sentence that post uses.
pub const DEFAULT_SENTENCE: &str = "Life is short, eat dessert first";
/// Embedding width.
pub const D: usize = 16;
/// Query/key width.
pub const D_K: usize = 24;
/// Value width.
pub const D_V: usize = 28;

/// The demo's inputs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DemoInputs {
    /// The words of the sentence, in order.
    pub words: Vec<String>,
    /// The vocabulary: the distinct words, sorted.
    pub vocab: Vec<String>,
    /// Each word's index into the vocabulary.
    pub indices: Vec<usize>,
    /// The embedded sentence, `(n, 16)`.
    pub x: Array2<f32>,
    /// `W_Q`, `(16, 24)`.
    pub w_q: Array2<f32>,
    /// `W_K`, `(16, 24)`.
    pub w_k: Array2<f32>,
    /// `W_V`, `(16, 28)`.
    pub w_v: Array2<f32>,
}

/// Tokenises `sentence` (commas dropped, split on whitespace) and draws the embedding
/// (standard normal) and weights (uniform in [0, 1), as `torch.rand`) from a ChaCha8 stream
/// seeded with `seed`.
///
/// # Errors
/// [`Error::InvalidArgument`] for a sentence with no words.
pub fn inputs(sentence: &str, seed: u64) -> Result<DemoInputs> {
    let cleaned = sentence.replace([',', '.', ';', ':', '!', '?'], " ");
    let words: Vec<String> = cleaned.split_whitespace().map(str::to_string).collect();
    if words.is_empty() {
        return Err(Error::invalid("sentence", "has no words"));
    }
    let mut vocab = words.clone();
    vocab.sort();
    vocab.dedup();
    let indices: Vec<usize> = words
        .iter()
        .map(|w| vocab.binary_search(w).unwrap_or_default())
        .collect();

    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let embedding =
        Array2::from_shape_simple_fn((vocab.len(), D), || rng.sample::<f32, _>(StandardNormal));
    let x = embedding.select(ndarray::Axis(0), &indices);
    let mut uniform =
        |rows, cols| Array2::from_shape_simple_fn((rows, cols), || rng.random::<f32>());
    let w_k = uniform(D, D_K);
    let w_q = uniform(D, D_K);
    let w_v = uniform(D, D_V);
    Ok(DemoInputs {
        words,
        vocab,
        indices,
        x,
        w_q,
        w_k,
        w_v,
    })
}

/// Formats a square weights matrix as a table labelled by `labels` on both axes.
///
/// # Errors
/// [`Error::ShapeMismatch`] when `weights` is not `(n, n)` for `n` labels.
pub fn table(labels: &[String], weights: &ndarray::ArrayD<f32>) -> Result<String> {
    let w = weights
        .view()
        .into_dimensionality::<Ix2>()
        .map_err(|e| Error::shape(e.to_string()))?;
    let width = labels.iter().map(|l| l.len()).max().unwrap_or(0).max(8);
    let mut out = format!("{:>width$}", "");
    for l in labels {
        out += &format!(" {:>width$}", l);
    }
    out.push('\n');
    for (i, l) in labels.iter().enumerate() {
        out += &format!("{:>width$}", l);
        for j in 0..labels.len() {
            out += &format!(" {:>width$.4}", w[[i, j]]);
        }
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocabulary_is_sorted_like_seed_000() {
        let d = inputs(DEFAULT_SENTENCE, 42).unwrap();
        assert_eq!(d.vocab, ["Life", "dessert", "eat", "first", "is", "short"]);
        assert_eq!(d.indices, [0, 4, 5, 2, 1, 3]);
        assert_eq!(d.x.dim(), (6, 16));
        assert_eq!((d.w_q.dim(), d.w_v.dim()), ((16, 24), (16, 28)));
    }

    #[test]
    fn empty_sentence_is_an_error() {
        assert!(inputs(" , ", 1).is_err());
    }
}
