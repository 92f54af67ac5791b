//! The presets (sliding window, soft-capping, ALiBi, document masking, prefix-LM): each
//! generated as WGSL under its own `wa_` function name, and the same modifier in f64 for the
//! reference.

use super::Role;
use crate::error::{Error, Result};

/// A preset, generated as WGSL under its own `wa_` function name.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Preset {
    /// Query `i` sees key `j` when `i − left ≤ j ≤ i + right` (top-left aligned).
    Window {
        /// Keys before the query it sees.
        left: u32,
        /// Keys after the query it sees.
        right: u32,
    },
    /// `score ← cap · tanh(score / cap)` on the scaled score (Gemma 2).
    Softcap(f32),
    /// `score ← score + slope_h · (j − i)`, one slope per query head (BLOOM, MPT).
    Alibi(Vec<f32>),
    /// A query sees only keys of its own document: one id per position, `(batch, n)` row-major.
    Documents {
        /// The ids, `batch · n` of them.
        ids: Vec<i32>,
        /// Positions per sequence.
        n: u32,
    },
    /// The first `p` positions attend bidirectionally among themselves, the rest causally.
    PrefixLm(u32),
    /// T5's relative position bias: `score ← score + table[bucket(j − i), h]`, a learned
    /// `(buckets, heads)` table (row-major, as Hugging Face's `relative_attention_bias.weight`)
    /// indexed by the distance bucketed as T5 buckets it ([`Preset::t5_bucket`]).
    RelativeBias {
        /// `buckets · heads` values, `(buckets, heads)` row-major.
        table: Vec<f32>,
        /// Buckets (T5: 32).
        buckets: u32,
        /// Distances from which the bucket no longer changes (T5: 128).
        max_distance: u32,
        /// Keys before and after the query get buckets of their own (T5's encoder); else
        /// keys after it share bucket 0 (its decoder).
        bidirectional: bool,
    },
}

impl Preset {
    /// ALiBi's standard geometric slopes for `heads` heads (Press et al.; for a head count
    /// that is not a power of two, the next power's odd-indexed slopes fill the rest).
    pub fn alibi_slopes(heads: usize) -> Vec<f32> {
        fn powers(n: usize) -> Vec<f64> {
            let start = 2f64.powf(-8.0 / n as f64);
            (1..=n).map(|i| start.powi(i as i32)).collect()
        }
        let p = heads.next_power_of_two();
        if p == heads {
            return powers(heads).into_iter().map(|s| s as f32).collect();
        }
        let lower = p / 2;
        let mut out = powers(lower);
        out.extend(powers(2 * lower).into_iter().step_by(2).take(heads - lower));
        out.into_iter().map(|s| s as f32).collect()
    }

    /// T5's bucket of the relative position `d = j − i` (Hugging Face's
    /// `_relative_position_bucket`, its logarithm in f32 as PyTorch computes it): exact
    /// buckets for small distances, logarithmic ones up to `max_distance`, the last bucket
    /// beyond; with `bidirectional`, half the buckets for keys after the query.
    pub fn t5_bucket(d: i64, buckets: u32, max_distance: u32, bidirectional: bool) -> u32 {
        let (mut nb, mut bucket) = (i64::from(buckets), 0);
        let distance = if bidirectional {
            nb /= 2;
            if d > 0 {
                bucket += nb;
            }
            d.abs()
        } else {
            (-d).max(0)
        };
        let exact = nb / 2;
        if distance < exact {
            return (bucket + distance) as u32;
        }
        let log_ratio = (distance as f32 / exact as f32).ln()
            / ((f64::from(max_distance) / exact as f64).ln() as f32)
            * (nb - exact) as f32;
        (bucket + (exact + log_ratio as i64).min(nb - 1)) as u32
    }

    /// [`Preset::t5_bucket`] of every distance from `−max_distance` to `max_distance` (the
    /// bucket is the same beyond): what the kernels index by the clamped distance.
    fn t5_buckets(buckets: u32, max_distance: u32, bidirectional: bool) -> Vec<i32> {
        let md = i64::from(max_distance);
        (-md..=md)
            .map(|d| Self::t5_bucket(d, buckets, max_distance, bidirectional) as i32)
            .collect()
    }

