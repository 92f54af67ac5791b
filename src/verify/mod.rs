//! Kernel verification: problems over many shapes and options, each run on the GPU and on
//! the f64 CPU reference and compared. Drives `wgpu-attention verify` and the test suite.
//! The problems themselves ([`Case`]) are in `cases.rs`, the fixed, quick and random sweeps
//! in `sweep.rs`.

mod cases;
mod f16;
mod steps;
mod sweep;

use std::fmt;

pub use cases::{Case, CaseData, MaskCase, MaskData, ModsCase};
pub use steps::{step_cases, Step, StepCase, StepResult, STEP_HEADER};
pub use sweep::{quick_cases, random_cases, standard_cases};

use ndarray::ArrayD;

use crate::attention::{Attention, Dtype, Host, Inputs, Output, Projections};
use crate::context::Context;
use crate::error::Result;
use crate::mask::Mask;
use crate::reference;
use crate::variant::Kernels;

/// f32 machine epsilon, as f64.
const EPS32: f64 = f32::EPSILON as f64;

/// How one case came out.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CaseResult {
    /// The case.
    pub case: Case,
    /// ‖context − ref‖ / ‖ref‖.
    pub context_rel: f64,
    /// max |context − ref|.
    pub context_max: f64,
    /// ‖weights − ref‖ / ‖ref‖.
    pub weights_rel: f64,
    /// max |weights − ref|.
    pub weights_max: f64,
    /// The relative-error bound both must meet.
    pub tolerance: f64,
}

impl CaseResult {
    /// Both relative errors within the tolerance (NaN anywhere fails).
    pub fn passed(&self) -> bool {
        self.context_rel <= self.tolerance && self.weights_rel <= self.tolerance
    }
}

/// X's inputs with the projections and mask, if any.
fn inputs<'a>(
    x: Inputs<'a, Host>,
    proj: Option<&'a Projections<'a>>,
    mask: &'a Mask<'a>,
) -> Inputs<'a, Host> {
    let x = x.mask(mask);
    match proj {
        Some(p) => x.projections(p),
        None => x,
    }
}

/// The relative-error bound for a problem whose logits reach `logit_bound`: f32 rounding
/// of a logit of size L is about ε·L, and the softmax turns that absolute error into a
/// relative error of the weights, so the bound grows with L.
pub fn tolerance(logit_bound: f64) -> f64 {
    5e-6 + 4.0 * EPS32 * logit_bound
}

/// What a case's result is compared with: the f64 reference on the case's arrays (for an
/// f16 case, [`reference::run_f16`]: on its inputs rounded to f16 and its projected Q, K,
/// V rounded as the device stores them) and the relative-error bound both the context and
/// the weights must meet.
///
/// The bound is [`tolerance`] of the logit size for f32 arithmetic, and for an f16 case that
/// plus what the f16 rounding the reference cannot reproduce exactly can move the result:
/// projections whose f32 value straddles an f16 rounding boundary, and where the kernels
/// multiply in f16 (f16 arithmetic in `flash_blocked`, cooperative matrices with f16
/// inputs), that arithmetic; bounded element by element through the softmax, `A·V` and `W_O`
/// (the model is stated in full in `src/verify/f16.rs`).
#[derive(Debug, Clone)]
pub struct Expected {
    case: Case,
    reference: Output<ArrayD<f64>>,
    tolerance: f64,
}

impl Expected {
    /// The reference and bound of `case` run by `case.op()` on `data` on `ctx` (whose
    /// adapter and options say which arithmetic the kernels may do).
    ///
    /// # Errors
    /// Whatever the reference returns.
    pub fn new(ctx: &Context, case: &Case, data: &CaseData) -> Result<Self> {
        Self::with_op(ctx, case, &case.op(), data)
    }

