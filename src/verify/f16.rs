//! The bound an f16 case ([`crate::Dtype::F16`]) must meet against
//! [`crate::reference::run_f16`], the f64 evaluation of what the device holds (inputs and
//! projected Q, K, V rounded to f16), and the bound of an f32 case whose kernels round to f16
//! (cooperative matrices with f16 inputs, below). The model, term by term:
//!
//! 1. **f32 arithmetic** on the operands the device holds: the f32 bound [`super::tolerance`]
//!    of the case's logit size, as an f32 case (the kernels are the same).
//! 2. **Stored projections.** A projection computes `q = x·w + b` in f32 (f16 × f16 products
//!    are exact in f32; `d` additions: `|q₃₂ − q| ≤ γ_{d+1}·(Σ|x·w| + |b|)`, `γ_n = n·u/(1 − n·u)`,
//!    `u = 2⁻²⁴`) and stores it rounded to the nearest f16; the reference rounds the exact
//!    `q`. Both roundings are monotone, so the device's value lies between the roundings of
//!    the interval's ends: its error bound is their difference, 0 for every element whose
//!    interval holds no f16 rounding boundary, one f16 spacing for the few that do. (The
//!    device's f32 → f16 conversion is assumed to round to nearest, as lavapipe's does and
//!    as `half` does on the host; one that truncated would fail here, visibly.)
//! 3. **f16 arithmetic** (`flash_blocked` with `BlockedOptions::f16_arithmetic`, GPUs'
//!    default): Q is pre-scaled by `scale·log₂e` and rounded to f16 as it is staged; the
//!    kernel widens the f16 operands of Q·Kᵀ to f32, so each product is exact and the sums
//!    are term 1's. The pre-scaling's deviation is computed from the values, not bounded
//!    ([`prescaled_logits`]). (Until 2026-11-29 the kernel added 4-term dots in f16: at
//!    logits in the thousands those sums are off by whole units, and no bound under 0.05
//!    could be given: 0.45 for `50x16 |X|x30`.) P rounded to f16 and P·V multiplied in f16:
//!    each term of the context is off by `γ¹⁶₂` relative (`u = 2⁻¹¹`), and by
//!    `2⁻²⁵·(|v| + 1)` where it underflows (scaled by `1/l`, `l ≥ 1` the row's sum).
//! 4. **Cooperative matrices with f16 inputs**: P is rounded to f16 (`u = 2⁻¹¹` relative per
//!    term, the same underflow), and the f32 context to f16 before `W_O` (`2⁻¹¹·|c|` and
//!    `2⁻²⁵` per element, times `|W_O|`).
//!
//! Terms 2–4 perturb the logits by at most `t_ij` (the score modifiers are shifts or
//! soft-capping, which does not enlarge a difference) and the values and the products of
//! P·V as above. Softmax depends only on the logits' differences, so a weight's ratio to the
//! reference's lies in `[1/S⁺, 1/S⁻]`, `S^± = a_ij + Σ_{j'≠j} a_ij'·e^{±(t_ij + t_ij')}`:
//! a row dominated by one key barely moves whatever its logits do, and the bound is large
//! only where the rows' leading logits are close. These bounds go through `A·V` and `W_O`
//! element by element; the result's relative bound is their 2-norm over the reference's
//! (the same norm [`crate::reference::compare`] takes), added to term 1 (whose error is
//! relative to the result on the device's operands, so it is scaled by one plus theirs).
//! The largest bound of the f16 sweeps (lavapipe, and the stand-in's whole sweep): see
//! docs/testing.md.
//!
//! **f32 cases on cooperative matrices with f16 inputs** ([`f32_on_coop`]) are compared with
//! the f32 reference, [`crate::reference::run`], but their kernels round what they stage:
//!
//! - the coop matmul (`coop_matmul.wgsl`) converts both operands to f16 as it stages them
//!   and adds the bias (and an accumulated C) in f32: the projections round X and `W_Q`,
//!   `W_K`, `W_V` (not the biases; Q, K and V are stored in f32); the unfused path's scores
//!   round Q and K; the output projection rounds the context and `W_O` (not `b_O`);
//! - `flash_coop` stages Q, K and V as f16 and rounds P (`exp2(s − m)`, its row sum `l` kept
//!   in f32 from the unrounded values) for P·V;
//! - the unfused path's softmax and weighted sum (A·V) read the scores, A and V in f32: A is
//!   not rounded there, in an f32 call or an f16 one (whose V is f16 already).
//!
//! Which of these run is the call's plan ([`Attention::runs_flash_coop`]: `flash_coop` falls
//! back to `flash_blocked`, which rounds nothing in an f32 call, on modifiers). An
//! intermediate reference evaluates in f64 what the device rounds exactly as it rounds it
//! ([`crate::reference::run_held`]): X and the weights rounded to f16; Q, K (and V) as the
//! exact projection rounded to f16 where they are staged, so that the device's staged
//! values lie within term 2's straddle of the intermediate's (a projection computed from
//! f32 operands has the same `γ_{d+1}` bound: its products are not exact, but `d` products
//! and `d + 1` additions still make `γ_{d+1}`); Q, K, V given (or X without projections)
//! rounded as the device rounds them, exactly. P's rounding (relative to the kernel's running
//! max, which the host cannot reproduce) and the context's before `W_O` are term 4's, with
//! no f16 products (term 3). The device's result is within terms 2 and 4 of the intermediate
//! (and term 1 of the result on its operands); the intermediate's distance to the f32
//! reference is computed, not bounded, so the bound is `t₁ + (e + δ)·(1 + t₁)`, `e` the
//! 2-norm of terms 2 and 4 and `δ` the intermediate's distance, both over the f32
//! reference's norm (triangle inequality). Where the data cancel (a small context from O(1)
//! terms) `δ` is what grows, by exactly as much as the rounding moves the answer.

