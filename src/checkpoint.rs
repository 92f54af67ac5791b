//! One attention layer's projections from a `.safetensors` checkpoint, as PyTorch stores
//! them: `nn.Linear(d_in, d_out).weight` is `(d_out, d_in)`, so each weight is transposed
//! into the `X·W` orientation [`Projections`] takes.
//!
//! The prefix `P` names a module, and what is loaded is what that module computes. Layouts:
//!
//! | `P` is | Q, K, V | output projection |
//! |---|---|---|
//! | BERT's `BertSelfAttention` (`….attention.self`) | `P.query`, `P.key`, `P.value` | none: its output is the context |
//! | BERT's `BertAttention` (`….attention`) | `P.self.query`, `P.self.key`, `P.self.value` | `P.output.dense` (only the dense: `BertSelfOutput`'s dropout, residual and LayerNorm are not applied) |
//! | separate projections (BART, Llama, Whisper, …) | `P.q_proj`, `P.k_proj`, `P.v_proj` | `P.out_proj` or `P.o_proj` |
//! | `nn.MultiheadAttention` | `P.in_proj_weight` `(3E, E)` and `P.in_proj_bias` `(3E,)`, split in thirds | `P.out_proj` |
//!
//! In every layout the output projection is `P.out_proj`, `P.o_proj` or `P.output.dense`,
//! whichever the file has directly under `P`; a projection belonging to a parent module is
//! never applied. Each bias is optional on its own (Llama has none; Whisper has no key
//! bias). Tensors may be F32, F16, BF16 or F64; they are converted to f32. The file is
//! memory-mapped: only its header and the layer's tensors are read.
//!
//! The number of heads is not stored in the weights: give it with [`crate::Attention::heads`]
//! (`--heads`), or read it from the `config.json` beside the checkpoint with
//! [`heads_from_config`]. Grouped-query checkpoints (K and V narrower than Q) run through
//! [`crate::Attention::run`] (with `Inputs::x(&x).projections(&p)`) and [`crate::Layer`] as
//! they are, each K/V head shared by its group of query heads
//! ([`LayerWeights::check_kv_heads`] checks the count against the config);
//! [`LayerWeights::repeat_kv_heads`] makes the equivalent multi-head layer.

use std::path::Path;

use ndarray::{s, Array1, Array2, Axis};
use safetensors::{Dtype as StDtype, SafeTensors};

use crate::attention::{OwnedOutput, OwnedWeights, Projections};
use crate::error::{Error, Result};

/// Which naming the layer was found under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `P.query` / `P.key` / `P.value`, or `P.self.query` / … (Hugging Face BERT).
    Bert,
    /// `P.q_proj` / `P.k_proj` / `P.v_proj`.
    Separate,
    /// `P.in_proj_weight` / `P.in_proj_bias` (`nn.MultiheadAttention`).
    InProj,
}

/// The Q, K and V biases, each present or not on its own.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Biases {
    /// `b_Q`, `(d_k,)`.
    pub q: Option<Array1<f32>>,
    /// `b_K`, `(d_k,)`.
    pub k: Option<Array1<f32>>,
    /// `b_V`, `(d_v,)`.
    pub v: Option<Array1<f32>>,
}

/// One layer's weights in the `X·W` orientation, owned.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LayerWeights {
    /// `W_Q (d, d_k)`, `W_K (d, d_k)`, `W_V (d, d_v)` (for a grouped-query layer, K and V
    /// are narrower: grouped-query attention).
    pub weights: OwnedWeights,
    /// `b_Q, b_K, b_V`, those the checkpoint has.
    pub biases: Biases,
    /// `W_O (d_v, d_out)` and `b_O`, when the module the prefix names has an output
    /// projection.
    pub output: Option<OwnedOutput>,
    /// Where they were found.
    pub layout: Layout,
}