    /// [`Expected::new`] for `case` run by `op` (the case's options with a variant forced).
    ///
    /// # Errors
    /// Whatever the reference returns.
    pub fn with_op(ctx: &Context, case: &Case, op: &Attention, data: &CaseData) -> Result<Self> {
        let proj = data.projections();
        let mask = data.mask();
        let f16 = case.dtype == Dtype::F16;
        // What the device holds in f16 and the f16 arithmetic it does: everything for an f16
        // case; for an f32 one, what cooperative matrices with f16 inputs stage, if any.
        let rounded = match f16 {
            true => Some((
                reference::Held::F16,
                f16::F16Arithmetic::of(ctx, case, op, data),
            )),
            false => f16::f32_on_coop(ctx, op, data)?,
        };
        let run = |held: Option<reference::Held>| {
            let oracle = |op: &Attention, inputs: &Inputs<'_, Host>| match held {
                Some(held) => reference::run_held(op, inputs, held),
                None => reference::run(op, inputs),
            };
            match &data.qkv {
                None => oracle(op, &inputs(Inputs::x(data.x.view()), proj.as_ref(), &mask)),
                Some([q, k, v]) => {
                    oracle(op, &Inputs::qkv(q.view(), k.view(), v.view()).mask(&mask))
                }
            }
        };
        // The reference the result is compared with: an f16 case's on what it holds.
        let cpu = run(rounded.filter(|_| f16).map(|(held, _)| held))?;
        let bound = match &data.qkv {
            None => reference::logit_bound(op, data.x.view(), proj.as_ref())?,
            Some([q, k, v]) => {
                let (q, k, v) = (q.view(), k.view(), v.view());
                let scale = op.sdpa_dims(q.shape(), k.shape(), v.shape())?.scale;
                // |scale · q·k| ≤ |scale| · E · max|q| · max|k|.
                let max = |a: &ndarray::ArrayView4<'_, f32>| a.fold(0.0f32, |m, x| m.max(x.abs()));
                f64::from(scale.abs() * q.dim().3 as f32 * max(&q) * max(&k))
            }
        };
        // ALiBi moves the logits by up to its slope times the distance.
        let bound = bound + data.mods_bound();
        let f32_part = tolerance(bound);
        let tolerance = match rounded {
            None => f32_part,
            Some((held, arith)) => {
                // The reference on what the device holds (an f16 case's own), and the bound
                // of the device's result against it (terms 2–4, element by element); for an
                // f32 case, plus the exact distance from it to the f32 reference.
                let held_ref = match f16 {
                    true => None,
                    false => Some(run(Some(held))?),
                };
                let on_held = held_ref.as_ref().unwrap_or(&cpu);
                let (context, weights) = f16::bound(op, data, on_held, arith, held)?;
                let (context, weights) = match &held_ref {
                    None => (context, weights),
                    Some(r) => (
                        context + f16::norm(&(&r.context - &cpu.context)),
                        weights + distance(r.weights.as_ref(), cpu.weights.as_ref()),
                    ),
                };
                let context = f16::relative(context, f16::norm(&cpu.context));
                let weights = f16::relative(weights, norm_of(cpu.weights.as_ref()));
                let rounding = if case.fused {
                    context
                } else {
                    context.max(weights)
                };
                // The f32 arithmetic's error is relative to the result on the device's
                // operands, which is within `rounding` of the reference's.
                f32_part + rounding * (1.0 + f32_part)
            }
        };
        Ok(Expected {
            case: *case,
            reference: cpu,
            tolerance,
        })
    }

    /// The reference's context and weights (the weights always).
    pub fn reference(&self) -> &Output<ArrayD<f64>> {
        &self.reference
    }

    /// The relative-error bound.
    pub fn tolerance(&self) -> f64 {
        self.tolerance
    }

    /// How a result with `context` and `weights` compares: a result of the case's path with
    /// the weights needs them (a fused one returns none and only its context is checked).
    pub fn check(&self, context: &ArrayD<f32>, weights: Option<&ArrayD<f32>>) -> CaseResult {
        let cpu = &self.reference;
        let (context_rel, context_max) = reference::compare(context, &cpu.context);
        let (weights_rel, weights_max) = match (weights, &cpu.weights, self.case.fused) {
            (Some(g), Some(c), false) => reference::compare(g, c),
            // The fused path returns no weights by design; only the context is checked.
            (None, _, true) => (0.0, 0.0),
            _ => (f64::INFINITY, f64::INFINITY),
        };
        CaseResult {
            case: self.case,
            context_rel,
            context_max,
            weights_rel,
            weights_max,
            tolerance: self.tolerance,
        }
    }
}

/// `‖a − b‖` of two references' weights (both always there).
fn distance(a: Option<&ArrayD<f64>>, b: Option<&ArrayD<f64>>) -> f64 {
    match (a, b) {
        (Some(a), Some(b)) => f16::norm(&(a - b)),
        _ => f64::INFINITY,
    }
}

/// `‖a‖` of a reference's weights (always there).
fn norm_of(a: Option<&ArrayD<f64>>) -> f64 {
    a.map_or(0.0, f16::norm)
}

/// Runs `case` with data from `seed` on the GPU and the reference and compares them.
///
/// # Errors
/// Whatever the GPU or reference path returns.
pub fn run_case(ctx: &Context, case: &Case, seed: u64) -> Result<CaseResult> {
    run_case_with(ctx, case, case.op(), seed)
}

/// [`run_case`] with `op` instead of the case's own (the case's options with a kernel
/// variant forced, say).
///
/// # Errors
/// Whatever the GPU or reference path returns.
pub fn run_case_with(ctx: &Context, case: &Case, op: Attention, seed: u64) -> Result<CaseResult> {
    crate::gpu::oneshot::block_on(run_case_with_async(ctx, case, op, seed))
}