    /// Checks what the preset alone must be, whatever the problem: a soft-cap finite and
    /// positive; ALiBi slopes present and finite; a relative bias table finite, of at least
    /// 2 buckets and 1 head, its `max_distance` past the exact buckets' reach; documents in rows of at
    /// least one position. (What depends on the problem, the heads and the positions, is
    /// [`super::Modifiers::check_problem`]'s.) Every front end (the CLI, Python, the browser)
    /// relies on it, through [`super::Modifiers::check`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the preset and the rule.
    pub fn check(&self) -> Result<()> {
        let finite = |v: &[f32]| v.iter().all(|x| x.is_finite());
        match self {
            Preset::Softcap(cap) if !(cap.is_finite() && *cap > 0.0) => Err(Error::invalid(
                "softcap",
                format!("{cap} is not a finite positive number"),
            )),
            Preset::Alibi(slopes) if slopes.is_empty() || !finite(slopes) => Err(Error::invalid(
                "ALiBi",
                "the slopes must be finite, one per query head",
            )),
            Preset::RelativeBias { table, .. } if !finite(table) => Err(Error::invalid(
                "relative bias",
                "the table must hold finite values",
            )),
            Preset::RelativeBias { table, buckets, .. } if *buckets < 2 || table.is_empty() => {
                Err(Error::invalid(
                    "relative bias",
                    format!(
                        "a table needs at least 2 buckets and 1 head, got (buckets, heads) = \
                         ({buckets}, {})",
                        table.len() / (*buckets).max(1) as usize
                    ),
                ))
            }
            Preset::RelativeBias { table, buckets, .. } if table.len() % *buckets as usize != 0 => {
                Err(Error::invalid(
                    "relative bias",
                    format!(
                        "a table of {} values is not {buckets} rows (buckets) of one value per \
                         head",
                        table.len()
                    ),
                ))
            }
            Preset::RelativeBias {
                buckets,
                max_distance,
                bidirectional,
                ..
            } => {
                let per = if *bidirectional { 4 } else { 2 };
                match *max_distance > buckets / per {
                    true => Ok(()),
                    false => Err(Error::invalid(
                        "relative bias",
                        format!(
                            "max_distance {max_distance} must exceed the exact buckets' reach \
                             ({}: buckets / {per})",
                            buckets / per
                        ),
                    )),
                }
            }
            Preset::Documents { n: 0, .. } => Err(Error::invalid(
                "documents",
                "rows of 0 positions: one id per position is needed",
            )),
            _ => Ok(()),
        }
    }

    pub(super) fn role(&self) -> Role {
        match self {
            Preset::Softcap(_) | Preset::Alibi(_) | Preset::RelativeBias { .. } => Role::Score,
            _ => Role::Mask,
        }
    }

    /// Whether it masks (a window, documents, prefix-LM) rather than changes scores.
    pub fn masks(&self) -> bool {
        self.role() == Role::Mask
    }