use ndarray::{s, Array2, Array3, Array4, ArrayD, ArrayView2, Axis, Zip};

use super::{Case, CaseData};
use crate::attention::{Attention, Output};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::reference::{round_f16, Held};
use crate::variant::{FlashVariant, MatmulVariant};

/// f32's unit roundoff.
const U32: f64 = 1.0 / 16_777_216.0;
/// f16's unit roundoff, 2^-11.
const U16: f64 = 1.0 / 2048.0;
/// Half of f16's least subnormal: the most a value rounded into f16's subnormal range moves.
const UNDER16: f64 = 1.0 / 33_554_432.0;

/// `γ_n = n·u / (1 − n·u)`: the relative error of `n` rounded operations in unit roundoff
/// `u`.
fn gamma(n: usize, u: f64) -> f64 {
    let nu = n as f64 * u;
    nu / (1.0 - nu)
}

/// Which f16 arithmetic the kernels may do beyond storing f16 operands.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct F16Arithmetic {
    /// Products in f16 (term 3): `flash_blocked` with f16 arithmetic, wherever the context's
    /// [`crate::kernels::flash_blocked::BlockedOptions`] turn it on (GPUs, by default).
    pub products: bool,
    /// P rounded to f16 for P·V on cooperative matrices with f16 inputs (term 4,
    /// `flash_coop`).
    pub coop_weights: bool,
    /// The context rounded to f16 for `W_O` on cooperative matrices with f16 inputs (term 4,
    /// `coop_matmul`).
    pub coop_context: bool,
}

impl F16Arithmetic {
    /// What the kernels of `op` on `ctx` may do for `case` on `data`: from the call's plan
    /// (its fused kernel, whether that computes the context, its matmul), and wherever the
    /// plan does not settle it, everything the adapter and its options allow (a fused call
    /// with block-sparse modifiers and no variant forced may take another fused kernel).
    pub(super) fn of(ctx: &Context, case: &Case, op: &Attention, data: &CaseData) -> Self {
        let dims = match &data.qkv {
            Some([q, k, v]) => op.sdpa_dims(q.shape(), k.shape(), v.shape()),
            None => op.dims(data.x.shape(), data.projections().as_ref()),
        };
        let plan = dims.and_then(|d| op.plan(ctx, &d)).ok();
        let products = ctx.blocked_options().f16_products(ctx);
        let coop = ctx.coop_shape().is_some_and(|s| s.f16_inputs);
        let Some(plan) = plan else {
            return F16Arithmetic {
                products,
                coop_weights: coop,
                coop_context: coop,
            };
        };
        let swappable = case.fused && case.flash.is_none() && !data.mods.presets().is_empty();
        let fused_context = plan.fused || plan.weights_from_stats();
        F16Arithmetic {
            products: products
                && fused_context
                && (matches!(plan.flash, FlashVariant::Blocked { .. }) || swappable),
            coop_weights: coop && fused_context && (plan.flash == FlashVariant::Coop || swappable),
            coop_context: coop && plan.matmul == MatmulVariant::Coop,
        }
    }
}