/// [`run_case`] without blocking (the browser's verify).
///
/// # Errors
/// Whatever the GPU or reference path returns.
pub async fn run_case_async(ctx: &Context, case: &Case, seed: u64) -> Result<CaseResult> {
    run_case_with_async(ctx, case, case.op(), seed).await
}

/// [`run_case_with`] without blocking.
///
/// # Errors
/// Whatever the GPU or reference path returns.
pub async fn run_case_with_async(
    ctx: &Context,
    case: &Case,
    op: Attention,
    seed: u64,
) -> Result<CaseResult> {
    let data = case.data(seed);
    let gpu = run_gpu(ctx, &op, &data).await?;
    let expected = Expected::with_op(ctx, case, &op, &data)?;
    Ok(expected.check(&gpu.context, gpu.weights.as_ref()))
}

/// `op` on the GPU on the case's arrays `data`.
///
/// # Errors
/// Whatever the GPU path returns.
pub async fn run_gpu(ctx: &Context, op: &Attention, data: &CaseData) -> Result<Output> {
    let proj = data.projections();
    let mask = data.mask();
    match &data.qkv {
        None => {
            op.run_async(ctx, inputs(Inputs::x(data.x.view()), proj.as_ref(), &mask))
                .await
        }
        Some([q, k, v]) => {
            op.run_async(ctx, Inputs::qkv(q.view(), k.view(), v.view()).mask(&mask))
                .await
        }
    }
}

/// Every case of `cases` on the cooperative-matrix kernels (`Kernels::Coop`), with the
/// weights and fused, where `ctx` has them (`verify --coop`; the tuner does not offer them
/// until they are trusted, see [`crate::bench::COOP_TUNED`]).
pub fn on_coop(ctx: &Context, cases: &[Case]) -> Vec<Case> {
    match ctx.coop_shape() {
        Some(_) => cases
            .iter()
            .flat_map(|c| [c.on(Kernels::Coop, false), c.on(Kernels::Coop, true)])
            .collect(),
        None => Vec::new(),
    }
}

/// The paths every case runs on with `ctx`: each kernel family the adapter has, with the
/// weights and fused.
pub fn paths(ctx: &Context) -> Vec<(Kernels, bool)> {
    Kernels::available(ctx)
        .into_iter()
        .flat_map(|k| [(k, false), (k, true)])
        .collect()
}

/// Every case on every path of [`paths`].
pub fn on_every_path(ctx: &Context, cases: &[Case]) -> Vec<Case> {
    let paths = paths(ctx);
    cases
        .iter()
        .flat_map(|c| paths.iter().map(move |&(k, f)| c.on(k, f)))
        .collect()
}

/// Every case of `cases` (each on its path) again with each variant a tuner may pick on
/// `ctx` for it forced in turn: a fused case with each fused-kernel candidate of its family
/// (tensor cores with the storage family), a case with the weights with each matmul
/// candidate, for the case's element type ([`crate::tune::flash_candidates`],
/// [`crate::tune::matmul_candidates`]).
pub fn with_every_variant(ctx: &Context, cases: &[Case]) -> Vec<Case> {
    let mut out = Vec::new();
    for case in cases {
        out.push(*case);
        let family = match case.kernels {
            Kernels::Auto => continue,
            k => k,
        };
        if case.fused {
            let (dk, dv) = case.head_widths();
            let (dk4, dv4) = (dk.div_ceil(4) as u32, dv.div_ceil(4) as u32);
            let variants = crate::tune::flash_candidates(ctx, &[family], dk4, dv4, case.dtype);
            out.extend(variants.into_iter().map(|v| Case {
                flash: Some(v),
                ..*case
            }));
        } else {
            let variants = crate::tune::matmul_candidates(ctx, &[family], case.dtype);
            out.extend(variants.into_iter().map(|v| Case {
                matmul: Some(v),
                ..*case
            }));
        }
    }
    out
}

/// The table header `verify` prints.
pub const HEADER: &str =
    "case                                                       ctx max abs   ctx rel    wts max abs   wts rel    bound      result";

impl fmt::Display for CaseResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (wmax, wrel) = if self.case.fused {
            ("-".to_string(), "-".to_string())
        } else {
            (
                format!("{:.2e}", self.weights_max),
                format!("{:.2e}", self.weights_rel),
            )
        };
        write!(
            f,
            "{:<58} {:>10.2e}  {:>9.2e}  {:>10}  {:>9}  {:>9.2e}  {}",
            self.case.to_string(),
            self.context_max,
            self.context_rel,
            wmax,
            wrel,
            self.tolerance,
            if self.passed() { "pass" } else { "FAIL" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_cases_are_valid_configurations() {
        for c in random_cases(200, 7) {
            let data = c.data(1);
            let proj = data.projections();
            c.op().dims(data.x.shape(), proj.as_ref()).unwrap();
        }
    }
}
