//! One attention layer's projections from a `.safetensors` checkpoint, as PyTorch stores
//! them: `nn.Linear(d_in, d_out).weight` is `(d_out, d_in)`, so each weight is transposed
//! into the `X·W` orientation [`Projections`] takes. Layouts, under a prefix `P`:
//!
//! | layout | Q, K, V | output projection (optional) |
//! |---|---|---|
//! | BERT | `P.query`, `P.key`, `P.value` (`.weight`, `.bias`) | `P.output.dense`, or for `P = ….self`, `….output.dense` (Hugging Face's `attention.self` / `attention.output.dense`) |
//! | separate projections (BART, Llama, …) | `P.q_proj`, `P.k_proj`, `P.v_proj` | `P.out_proj` or `P.o_proj` |
//! | `nn.MultiheadAttention` | `P.in_proj_weight` `(3E, E)` and `P.in_proj_bias` `(3E,)`, split in thirds | `P.out_proj` |
//!
//! The file is memory-mapped: only its header and the layer's tensors are read. Biases are
//! optional (all of Q, K, V or none). Tensors may be F32, F16, BF16 or F64;
//! they are converted to f32. The number of heads is not stored in these checkpoints: give
//! it with [`crate::Attention::heads`] (`--heads`).

use std::path::Path;

use ndarray::{s, Array1, Array2};
use safetensors::{Dtype as StDtype, SafeTensors};

use crate::attention::{OwnedBiases, OwnedOutput, OwnedWeights, Projections};
use crate::error::{Error, Result};

/// Which naming the layer was found under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `P.query` / `P.key` / `P.value` (Hugging Face BERT).
    Bert,
    /// `P.q_proj` / `P.k_proj` / `P.v_proj`.
    Separate,
    /// `P.in_proj_weight` / `P.in_proj_bias` (`nn.MultiheadAttention`).
    InProj,
}

/// One layer's weights in the `X·W` orientation, owned.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// `W_Q (d, d_k)`, `W_K (d, d_k)`, `W_V (d, d_v)`.
    pub weights: OwnedWeights,
    /// `b_Q, b_K, b_V`, when the checkpoint has them.
    pub biases: Option<OwnedBiases>,
    /// `W_O (d_v, d_out)` and `b_O`, when the checkpoint has an output projection.
    pub output: Option<OwnedOutput>,
    /// Where they were found.
    pub layout: Layout,
}

impl LayerWeights {
    /// The projections, borrowing these arrays.
    pub fn projections(&self) -> Projections<'_> {
        Projections::of(&self.weights, self.biases.as_ref(), self.output.as_ref())
    }
}

/// Loads the attention layer under `prefix` from a `.safetensors` file.
///
/// # Errors
/// [`Error::Io`] naming the file when it cannot be read or is not a safetensors file, when no
/// layout's tensors are under the prefix, or when one is missing, mis-shaped or of an
/// unsupported dtype; each message lists the tensors the file has under the prefix (or, when
/// there are none, the first names in the file).
pub fn load(path: &Path, prefix: &str) -> Result<LayerWeights> {
    let file =
        std::fs::File::open(path).map_err(|e| Error::io(path, format!("cannot read: {e}")))?;
    if file.metadata().map(|m| m.is_dir()).unwrap_or(false) {
        return Err(Error::io(path, "cannot read: is a directory"));
    }
    // Mapped, not read: only the header and the layer's own tensors are paged in, so a
    // multi-gigabyte checkpoint need not fit in memory.
    // SAFETY: the map is read-only and lives only for this call; as with every reader of
    // mapped checkpoints (safetensors' own examples), the file must not be truncated while
    // it is being read.
    let map = unsafe { memmap2::Mmap::map(&file) }
        .map_err(|e| Error::io(path, format!("cannot read: {e}")))?;
    parse(&map, prefix).map_err(|m| Error::io(path, m))
}