impl LayerWeights {
    /// The projections, borrowing these arrays.
    pub fn projections(&self) -> Projections<'_> {
        let (w_q, w_k, w_v) = &self.weights;
        let mut p = Projections::new(w_q.view(), w_k.view(), w_v.view());
        p.b_q = self.biases.q.as_ref().map(|b| b.view());
        p.b_k = self.biases.k.as_ref().map(|b| b.view());
        p.b_v = self.biases.v.as_ref().map(|b| b.view());
        match &self.output {
            Some((w, b)) => p.with_output(w.view(), b.as_ref().map(|b| b.view())),
            None => p,
        }
    }

    /// The number of K/V heads these weights hold for `heads` query heads: `heads` for
    /// ordinary multi-head attention, fewer for grouped-query attention (K and V narrower
    /// than Q, with the same per-head width).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `heads` is 0 or does not divide Q's width, or K's
    /// width is not a whole number of Q's heads that divides `heads`, or V's width does not
    /// divide by that number.
    pub fn kv_heads(&self, heads: usize) -> Result<usize> {
        let (w_q, w_k, w_v) = &self.weights;
        let d_k = w_q.ncols();
        if heads == 0 || d_k % heads != 0 {
            return Err(Error::invalid(
                "heads",
                format!("Q's width d_k = {d_k} does not divide by heads = {heads}"),
            ));
        }
        let head = d_k / heads;
        let kv = w_k.ncols() / head;
        if kv == 0 || w_k.ncols() % head != 0 || !heads.is_multiple_of(kv) || w_v.ncols() % kv != 0
        {
            return Err(Error::invalid(
                "heads",
                format!(
                    "with {heads} heads of width {head}, K's width {} and V's width {} are \
                     not K/V heads that the {heads} query heads can share",
                    w_k.ncols(),
                    w_v.ncols()
                ),
            ));
        }
        Ok(kv)
    }

    /// The equivalent multi-head layer for `heads` query heads ([`crate::Attention::run`]
    /// runs the grouped one as it is; this is for tools that want every head's K and V): a
    /// grouped-query layer (fewer K/V heads than query heads, see
    /// [`LayerWeights::kv_heads`]) has each K/V head's columns of `W_K`, `W_V`, `b_K`, `b_V`
    /// repeated for the `heads / kv_heads` query heads that share it (query head `h` uses
    /// K/V head `h / (heads / kv_heads)`, as PyTorch's `enable_gqa` and `repeat_interleave`).
    /// The result is exact; it costs the K/V projection work of full multi-head attention.
    /// A layer with as many K/V heads as query heads comes back unchanged. `kv_heads`, when
    /// given (`config.json`'s `num_key_value_heads`), must be what the widths say.
    ///
    /// # Errors
    /// As [`LayerWeights::kv_heads`], and [`Error::InvalidArgument`] when `kv_heads` is given
    /// and differs from the widths' count.
    pub fn repeat_kv_heads(mut self, heads: usize, kv_heads: Option<usize>) -> Result<Self> {
        let kv = self.check_kv_heads(heads, kv_heads)?;
        if kv == heads {
            return Ok(self);
        }
        let repeat = heads / kv;
        // Column `j` of the repeated array is column `(j / (repeat·w)) · w + j % w` of the
        // original, with `w` the per-head width.
        let index = |width: usize| -> Vec<usize> {
            let w = width / kv;
            (0..width * repeat)
                .map(|j| (j / (repeat * w)) * w + j % w)
                .collect()
        };
        let (k_cols, v_cols) = (index(self.weights.1.ncols()), index(self.weights.2.ncols()));
        self.weights.1 = self.weights.1.select(Axis(1), &k_cols);
        self.weights.2 = self.weights.2.select(Axis(1), &v_cols);
        self.biases.k = self.biases.k.map(|b| b.select(Axis(0), &k_cols));
        self.biases.v = self.biases.v.map(|b| b.select(Axis(0), &v_cols));
        Ok(self)
    }

    /// The K/V heads these weights hold for `heads` query heads ([`LayerWeights::kv_heads`]),
    /// checked against `kv_heads` when it is given (`config.json`'s `num_key_value_heads`).
    /// [`crate::Attention::run`] runs a grouped-query layer as it is, K/V heads shared.
    ///
    /// # Errors
    /// As [`LayerWeights::kv_heads`], and [`Error::InvalidArgument`] when `kv_heads` is given
    /// and differs from the widths' count.
    pub fn check_kv_heads(&self, heads: usize, kv_heads: Option<usize>) -> Result<usize> {
        let kv = self.kv_heads(heads)?;
        if let Some(want) = kv_heads {
            if want != kv {
                return Err(Error::invalid(
                    "kv heads",
                    format!(
                        "{want} K/V heads were asked for, but with {heads} query heads the \
                         weights hold {kv} (K is {} wide, Q {})",
                        self.weights.1.ncols(),
                        self.weights.0.ncols()
                    ),
                ));
            }
        }
        Ok(kv)
    }
}

/// Head counts from a model's `config.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeadCounts {
    /// `num_attention_heads`: the query heads.
    pub heads: usize,
    /// `num_key_value_heads`, when the config has it (grouped-query models).
    pub kv_heads: Option<usize>,
}

