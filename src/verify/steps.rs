//! `verify --gradients` and `verify --decode`: the fused backward (`Saved::backward`) and
//! token-by-token decoding through the KV cache, a few small cases each (grouped-query
//! heads, causal with a window, presets, f16), against the f64 reference
//! ([`crate::reference::backward`]; for decode, the causal forward over the same tokens):
//! the kernels a plain `verify` never runs, for the WGSL sanitizer above all.

use std::fmt;

use ndarray::{s, Array4, ArrayD, Axis};

use crate::attention::{Attention, Dtype, Inputs, Options};
use crate::context::Context;
use crate::decode::{Decoder, KvCache, KvCacheSpec};
use crate::error::{Error, Result};
use crate::mask::Mask;
use crate::modifiers::{Modifiers, Preset};
use crate::reference;
use crate::variant::Kernels;

/// The bound of an f32 case: sums over a few dozen terms, far below it.
const TOL32: f64 = 1e-4;
/// The bound where f16 enters (operands or a cache stored as f16, a GPU's f16 products in
/// the fused forward): a few units of f16's roundoff, 2⁻¹¹.
const TOL16: f64 = 4e-3;

/// What a [`StepCase`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The saved forward and its backward on this kernel family.
    Gradients(Kernels),
    /// A prefill and one-token steps through the KV cache, in key blocks of this many keys
    /// (`None`: the decoder's choice).
    Decode(Option<usize>),
}

/// One case of `verify --gradients` or `--decode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepCase {
    /// What it runs.
    pub step: Step,
    /// Batch, query heads, K/V heads, queries, keys, head width.
    pub shape: (usize, usize, usize, usize, usize, usize),
    /// Causal with a window 5 keys back (else none of either).
    pub causal_window: bool,
    /// ALiBi and soft-capping at 2 (the backward also T5's bias, and its table's gradient).
    pub presets: bool,
    /// Operands (decode: the cache) stored as f16.
    pub dtype: Dtype,
}

/// The gradient cases on each family `ctx` has, then the decode cases.
pub fn step_cases(ctx: &Context, gradients: bool, decode: bool) -> Vec<StepCase> {
    let f16 = ctx.require_f16().is_ok();
    let mut out = Vec::new();
    let case = |step, shape, causal_window, presets, dtype| StepCase {
        step,
        shape,
        causal_window,
        presets,
        dtype,
    };
    if gradients {
        for k in Kernels::available(ctx) {
            let g = Step::Gradients(k);
            out.push(case(g, (2, 4, 2, 23, 23, 16), true, false, Dtype::F32));
            out.push(case(g, (1, 4, 2, 19, 27, 12), false, true, Dtype::F32));
            if f16 {
                out.push(case(g, (2, 4, 2, 23, 23, 16), true, true, Dtype::F16));
            }
        }
    }
    if decode {
        for block in [None, Some(4)] {
            let d = Step::Decode(block);
            out.push(case(d, (2, 4, 2, 15, 15, 12), false, false, Dtype::F32));
            out.push(case(d, (1, 4, 2, 15, 15, 8), true, true, Dtype::F32));
            if f16 {
                out.push(case(d, (2, 4, 2, 15, 15, 12), true, false, Dtype::F16));
            }
        }
    }
    out
}

impl fmt::Display for StepCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (b, h, h_kv, l, s, e) = self.shape;
        match self.step {
            Step::Gradients(k) => {
                write!(f, "{b}x{l}x{s}   d={e} H={h} Hkv={h_kv} gradients [{k:?}]")?
            }
            Step::Decode(None) => write!(f, "{b}x{l}      d={e} H={h} Hkv={h_kv} decode")?,
            Step::Decode(Some(n)) => {
                write!(f, "{b}x{l}      d={e} H={h} Hkv={h_kv} decode blocks={n}")?
            }
        }
        if self.causal_window {
            f.write_str(" causal window=5,0")?;
        }
        if self.presets {
            f.write_str(" alibi+softcap")?;
            if matches!(self.step, Step::Gradients(_)) {
                f.write_str("+t5")?;
            }
        }
        if self.dtype == Dtype::F16 {
            f.write_str(" f16")?;
        }
        Ok(())
    }
}

/// How a [`StepCase`] came out: the largest relative error of what it computed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StepResult {
    /// The case.
    pub case: StepCase,
    /// The largest `‖got − want‖ / ‖want‖` over the output and each gradient.
    pub rel: f64,
    /// Which output that was.
    pub worst: &'static str,
    /// The bound it must meet.
    pub tolerance: f64,
}

impl StepResult {
    /// Whether the error is within the bound.
    pub fn passed(&self) -> bool {
        self.rel <= self.tolerance
    }
}

/// The table header of the gradient and decode cases.
pub const STEP_HEADER: &str =
    "case                                                       worst of     rel        -           -          bound      result";

impl fmt::Display for StepResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<58} {:>10}  {:>9.2e}  {:>10}  {:>9}  {:>9.2e}  {}",
            self.case.to_string(),
            self.worst,
            self.rel,
            "-",
            "-",
            self.tolerance,
            if self.passed() { "pass" } else { "FAIL" }
        )
    }
}

/// Deterministic values in `[-amp, amp]` of `shape`, varied by `salt`.
fn values(shape: (usize, usize, usize, usize), salt: u64, amp: f32) -> Array4<f32> {
    let salt = salt as usize % 1009 + 2;
    Array4::from_shape_fn(shape, |(i, j, k, m)| {
        (((i * 31 + j * 17 + k * 7 + m * 3) * salt + salt) as f32 * 0.0137).sin() * amp
    })
}

