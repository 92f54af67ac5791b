//! The modifiers as data, the one schema every front end fills: the browser deserializes
//! its JSON into a [`ModifierSpec`], the CLI builds one from its flags and Python from its
//! keywords; [`ModifierSpec::modifiers`] turns it into [`Modifiers`] and checks it, so the
//! names, the defaults and every rule live here and in [`Modifiers::check`], not in a front
//! end.
//!
//! As JSON (field names as written here; an unknown field is an error):
//!
//! ```
//! use wgpu_attention::modifiers::{ModifierSpec, PresetSpec};
//! let spec: ModifierSpec = serde_json::from_str(r#"{
//!     "presets": [
//!         {"window": [3, 0]},
//!         {"alibi": [0.5, 0.25]},
//!         {"relative_bias": {"table": [0, 1, 2, 3], "buckets": 2, "max_distance": 4}},
//!         {"softcap": 30.0}
//!     ]
//! }"#).unwrap();
//! assert_eq!(spec.presets[0], PresetSpec::Window([3, 0]));
//! let mods = spec.modifiers().unwrap();
//! assert_eq!(mods.presets().len(), 4);
//!
//! // Every rule is the library's: the same message whichever front end passed it.
//! let bad: ModifierSpec = serde_json::from_str(r#"{"presets": [{"softcap": -2}]}"#).unwrap();
//! let e = bad.modifiers().unwrap_err().to_string();
//! assert_eq!(e, "invalid softcap: -2 is not a finite positive number");
//! ```

use serde::{Deserialize, Serialize};

use super::{BufferData, Modifiers, Preset};
use crate::error::{Error, Result};

/// A caller's WGSL and the name its error messages give it (a file name).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct SourceSpec {
    /// Where the source came from, for messages (default: the function's name, as
    /// `score_mod.wgsl`).
    #[serde(default)]
    pub origin: Option<String>,
    /// The WGSL.
    pub wgsl: String,
}

impl SourceSpec {
    /// `wgsl`, named `origin` in messages.
    pub fn new(origin: impl Into<String>, wgsl: impl Into<String>) -> Self {
        SourceSpec {
            origin: Some(origin.into()),
            wgsl: wgsl.into(),
        }
    }
}

/// A named read-only buffer the caller's WGSL indexes: exactly one of `f32`
/// (`array<f32>`) and `i32` (`array<i32>`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct BufferSpec {
    /// Its name in WGSL.
    pub name: String,
    /// Float elements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub f32: Option<Vec<f32>>,
    /// Integer elements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub i32: Option<Vec<i32>>,
}

impl BufferSpec {
    /// A buffer named `name` holding `data`.
    pub fn new(name: impl Into<String>, data: BufferData) -> Self {
        let (f32, i32) = match data {
            BufferData::F32(v) => (Some(v), None),
            BufferData::I32(v) => (None, Some(v)),
        };
        BufferSpec {
            name: name.into(),
            f32,
            i32,
        }
    }

    fn data(&self) -> Result<BufferData> {
        match (&self.f32, &self.i32) {
            (Some(v), None) => Ok(BufferData::F32(v.clone())),
            (None, Some(v)) => Ok(BufferData::I32(v.clone())),
            _ => Err(Error::invalid(
                "modifier",
                format!(
                    "buffer {:?}: give exactly one of \"f32\" and \"i32\"",
                    self.name
                ),
            )),
        }
    }
}

/// A preset as data: `{"window": [left, right]}`, `{"softcap": cap}`, `{"alibi": [slope
/// per query head]}`, `{"documents": [[id per position] per batch index]}`,
/// `{"prefix_lm": p}` or `{"relative_bias": {...}}` ([`RelativeBiasSpec`]). Each is the
/// [`Preset`] of the same name; [`PresetSpec::preset`] makes it.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum PresetSpec {
    /// [`Preset::Window`]: `[left, right]`.
    Window([u32; 2]),
    /// [`Preset::Softcap`].
    Softcap(f32),
    /// [`Preset::Alibi`]: one slope per query head.
    Alibi(Vec<f32>),
    /// [`Preset::Documents`]: one row of ids per batch index, one id per position.
    Documents(Vec<Vec<i32>>),
    /// [`Preset::PrefixLm`].
    PrefixLm(u32),
    /// [`Preset::RelativeBias`].
    RelativeBias(RelativeBiasSpec),
}

/// T5's relative position bias as data ([`Preset::RelativeBias`]).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RelativeBiasSpec {
    /// `(buckets, heads)` row-major.
    pub table: Vec<f32>,
    /// The table's rows.
    pub buckets: u32,
    /// The distance from which the bucket stops changing (default
    /// [`RelativeBiasSpec::DEFAULT_MAX_DISTANCE`], T5's).
    #[serde(default = "RelativeBiasSpec::default_max_distance")]
    pub max_distance: u32,
    /// Keys before and after the query get buckets of their own (T5's encoder; the
    /// default), else keys after it share bucket 0 (its decoder).
    #[serde(default = "RelativeBiasSpec::default_bidirectional")]
    pub bidirectional: bool,
}

impl RelativeBiasSpec {
    /// T5's `relative_attention_max_distance`.
    pub const DEFAULT_MAX_DISTANCE: u32 = 128;

    fn default_max_distance() -> u32 {
        Self::DEFAULT_MAX_DISTANCE
    }

    fn default_bidirectional() -> bool {
        true
    }
}