/// What an f32 call of `op` on `ctx` on `data` rounds to f16 on cooperative matrices with
/// f16 inputs, and the f16 arithmetic of term 4 it does (the module's f32 model): from its
/// plan, with the fused kernel that runs ([`Attention::runs_flash_coop`]). `None` where the
/// adapter has no such matrices or the plan runs nothing on them.
///
/// # Errors
/// The call's shape and planning errors.
pub(super) fn f32_on_coop(
    ctx: &Context,
    op: &Attention,
    data: &CaseData,
) -> Result<Option<(Held, F16Arithmetic)>> {
    if !ctx.coop_shape().is_some_and(|s| s.f16_inputs) {
        return Ok(None);
    }
    let (dims, n_kv) = match &data.qkv {
        Some([q, k, v]) => (op.sdpa_dims(q.shape(), k.shape(), v.shape())?, k.dim().2),
        None => {
            let dims = op.dims(data.x.shape(), data.projections().as_ref())?;
            (dims, dims.n)
        }
    };
    let plan = op.plan(ctx, &dims)?;
    let mods = data.mask().modifiers().is_some();
    let sdpa = data.qkv.is_some();
    // flash_coop stages Q, K and V as f16 and rounds P; the coop matmul stages both of its
    // operands: X and W_Q, W_K, W_V; Q and K for the scores (the unfused path); the context
    // and W_O. The weighted sum (A·V, unfused) reads A and V in f32; biases are added in f32.
    let flash = op.runs_flash_coop(ctx, &plan, &dims, (n_kv, sdpa), mods)?;
    let matmul = plan.matmul == MatmulVariant::Coop;
    let scores = matmul && !(plan.fused || plan.weights_from_stats());
    let qk = flash || scores;
    let held_as = Held {
        inputs: matmul && data.weights.is_some() && !sdpa,
        biases: false,
        qkv: [qk, qk, flash],
    };
    let arith = F16Arithmetic {
        products: false,
        coop_weights: flash,
        coop_context: matmul,
    };
    Ok(held_as.any().then_some((held_as, arith)))
}

/// One side of the attention, `(batch, heads, rows, width)`: the values the reference uses
/// and a bound on how far the device's may be from each.
struct Operand {
    value: Array4<f64>,
    err: Array4<f64>,
}

impl Operand {
    /// Values the device holds exactly (rounded on the host as the reference rounds them).
    fn exact(value: Array4<f64>) -> Self {
        let err = Array4::zeros(value.raw_dim());
        Operand { value, err }
    }

    /// `(batch, rows, groups·width)` values and bounds as `(batch, groups, rows, width)`.
    fn heads((value, err): (Array3<f64>, Array3<f64>), groups: usize) -> Result<Self> {
        let split = |a: Array3<f64>| -> Result<Array4<f64>> {
            let (b, n, w) = a.dim();
            Ok(a.into_shape_with_order((b, n, groups, w / groups))
                .map_err(|e| Error::shape(e.to_string()))?
                .permuted_axes([0, 2, 1, 3]))
        };
        Ok(Operand {
            value: split(value)?,
            err: split(err)?,
        })
    }

    fn head(&self, b: usize, h: usize) -> (ArrayView2<'_, f64>, ArrayView2<'_, f64>) {
        (
            self.value.slice(s![b, h, .., ..]),
            self.err.slice(s![b, h, .., ..]),
        )
    }
}

/// An f32 array as the f16 path uploads it, in f64.
fn stored<D: ndarray::Dimension>(a: &ndarray::Array<f32, D>) -> ndarray::Array<f64, D> {
    a.mapv(|v| f64::from(half::f16::from_f32(v).to_f32()))
}

/// An f32 array in f64, rounded to f16 when `round` ([`stored`]).
fn held<D: ndarray::Dimension>(a: &ndarray::Array<f32, D>, round: bool) -> ndarray::Array<f64, D> {
    match round {
        true => stored(a),
        false => a.mapv(f64::from),
    }
}