/// The head counts in the `config.json` beside `checkpoint` (in the same directory, as
/// Hugging Face stores a model), or `None` when there is no such file.
///
/// # Errors
/// [`Error::Io`] naming the `config.json` when it cannot be read, is not JSON, or has no
/// positive integer `num_attention_heads` (or a `num_key_value_heads` that is not one).
pub fn heads_from_config(checkpoint: &Path) -> Result<Option<HeadCounts>> {
    let dir = match checkpoint.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let path = dir.join("config.json");
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::io(&path, format!("cannot read: {e}")))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::io(&path, format!("not valid JSON: {e}")))?;
    let count = |key: &str| -> Result<Option<usize>> {
        match json.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|&n| n > 0)
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    Error::io(&path, format!("{key} is {v}: expected a positive integer"))
                }),
        }
    };
    let heads = count("num_attention_heads")?.ok_or_else(|| {
        Error::io(
            &path,
            "has no num_attention_heads: give the number of heads (--heads)",
        )
    })?;
    Ok(Some(HeadCounts {
        heads,
        kv_heads: count("num_key_value_heads")?,
    }))
}

/// Loads the attention layer that `prefix` names from a `.safetensors` file: its Q, K, V
/// projections and, when that module owns one, its output projection (see the
/// [module docs](self) for the layouts).
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
/// The message [`load`] would put in its [`Error::Io`] (without the path): the bytes are not
/// a safetensors file, no layout's tensors are under the prefix, or one is missing,
/// mis-shaped or of an unsupported dtype.
pub fn parse(bytes: &[u8], prefix: &str) -> std::result::Result<LayerWeights, String> {
    let st = SafeTensors::deserialize(bytes)
        .map_err(|e| format!("not a valid safetensors file: {e}"))?;
    let file = File { st: &st, prefix };
    let p = |name: &str| format!("{prefix}.{name}");
    // Where Q, K and V are: under the prefix, or (BERT's `BertAttention`) under `P.self`.
    let (layout, qkv) = if file.has(&p("query.weight")) {
        (Layout::Bert, prefix.to_string())
    } else if file.has(&p("self.query.weight")) {
        (Layout::Bert, p("self"))
    } else if file.has(&p("q_proj.weight")) {
        (Layout::Separate, prefix.to_string())
    } else if file.has(&p("in_proj_weight")) {
        (Layout::InProj, prefix.to_string())
    } else {
        return Err(format!(
            "no attention layer under prefix {prefix:?}: expected {0}.query.weight (BERT), \
             {0}.self.query.weight, {0}.q_proj.weight or {0}.in_proj_weight; {1}",
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
            let full = |n: &str| format!("{qkv}.{n}");
            let [q, k, v] = names.map(|n| file.linear(&full(n)));
            let ((w_q, b_q), (w_k, b_k), (w_v, b_v)) = (q?, k?, v?);
            let d = w_q.nrows();
            for (name, w) in [(names[1], &w_k), (names[2], &w_v)] {
                if w.nrows() != d {
                    return Err(format!(
                        "{} takes {} inputs but {} takes {d}; {}",
                        full(&format!("{name}.weight")),
                        w.nrows(),
                        full(&format!("{}.weight", names[0])),
                        file.inventory()
                    ));
                }
            }
            // Grouped-query layers have K (and V) narrower than Q, by a whole factor.
            if w_k.ncols() == 0 || w_q.ncols() % w_k.ncols() != 0 {
                return Err(format!(
                    "{} has {} outputs and {} has {}: the query width must be the key width \
                     times a whole number (of query heads per K/V head); {}",
                    full(&format!("{}.weight", names[0])),
                    w_q.ncols(),
                    full(&format!("{}.weight", names[1])),
                    w_k.ncols(),
                    file.inventory()
                ));
            }
            let biases = Biases {
                q: b_q,
                k: b_k,
                v: b_v,
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
                None => Biases::default(),
                Some(b) if b.len() == 3 * e => Biases {
                    q: Some(b.slice(s![..e]).to_owned()),
                    k: Some(b.slice(s![e..2 * e]).to_owned()),
                    v: Some(b.slice(s![2 * e..]).to_owned()),
                },
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
    // The output projection: one the module named by the prefix owns, directly under it.
    let candidates = [p("out_proj"), p("o_proj"), p("output.dense")];
    let output = match candidates.iter().find(|c| file.has(&format!("{c}.weight"))) {
        None => None,
        Some(name) => {
            let (w_o, b_o) = file.linear(name)?;
            // The context has V's width times the query heads per K/V head.
            let d_context = w_v.ncols() * (w_q.ncols() / w_k.ncols());
            if w_o.nrows() != d_context {
                return Err(format!(
                    "{name}.weight takes {} inputs but the context has {d_context} columns; {}",
                    w_o.nrows(),
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