    /// Its function (named `name`), and the data it reads from the presets' one packed
    /// buffer `wa_presets` (`array<i32>`; f32 values as their bits), where the data starts
    /// at `at`. One buffer for all presets keeps a kernel within the storage bindings a
    /// device allows (WebGPU's default is 8 per stage).
    pub(super) fn wgsl(&self, name: &str, at: u32) -> (String, Vec<i32>) {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits() as i32).collect::<Vec<_>>();
        match self {
            Preset::Window { left, right } => (
                format!(
                    "fn {name}(b: u32, h: u32, q: u32, kv: u32) -> bool {{\n    \
                     let d = i32(kv) - i32(q);\n    return d >= -{left}i && d <= {right}i;\n}}\n"
                ),
                Vec::new(),
            ),
            Preset::Softcap(cap) => (
                format!(
                    "fn {name}(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {{\n    \
                     return {cap:?} * tanh(score / {cap:?});\n}}\n"
                ),
                Vec::new(),
            ),
            Preset::Alibi(slopes) => (
                format!(
                    "fn {name}(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {{\n    \
                     return score + bitcast<f32>(wa_presets[{at}u + h]) * (f32(kv) - f32(q));\n}}\n"
                ),
                bits(slopes),
            ),
            Preset::Documents { ids, n } => (
                format!(
                    "fn {name}(b: u32, h: u32, q: u32, kv: u32) -> bool {{\n    \
                     let row = {at}u + b * {n}u;\n    \
                     return wa_presets[row + q] == wa_presets[row + kv];\n}}\n"
                ),
                ids.clone(),
            ),
            Preset::PrefixLm(p) => (
                format!(
                    "fn {name}(b: u32, h: u32, q: u32, kv: u32) -> bool {{\n    \
                     return kv < {p}u || kv <= q;\n}}\n"
                ),
                Vec::new(),
            ),
            // The bucket of each clamped distance, then the table.
            Preset::RelativeBias {
                table,
                buckets,
                max_distance,
                bidirectional,
            } => {
                let mut data = Self::t5_buckets(*buckets, *max_distance, *bidirectional);
                let (md, off) = (*max_distance, at + data.len() as u32);
                let heads = table.len() / (*buckets).max(1) as usize;
                data.extend(bits(table));
                (
                    format!(
                        "fn {name}(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {{\n    \
                         let d = clamp(i32(kv) - i32(q), -{md}i, {md}i) + {md}i;\n    \
                         let bucket = u32(wa_presets[{at}u + u32(d)]);\n    \
                         return score + bitcast<f32>(wa_presets[{off}u + bucket * {heads}u + h]);\n}}\n"
                    ),
                    data,
                )
            }
        }
    }

    /// A score preset's derivative by its input score (named `name`, beside its function
    /// of [`Preset::wgsl`]); `None` for a mask preset.
    pub(super) fn wgsl_grad(&self, name: &str) -> Option<String> {
        match self {
            Preset::Softcap(cap) => Some(format!(
                "fn {name}_grad(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {{\n    \
                 let t = tanh(score / {cap:?});\n    return 1.0 - t * t;\n}}\n"
            )),
            // Additive biases: the score passes through unscaled.
            Preset::Alibi(_) | Preset::RelativeBias { .. } => Some(format!(
                "fn {name}_grad(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {{\n    \
                 return 1.0;\n}}\n"
            )),
            _ => None,
        }
    }

    /// A score preset's derivative by the score `s` at `(b, h, q, kv)` in f64, for the
    /// reference backward: `1 − tanh²(s / cap)` for soft-capping; 1 for ALiBi, T5's bias
    /// and a mask preset (none scales the score).
    pub fn grad(&self, s: f64, _b: usize, _h: usize, _q: usize, _kv: usize) -> f64 {
        match self {
            Preset::Softcap(cap) => {
                let t = (s / *cap as f64).tanh();
                1.0 - t * t
            }
            _ => 1.0,
        }
    }

    /// The same modifier in f64 on the CPU, for the reference: `Some(score)` or `None`
    /// (masked out) from the scaled score `s` at `(b, h, q, kv)`.
    pub fn apply(&self, s: f64, b: usize, h: usize, q: usize, kv: usize) -> Option<f64> {
        match self {
            Preset::Window { left, right } => {
                let d = kv as i64 - q as i64;
                (d >= -(*left as i64) && d <= *right as i64).then_some(s)
            }
            Preset::Softcap(cap) => {
                let c = *cap as f64;
                Some(c * (s / c).tanh())
            }
            Preset::Alibi(slopes) => Some(s + slopes[h] as f64 * (kv as f64 - q as f64)),
            Preset::Documents { ids, n } => {
                let n = *n as usize;
                (ids[b * n + q] == ids[b * n + kv]).then_some(s)
            }
            Preset::PrefixLm(p) => (kv < *p as usize || kv <= q).then_some(s),
            Preset::RelativeBias {
                table,
                buckets,
                max_distance,
                bidirectional,
            } => {
                let heads = table.len() / (*buckets).max(1) as usize;
                let d = kv as i64 - q as i64;
                let bucket = Self::t5_bucket(d, *buckets, *max_distance, *bidirectional);
                Some(s + f64::from(table[bucket as usize * heads + h]))
            }
        }
    }
}