/// `x·w + b` over X's rows `(batch, n, d)` as the reference computes it (`w` and `b` rounded
/// to f16 as `held_as` says; the result rounded to f16 when `round`) and each value's bound
/// (term 2 of the module's model: 0 where the result is not rounded, its f32 error being
/// term 1's).
fn projected(
    x: &Array3<f64>,
    (w, b): (&ndarray::Array2<f32>, Option<&ndarray::Array1<f32>>),
    held_as: Held,
    round: bool,
) -> (Array3<f64>, Array3<f64>) {
    let (batch, n, d) = x.dim();
    let w = held(w, held_as.inputs);
    let w_abs = w.mapv(f64::abs);
    let cols = w.ncols();
    let mut value = Array3::zeros((batch, n, cols));
    let mut err = Array3::zeros((batch, n, cols));
    // The f32 accumulation's radius, with room for the f64 evaluation's own rounding.
    let g = gamma(d + 1, U32) + 1e-14;
    for bi in 0..batch {
        let xb = x.index_axis(Axis(0), bi);
        let mut exact = xb.dot(&w);
        let mut size = xb.mapv(f64::abs).dot(&w_abs);
        if let Some(b) = b {
            let b = held(b, held_as.biases);
            exact += &b;
            size += &b.mapv(f64::abs);
        }
        Zip::from(value.index_axis_mut(Axis(0), bi))
            .and(err.index_axis_mut(Axis(0), bi))
            .and(&exact)
            .and(&size)
            .for_each(|v, e, &q, &m| match round {
                true => {
                    let r = g * m;
                    *v = round_f16(q);
                    *e = round_f16(q + r) - round_f16(q - r);
                }
                false => *v = q,
            });
    }
    (value, err)
}

/// Q, K and V as the device holds them (what `held_as` rounds), per head, with their bounds.
fn operands(op: &Attention, data: &CaseData, held_as: Held) -> Result<[Operand; 3]> {
    if let Some([q, k, v]) = &data.qkv {
        let [rq, rk, rv] = held_as.qkv;
        return Ok([(q, rq), (k, rk), (v, rv)].map(|(a, r)| Operand::exact(held(a, r))));
    }
    let proj = data.projections();
    let dims = op.dims(data.x.shape(), proj.as_ref())?;
    let shaped = |a: ndarray::ArrayD<f32>| {
        a.into_shape_with_order((dims.batch, dims.n, dims.d))
            .map_err(|e| Error::shape(e.to_string()))
    };
    match (&data.weights, &data.biases) {
        (None, _) => {
            let x = shaped(data.x.clone())?;
            let [q, k, v] = held_as.qkv.map(|r| {
                let x = held(&x, r);
                Operand::heads((x.clone(), Array3::zeros(x.raw_dim())), dims.heads)
            });
            Ok([q?, k?, v?])
        }
        (Some((w_q, w_k, w_v)), biases) => {
            let x = held(&shaped(data.x.clone())?, held_as.inputs);
            let b = |i: usize| {
                biases.as_ref().map(|(q, k, v)| match i {
                    0 => q,
                    1 => k,
                    _ => v,
                })
            };
            let [rq, rk, rv] = held_as.qkv;
            Ok([
                Operand::heads(projected(&x, (w_q, b(0)), held_as, rq), dims.heads)?,
                Operand::heads(projected(&x, (w_k, b(1)), held_as, rk), dims.kv_heads)?,
                Operand::heads(projected(&x, (w_v, b(2)), held_as, rv), dims.kv_heads)?,
            ])
        }
    }
}

/// 2-norm.
pub(super) fn norm<D: ndarray::Dimension>(a: &ndarray::Array<f64, D>) -> f64 {
    a.iter().map(|v| v * v).sum::<f64>().sqrt()
}

/// `‖err‖ / ‖reference‖` (`‖err‖` where the reference is 0, as `compare` measures it).
pub(super) fn relative(err: f64, reference: f64) -> f64 {
    if reference > 0.0 {
        err / reference
    } else {
        err
    }
}