/// A shape as Python and Rust print a tuple: `(32,)`, `(2, 3)`.
fn tuple(shape: &[usize]) -> String {
    match shape {
        [one] => format!("({one},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// `Err` naming `what` unless `shape` has `axes` axes (`names` says which).
fn axes(what: &str, shape: &[usize], axes: usize, names: &str) -> Result<()> {
    if shape.len() == axes {
        return Ok(());
    }
    Err(Error::invalid(
        "modifier",
        format!(
            "{what} must be {axes}-D {names}, got shape {}",
            tuple(shape)
        ),
    ))
}

fn count(what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::invalid("modifier", format!("{what}: {n} is past u32")))
}

impl PresetSpec {
    /// ALiBi from an array of `shape` (it must be 1-D, one slope per query head); `what`
    /// names the argument in messages.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another shape.
    pub fn alibi_array(what: &str, shape: &[usize], slopes: Vec<f32>) -> Result<Self> {
        axes(what, shape, 1, "(one slope per query head)")?;
        Ok(PresetSpec::Alibi(slopes))
    }

    /// Document masking from a row-major `(batch, n)` array of `shape`; `what` names the
    /// argument in messages.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another shape.
    pub fn documents_array(what: &str, shape: &[usize], ids: &[i32]) -> Result<Self> {
        axes(what, shape, 2, "(batch, n)")?;
        count(what, shape[1])?;
        let rows = match shape[1] {
            0 => vec![Vec::new(); shape[0]],
            n => ids.chunks(n).map(<[i32]>::to_vec).collect(),
        };
        Ok(PresetSpec::Documents(rows))
    }

    /// T5's relative bias from a row-major `(buckets, heads)` table of `shape`, T5's
    /// defaults where `max_distance` or `bidirectional` is `None`; `what` names the argument
    /// in messages.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another shape.
    pub fn relative_bias_array(
        what: &str,
        shape: &[usize],
        table: Vec<f32>,
        max_distance: Option<u32>,
        bidirectional: Option<bool>,
    ) -> Result<Self> {
        axes(what, shape, 2, "(buckets, heads)")?;
        Ok(PresetSpec::RelativeBias(RelativeBiasSpec {
            table,
            buckets: count(what, shape[0])?,
            max_distance: max_distance.unwrap_or(RelativeBiasSpec::DEFAULT_MAX_DISTANCE),
            bidirectional: bidirectional.unwrap_or_else(RelativeBiasSpec::default_bidirectional),
        }))
    }

    /// The [`Preset`] it names, unchecked ([`Preset::check`] checks it).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for document rows of different lengths.
    pub fn preset(&self) -> Result<Preset> {
        Ok(match self {
            PresetSpec::Window([left, right]) => Preset::Window {
                left: *left,
                right: *right,
            },
            PresetSpec::Softcap(c) => Preset::Softcap(*c),
            PresetSpec::Alibi(slopes) => Preset::Alibi(slopes.clone()),
            PresetSpec::Documents(rows) => {
                let n = rows.first().map_or(0, Vec::len);
                if rows.iter().any(|r| r.len() != n) {
                    return Err(Error::invalid(
                        "documents",
                        "every batch index's row of ids must have the same length",
                    ));
                }
                Preset::Documents {
                    ids: rows.concat(),
                    n: count("documents", n)?,
                }
            }
            PresetSpec::PrefixLm(p) => Preset::PrefixLm(*p),
            PresetSpec::RelativeBias(r) => Preset::RelativeBias {
                table: r.table.clone(),
                buckets: r.buckets,
                max_distance: r.max_distance,
                bidirectional: r.bidirectional,
            },
        })
    }
}

/// The modifiers of one call as data: a caller's WGSL, the buffers it reads, and presets
/// (applied after the caller's own modifiers, in the order listed). Empty by default.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ModifierSpec {
    /// `fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score_mod: Option<SourceSpec>,
    /// Its derivative by the score, for the backward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score_mod_grad: Option<SourceSpec>,
    /// `fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool` (true = attend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_mod: Option<SourceSpec>,
    /// Named read-only buffers the caller's WGSL indexes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub buffers: Vec<BufferSpec>,
    /// Presets, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub presets: Vec<PresetSpec>,
}

impl ModifierSpec {
    /// No modifier.
    pub fn new() -> Self {
        Self::default()
    }

    /// The [`Modifiers`] it names, checked by [`Modifiers::check`] (every rule a front end
    /// relies on).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] as [`Modifiers::check`], or for a buffer without exactly
    /// one kind of elements or document rows of different lengths.
    pub fn modifiers(&self) -> Result<Modifiers> {
        let mut m = Modifiers::new();
        let origin = |s: &SourceSpec, default: &str| {
            s.origin
                .clone()
                .unwrap_or_else(|| format!("{default}.wgsl"))
        };
        if let Some(s) = &self.score_mod {
            m = m.score_mod(origin(s, "score_mod"), s.wgsl.clone());
        }
        if let Some(s) = &self.score_mod_grad {
            m = m.score_mod_grad(origin(s, "score_mod_grad"), s.wgsl.clone());
        }
        if let Some(s) = &self.mask_mod {
            m = m.mask_mod(origin(s, "mask_mod"), s.wgsl.clone());
        }
        for b in &self.buffers {
            m = m.buffer(b.name.clone(), b.data()?);
        }
        for p in &self.presets {
            m = m.preset(p.preset()?);
        }
        m.check()?;
        Ok(m)
    }
}
