//! The score and mask modifier flags of `sdpa` and `run`: a caller's WGSL files,
//! the buffers they read, and the presets, gathered into one [`Modifiers`].

use std::path::{Path, PathBuf};

use clap::Args;
use wgpu_attention::modifiers::{
    BufferData, BufferSpec, ModifierSpec, Modifiers, PresetSpec, SourceSpec,
};
use wgpu_attention::{npy, Error, Result};

#[derive(Args, Default)]
pub struct ModArgs {
    /// A score modifier: a WGSL file defining
    /// `fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32`, applied to the
    /// scaled score before masking.
    #[arg(long, value_name = "FILE.wgsl")]
    score_mod: Option<PathBuf>,
    /// The score modifier's derivative by its score, for `--grad-output`: a WGSL file defining
    /// `fn score_mod_grad(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32` (without it,
    /// gradients through `--score-mod` are refused).
    #[arg(long, value_name = "FILE.wgsl", requires = "score_mod")]
    score_mod_grad: Option<PathBuf>,
    /// A mask modifier: a WGSL file defining
    /// `fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool` (true = attend).
    #[arg(long, value_name = "FILE.wgsl")]
    mask_mod: Option<PathBuf>,
    /// A buffer the modifiers read as `NAME[i]`: a float .npy becomes an `array<f32>`, an
    /// integer one an `array<i32>`. Repeatable.
    #[arg(long, value_name = "NAME=FILE.npy")]
    mod_buffer: Vec<String>,
    /// Sliding window: query i sees key j when i − LEFT ≤ j ≤ i + RIGHT (Mistral's W is
    /// `--window W-1,0 --causal`).
    #[arg(long, value_name = "LEFT,RIGHT")]
    window: Option<String>,
    /// Logit soft-capping: score ← C·tanh(score / C) (Gemma 2). Score modifiers apply in
    /// one order: --score-mod, --alibi, --relative-bias, then the soft-cap.
    // A negative C reaches the library's rule, not a parse error.
    #[arg(long, value_name = "C", allow_negative_numbers = true)]
    softcap: Option<f32>,
    /// ALiBi: score ← score + slope_h · (j − i), one slope per query head (a 1-D .npy).
    #[arg(long, value_name = "SLOPES.npy")]
    alibi: Option<PathBuf>,
    /// Document masking: an integer per position, (batch, n); a query sees only keys of its
    /// own document.
    #[arg(long, value_name = "IDS.npy")]
    document_ids: Option<PathBuf>,
    /// Prefix-LM: the first P positions attend bidirectionally, the rest causally.
    #[arg(long, value_name = "P")]
    prefix_length: Option<u32>,
    /// T5's relative position bias: a learned (buckets, heads) table (Hugging Face's
    /// `relative_attention_bias.weight`); score ← score + table[bucket(j − i), h].
    #[arg(long, value_name = "TABLE.npy")]
    relative_bias: Option<PathBuf>,
    /// With --relative-bias: the distance from which the bucket stops changing (default
    /// T5's, 128).
    #[arg(long, value_name = "N")]
    relative_bias_max_distance: Option<u32>,
    /// With --relative-bias: one-way buckets (T5's decoder: keys after the query share
    /// bucket 0) instead of two-way (its encoder).
    #[arg(long)]
    relative_bias_unidirectional: bool,
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io(path, format!("cannot read: {e}")))
}

/// An integer `.npy` as i32s.
fn read_i32(path: &Path) -> Result<(Vec<usize>, Vec<i32>)> {
    let a = npy::read_ints(path)?;
    let shape = a.shape().to_vec();
    let v = a
        .iter()
        .map(|&x| i32::try_from(x).map_err(|_| Error::io(path, format!("value {x} is past i32"))))
        .collect::<Result<Vec<_>>>()?;
    Ok((shape, v))
}

impl ModArgs {
    /// The modifiers the flags give (empty without any): the flags fill the library's
    /// [`ModifierSpec`], which names, defaults and checks every modifier.
    pub fn modifiers(&self) -> Result<Modifiers> {
        self.spec()?.modifiers()
    }

    /// The flags as the library's schema: a caller's WGSL and its buffers, then the presets
    /// in the order the flags' help gives.
    fn spec(&self) -> Result<ModifierSpec> {
        let mut spec = ModifierSpec::new();
        let source = |p: &PathBuf| -> Result<SourceSpec> {
            Ok(SourceSpec::new(p.display().to_string(), read_text(p)?))
        };
        spec.score_mod = self.score_mod.as_ref().map(source).transpose()?;
        spec.score_mod_grad = self.score_mod_grad.as_ref().map(source).transpose()?;
        spec.mask_mod = self.mask_mod.as_ref().map(source).transpose()?;
        for arg in &self.mod_buffer {
            let Some((name, file)) = arg.split_once('=') else {
                return Err(Error::invalid(
                    "--mod-buffer",
                    format!("{arg:?} is not NAME=FILE.npy"),
                ));
            };
            let path = Path::new(file);
            let data = match read_i32(path) {
                Ok((_, v)) => BufferData::I32(v),
                Err(_) => BufferData::F32(npy::read(path)?.iter().copied().collect()),
            };
            spec.buffers.push(BufferSpec::new(name, data));
        }
        if let Some(w) = &self.window {
            let parts: Vec<_> = w.split(',').map(|s| s.trim().parse::<u32>()).collect();
            let [Ok(left), Ok(right)] = parts[..] else {
                return Err(Error::invalid(
                    "--window",
                    format!("{w:?} is not LEFT,RIGHT (two counts of keys, e.g. 511,0)"),
                ));
            };
            spec.presets.push(PresetSpec::Window([left, right]));
        }
        if let Some(p) = &self.alibi {
            let slopes = npy::read(p)?;
            spec.presets.push(PresetSpec::alibi_array(
                "--alibi",
                slopes.shape(),
                slopes.iter().copied().collect(),
            )?);
        }
        if let Some(p) = &self.document_ids {
            let (shape, ids) = read_i32(p)?;
            spec.presets
                .push(PresetSpec::documents_array("--document-ids", &shape, &ids)?);
        }
        if let Some(p) = self.prefix_length {
            spec.presets.push(PresetSpec::PrefixLm(p));
        }
        if let Some(p) = &self.relative_bias {
            let table = npy::read(p)?;
            spec.presets.push(PresetSpec::relative_bias_array(
                "--relative-bias",
                table.shape(),
                table.iter().copied().collect(),
                self.relative_bias_max_distance,
                self.relative_bias_unidirectional.then_some(false),
            )?);
        } else if self.relative_bias_max_distance.is_some() || self.relative_bias_unidirectional {
            return Err(Error::invalid(
                "modifier",
                "--relative-bias-max-distance and --relative-bias-unidirectional need \
                 --relative-bias",
            ));
        }
        // Last of the score presets, as Gemma 2 caps its final logits (the order of
        // Python's flex_attention too).
        if let Some(c) = self.softcap {
            spec.presets.push(PresetSpec::Softcap(c));
        }
        Ok(spec)
    }
}