/// The bounds (context, weights) of terms 2–4, as 2-norms of the element-wise bounds, for
/// the case whose arrays are `data` and whose reference on what the device holds
/// (`held_as`: [`crate::reference::run_f16`], or an f32 call's intermediate reference) is
/// `reference`, run by `op` with `arith`.
///
/// # Errors
/// The shape errors of the reference.
pub(super) fn bound(
    op: &Attention,
    data: &CaseData,
    reference: &Output<ArrayD<f64>>,
    arith: F16Arithmetic,
    held_as: Held,
) -> Result<(f64, f64)> {
    let [q, k, v] = operands(op, data, held_as)?;
    let (batch, heads, n_q, _) = q.value.dim();
    let (kv_heads, n_kv, dv) = (k.value.dim().1, k.value.dim().2, v.value.dim().3);
    let signed_scale = f64::from(match &data.qkv {
        Some([q, k, v]) => op.sdpa_dims(q.shape(), k.shape(), v.shape())?.scale,
        None => op.dims(data.x.shape(), data.projections().as_ref())?.scale,
    });
    let scale = signed_scale.abs();
    // The reference's weights, always returned, as (batch, heads, n_q, n_kv).
    let weights = reference
        .weights
        .as_ref()
        .ok_or_else(|| Error::invalid("reference", "no weights"))?
        .view()
        .into_shape_with_order((batch, heads, n_q, n_kv))
        .map_err(|e| Error::shape(e.to_string()))?;
    // P·V's relative error per term (terms 3 and 4) and whether P may underflow in f16.
    let rho = match arith {
        F16Arithmetic { products: true, .. } => gamma(2, U16),
        F16Arithmetic {
            coop_weights: true, ..
        } => U16,
        _ => 0.0,
    };
    let mut d_weights = Array4::<f64>::zeros((batch, heads, n_q, n_kv));
    let mut d_context = Array3::<f64>::zeros((batch, n_q, heads * dv));
    let mut context_abs = Array3::<f64>::zeros((batch, n_q, heads * dv));
    for b in 0..batch {
        for h in 0..heads {
            let g = h / (heads / kv_heads);
            let (qv, qe) = q.head(b, h);
            let (kv, ke) = k.head(b, g);
            let (vv, ve) = v.head(b, g);
            let k_abs = &kv.mapv(f64::abs) + &ke;
            let v_abs = &vv.mapv(f64::abs) + &ve;
            let a = weights.slice(s![b, h, .., ..]);
            // Term 2 (and 3) on the logits, and the weights' and context's bounds.
            let t = if arith.products {
                prescaled_logits((qv, qe), (kv, ke), signed_scale)
            } else {
                (qe.dot(&k_abs.t()) + qv.mapv(f64::abs).dot(&ke.t())) * scale
            };
            let da = weight_bounds(&a, &t);
            let mut dc = da.dot(&v_abs) + a.dot(&ve);
            // Through A·V: P·V's rounding.
            let reach = &a + &da;
            if rho > 0.0 {
                dc = dc + reach.dot(&v_abs) * rho;
                for (i, mut row) in dc.outer_iter_mut().enumerate() {
                    let ai = a.row(i);
                    let max = ai.fold(0.0f64, |m, &x| m.max(x));
                    let visible = ai.mapv(|x| f64::from(u8::from(x > 0.0)));
                    let under = visible.dot(&v_abs).mapv(|s| s + visible.sum());
                    row.scaled_add(UNDER16 * max, &under);
                }
            }
            let cols = s![b, .., h * dv..(h + 1) * dv];
            d_context.slice_mut(cols).assign(&dc);
            context_abs
                .slice_mut(cols)
                .assign(&(reach.dot(&v_abs) + &dc));
            d_weights.slice_mut(s![b, h, .., ..]).assign(&da);
        }
    }
    // Through W_O: the context's bounds, and (term 4) its rounding to f16.
    let d_out = match data.output.as_ref() {
        Some((w_o, _)) if data.weights.is_some() && data.qkv.is_none() => {
            let w_abs = held(w_o, held_as.inputs).mapv(f64::abs);
            let flat = |a: Array3<f64>| -> Result<Array2<f64>> {
                a.into_shape_with_order((batch * n_q, heads * dv))
                    .map_err(|e| Error::shape(e.to_string()))
            };
            let mut out = flat(d_context)?.dot(&w_abs);
            if arith.coop_context {
                let c = flat(context_abs)?.mapv(|c| U16 * c + UNDER16);
                out = out + c.dot(&w_abs);
            }
            out.into_dyn()
        }
        _ => d_context.into_dyn(),
    };
    Ok((norm(&d_out), norm(&d_weights)))
}