/// [`load`] over the file's bytes.
///
/// # Errors
/// What is wrong, in words.
pub fn parse(bytes: &[u8], prefix: &str) -> std::result::Result<LayerWeights, String> {
    let st = SafeTensors::deserialize(bytes)
        .map_err(|e| format!("not a valid safetensors file: {e}"))?;
    let file = File { st: &st, prefix };
    let p = |name: &str| format!("{prefix}.{name}");
    let layout = if file.has(&p("query.weight")) {
        Layout::Bert
    } else if file.has(&p("q_proj.weight")) {
        Layout::Separate
    } else if file.has(&p("in_proj_weight")) {
        Layout::InProj
    } else {
        return Err(format!(
            "no attention layer under prefix {prefix:?}: expected {0}.query.weight (BERT), \
             {0}.q_proj.weight or {0}.in_proj_weight; {1}",
            prefix,
            file.inventory()
        ));
    };
    let (w_q, w_k, w_v, biases) = match layout {
        Layout::Bert | Layout::Separate => {
            let names = if layout == Layout::Bert {
                ["query", "key", "value"]
            } else {
                ["q_proj", "k_proj", "v_proj"]
            };
            let [q, k, v] = names.map(|n| file.linear(&p(n)));
            let ((w_q, b_q), (w_k, b_k), (w_v, b_v)) = (q?, k?, v?);
            let d = w_q.nrows();
            for (name, w) in [(names[1], &w_k), (names[2], &w_v)] {
                if w.nrows() != d {
                    return Err(format!(
                        "{} takes {} inputs but {} takes {d}; {}",
                        p(&format!("{name}.weight")),
                        w.nrows(),
                        p(&format!("{}.weight", names[0])),
                        file.inventory()
                    ));
                }
            }
            let biases = match (b_q, b_k, b_v) {
                (Some(q), Some(k), Some(v)) => Some((q, k, v)),
                (None, None, None) => None,
                _ => {
                    return Err(format!(
                        "{prefix}: some of Q, K, V have a bias and some do not; {}",
                        file.inventory()
                    ))
                }
            };
            (w_q, w_k, w_v, biases)
        }
        Layout::InProj => {
            let w = file.matrix(&p("in_proj_weight"))?;
            let (rows, e) = w.dim();
            if rows != 3 * e {
                return Err(format!(
                    "{} is {:?}: expected (3·E, E) for Q, K, V stacked",
                    p("in_proj_weight"),
                    [rows, e]
                ));
            }
            let third = |i: usize| w.slice(s![i * e..(i + 1) * e, ..]).t().to_owned();
            let biases = match file.optional_vector(&p("in_proj_bias"))? {
                None => None,
                Some(b) if b.len() == 3 * e => Some((
                    b.slice(s![..e]).to_owned(),
                    b.slice(s![e..2 * e]).to_owned(),
                    b.slice(s![2 * e..]).to_owned(),
                )),
                Some(b) => {
                    return Err(format!(
                        "{} has {} values: expected 3·E = {}",
                        p("in_proj_bias"),
                        b.len(),
                        3 * e
                    ))
                }
            };
            (third(0), third(1), third(2), biases)
        }
    };
    // The output projection: the first of the names this layout uses that the file has.
    let mut candidates = vec![p("out_proj"), p("o_proj"), p("output.dense")];
    if let Some(parent) = prefix.strip_suffix(".self") {
        candidates.push(format!("{parent}.output.dense"));
    }
    let output = match candidates.iter().find(|c| file.has(&format!("{c}.weight"))) {
        None => None,
        Some(name) => {
            let (w_o, b_o) = file.linear(name)?;
            if w_o.nrows() != w_v.ncols() {
                return Err(format!(
                    "{name}.weight takes {} inputs but V has {} columns; {}",
                    w_o.nrows(),
                    w_v.ncols(),
                    file.inventory()
                ));
            }
            Some((w_o, b_o))
        }
    };
    Ok(LayerWeights {
        weights: (w_q, w_k, w_v),
        biases,
        output,
        layout,
    })
}