/// `a` rounded to f16 and back.
fn rounded(a: &Array4<f32>) -> Array4<f32> {
    a.mapv(|x| half::f16::from_f32(x).to_f32())
}

impl StepCase {
    /// The modifiers of the case (`None`: none).
    fn modifiers(&self, decode: bool) -> Option<Modifiers> {
        let (_, h, ..) = self.shape;
        let mut mods = Modifiers::new();
        if self.presets {
            mods = mods.preset(Preset::Alibi(Preset::alibi_slopes(h)));
            if !decode {
                mods = mods.preset(Preset::RelativeBias {
                    table: (0..16 * h).map(|i| (i as f32 * 0.37).sin()).collect(),
                    buckets: 16,
                    max_distance: 20,
                    bidirectional: true,
                });
            }
            mods = mods.preset(Preset::Softcap(2.0));
        }
        if self.causal_window {
            mods = mods.preset(Preset::Window { left: 5, right: 0 });
        }
        (self.presets || self.causal_window).then_some(mods)
    }

    /// Runs the case on `ctx` with data from `seed` and compares it with the reference.
    ///
    /// # Errors
    /// Whatever the GPU or the reference returns.
    pub fn run(&self, ctx: &Context, seed: u64) -> Result<StepResult> {
        let (b, h, h_kv, l, s, e) = self.shape;
        let f16 = self.dtype == Dtype::F16;
        let round = |a: Array4<f32>| if f16 { rounded(&a) } else { a };
        let q = round(values((b, h, l, e), seed * 4 + 1, 1.5));
        let k = round(values((b, h_kv, s, e), seed * 4 + 2, 1.5));
        let v = round(values((b, h_kv, s, e), seed * 4 + 3, 1.5));
        let decode = matches!(self.step, Step::Decode(_));
        let mods = self.modifiers(decode);
        let mask = match &mods {
            Some(m) => Mask::none().with_modifiers(m),
            None => Mask::none(),
        };
        let op = Attention::new().causal(self.causal_window || decode);
        let inputs = Inputs::qkv(&q, &k, &v).mask(&mask);
        let want = reference::run(&op.return_weights(true), &inputs)?.context;
        let mut worst = ("output", 0.0f64);
        // A missing output counts as infinitely wrong, NaN as wrong.
        let mut note = |what: &'static str, got: Option<&ArrayD<f32>>, want: &ArrayD<f64>| {
            let rel = got.map_or(f64::INFINITY, |g| reference::compare(g, want).0);
            if rel.is_nan() || rel > worst.1 {
                worst = (what, rel);
            }
        };
        match self.step {
            Step::Gradients(kernels) => {
                let op = op
                    .options(Options::default().kernels(kernels).nan_fill(true))
                    .dtype(self.dtype)
                    .return_weights(false)
                    .save_for_backward(true);
                let d_o = values((b, h, l, e), seed * 4 + 4, 1.0);
                let grads = reference::backward(&op, &inputs, d_o.view().into_dyn())?;
                let out = op.run(ctx, inputs)?;
                note("output", Some(&out.context), &want);
                let saved = out
                    .saved
                    .ok_or_else(|| Error::invalid("verify", "a saved forward without Saved"))?;
                let g = saved.backward(ctx, d_o.view())?;
                for (what, got, want) in [
                    ("dQ", &g.q, &grads.q),
                    ("dK", &g.k, &grads.k),
                    ("dV", &g.v, &grads.v),
                    ("dtable", &g.relative_bias, &grads.relative_bias),
                ] {
                    if let Some(want) = want {
                        note(what, got.as_ref(), want);
                    }
                }
            }
            Step::Decode(block) => {
                let mut dec = Decoder::new().nan_fill(true);
                if let Some(n) = block {
                    dec = dec.block(n);
                }
                if let Some(m) = &mods {
                    dec = dec.modifiers(m);
                }
                let spec = KvCacheSpec {
                    capacity: s,
                    batch: b,
                    kv_heads: h_kv,
                    d_k: e,
                    d_v: e,
                    dtype: self.dtype,
                };
                let mut cache = KvCache::new(ctx, spec)?;
                let mut outs = Vec::new();
                // A prefill of most tokens, two one-token steps and the rest at once.
                let prefill = s.saturating_sub(6).max(1);
                for (from, to) in [
                    (0, prefill),
                    (prefill, prefill + 1),
                    (prefill + 1, prefill + 2),
                    (prefill + 2, s),
                ] {
                    let r = s![.., .., from..to, ..];
                    match self.dtype {
                        Dtype::F16 => {
                            let half = |a: &Array4<f32>| a.slice(r).mapv(half::f16::from_f32);
                            cache.append(ctx, half(&k).view(), half(&v).view())?;
                        }
                        _ => cache.append(ctx, k.slice(r), v.slice(r))?,
                    }
                    outs.push(dec.step(ctx, &cache, q.slice(r))?);
                }
                let views: Vec<_> = outs.iter().map(|o| o.view()).collect();
                let got = ndarray::concatenate(Axis(2), &views)
                    .map_err(|e| Error::invalid("verify", e.to_string()))?;
                note("output", Some(&got.into_dyn()), &want);
            }
        }
        Ok(StepResult {
            case: *self,
            rel: worst.1,
            worst: worst.0,
            tolerance: if f16 { TOL16 } else { TOL32 },
        })
    }
}