/// Term 3's logits for one head: how far each may be from the reference's when Q is
/// pre-scaled and rounded as the kernel stages it, `q̂ = f16(q · scale·log₂e)` (the f32
/// product rounded to f16), and multiplied by K exactly (the kernel widens both to f32: a
/// product of two f16 values is exact in f32, and the f32 sums are term 1's). The deviation
/// `D_i = q̂_i/log₂e − scale·q_i` is computed here from the values, as an interval where the
/// device's `q` is itself uncertain (term 2) or where f32's roundings of `scale·log₂e` and of
/// the product could move `q̂` across an f16 rounding boundary (both rounding functions are
/// monotone): logit `(i, j)` is off by at most `|Σ_e c_ie·k_je| + Σ_e r_ie·|k_je| +
/// Σ_e |q̂_ie|·δk_je` (centre `c`, radius `r`, `δk` term 2's bound on `k`), in natural-log
/// units (the kernel's log₂ scores divided by `log₂e`).
fn prescaled_logits(
    (qv, qe): (ArrayView2<'_, f64>, ArrayView2<'_, f64>),
    (kv, ke): (ArrayView2<'_, f64>, ArrayView2<'_, f64>),
    scale: f64,
) -> Array2<f64> {
    let log2e = std::f64::consts::LOG2_E;
    let scaled = scale * log2e;
    // f32's roundings of `scale·log₂e` and of the product, with room to spare.
    let slop = 4.0 * U32;
    let mut centre = Array2::<f64>::zeros(qv.raw_dim());
    let mut radius = Array2::<f64>::zeros(qv.raw_dim());
    let mut q_hat = Array2::<f64>::zeros(qv.raw_dim());
    Zip::from(&mut centre)
        .and(&mut radius)
        .and(&mut q_hat)
        .and(&qv)
        .and(&qe)
        .for_each(|c, r, h, &q, &e| {
            let (x, y) = ((q - e) * scaled, (q + e) * scaled);
            let (lo, hi) = (x.min(y), x.max(y));
            let (lo, hi) = (
                round_f16(lo - lo.abs() * slop),
                round_f16(hi + hi.abs() * slop),
            );
            let (d_lo, d_hi) = (lo / log2e - scale * q, hi / log2e - scale * q);
            *c = 0.5 * (d_lo + d_hi);
            // f64's own roundings in the difference.
            *r = 0.5 * (d_hi - d_lo) + 1e-15 * (scale * q).abs();
            *h = lo.abs().max(hi.abs()) / log2e;
        });
    centre.dot(&kv.t()).mapv(f64::abs) + radius.dot(&kv.mapv(f64::abs).t()) + q_hat.dot(&ke.t())
}

/// Each weight's bound where row `i`'s logits may each move by up to `t[i, j]` (see the
/// module's model): `a_ij · max(1/S⁻ − 1, 1 − 1/S⁺)`.
fn weight_bounds(a: &ArrayView2<'_, f64>, t: &Array2<f64>) -> Array2<f64> {
    let mut out = Array2::zeros(a.raw_dim());
    for ((a, t), mut out) in a.outer_iter().zip(t.outer_iter()).zip(out.outer_iter_mut()) {
        let up: f64 = a.iter().zip(t).map(|(&a, &t)| a * t.exp()).sum();
        let down: f64 = a.iter().zip(t).map(|(&a, &t)| a * (-t).exp()).sum();
        for ((&a, &t), out) in a.iter().zip(t).zip(out.iter_mut()) {
            if a > 0.0 && t.is_finite() {
                // The other keys' sums (clamped: a ≈ 1 leaves rounding noise).
                let s_up = a + t.exp() * (up - a * t.exp()).max(0.0);
                let s_down = a + (-t).exp() * (down - a * (-t).exp()).max(0.0);
                *out = a * (1.0 / s_down - 1.0).max(1.0 - 1.0 / s_up);
            } else if a > 0.0 {
                // Logits that may move without bound: the weight may be anything in [0, 1].
                *out = 1.0;
            }
        }
    }
    out
}