/// A deserialized file and the prefix being read, for lookups and error messages.
struct File<'a> {
    st: &'a SafeTensors<'a>,
    prefix: &'a str,
}

impl File<'_> {
    fn has(&self, name: &str) -> bool {
        self.st.tensor(name).is_ok()
    }

    /// The tensors under the prefix (or the file's first names), for error messages.
    fn inventory(&self) -> String {
        let mut names: Vec<String> = self
            .st
            .tensors()
            .into_iter()
            .map(|(n, t)| format!("{n} {:?} {:?}", t.dtype(), t.shape()))
            .collect();
        names.sort();
        let under: Vec<&String> = names
            .iter()
            .filter(|n| n.starts_with(&format!("{}.", self.prefix)))
            .collect();
        let (what, list): (&str, Vec<&String>) = if under.is_empty() {
            ("the file has", names.iter().collect())
        } else {
            ("under the prefix the file has", under)
        };
        const SHOWN: usize = 24;
        let more = list.len().saturating_sub(SHOWN);
        let shown: Vec<&str> = list.iter().take(SHOWN).map(|s| s.as_str()).collect();
        let tail = if more > 0 {
            format!(" (and {more} more)")
        } else {
            String::new()
        };
        if shown.is_empty() {
            "the file has no tensors".into()
        } else {
            format!("{what}: {}{tail}", shown.join(", "))
        }
    }

    /// A tensor's values as f32, with its shape.
    fn values(&self, name: &str) -> std::result::Result<(Vec<usize>, Vec<f32>), String> {
        let t = self
            .st
            .tensor(name)
            .map_err(|_| format!("missing tensor {name}; {}", self.inventory()))?;
        let data = t.data();
        let values: Vec<f32> = match t.dtype() {
            StDtype::F32 => data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            StDtype::F64 => data
                .chunks_exact(8)
                .map(|c| {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(c);
                    f64::from_le_bytes(b) as f32
                })
                .collect(),
            StDtype::F16 => data
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            StDtype::BF16 => data
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => {
                return Err(format!(
                    "{name} is {other:?}: expected F32, F16, BF16 or F64"
                ))
            }
        };
        Ok((t.shape().to_vec(), values))
    }

    /// A 2-D tensor as stored.
    fn matrix(&self, name: &str) -> std::result::Result<Array2<f32>, String> {
        let (shape, values) = self.values(name)?;
        match shape[..] {
            [r, c] => Array2::from_shape_vec((r, c), values).map_err(|e| format!("{name}: {e}")),
            _ => Err(format!(
                "{name} is {shape:?}: expected a 2-D (out_features, in_features) weight; {}",
                self.inventory()
            )),
        }
    }

    /// A 1-D tensor, if the file has it.
    fn optional_vector(&self, name: &str) -> std::result::Result<Option<Array1<f32>>, String> {
        if !self.has(name) {
            return Ok(None);
        }
        let (shape, values) = self.values(name)?;
        match shape[..] {
            [_] => Ok(Some(Array1::from(values))),
            _ => Err(format!("{name} is {shape:?}: expected a 1-D bias")),
        }
    }

    /// `name.weight` transposed into `X·W` orientation `(in, out)`, and `name.bias`.
    fn linear(
        &self,
        name: &str,
    ) -> std::result::Result<(Array2<f32>, Option<Array1<f32>>), String> {
        let w = self.matrix(&format!("{name}.weight"))?;
        let b = self.optional_vector(&format!("{name}.bias"))?;
        if let Some(b) = &b {
            if b.len() != w.nrows() {
                return Err(format!(
                    "{name}.bias has {} values but {name}.weight has {} outputs",
                    b.len(),
                    w.nrows()
                ));
            }
        }
        Ok((w.t().to_owned(), b))
    }
}
