//! The oracle of the f16 path ([`crate::Dtype::F16`]): [`run_f16`] evaluates in f64 what the
//! device holds, so that what is left between it and the GPU's f16 result is the kernels'
//! arithmetic alone (bounded in `verify/f16.rs`).

use ndarray::{Array1, Array2, ArrayD, ArrayViewD};

use super::{attention_masked_rounded, four, sdpa_masked};
use crate::attention::inputs::Operands;
use crate::attention::{Attention, Host, Inputs, Output, Projections};
use crate::error::Result;

/// `x` rounded to the nearest f16 value, ties to even (what a device's f32 → f16 conversion
/// gives, and `half::f16::from_f32` on the host), as an f64; past f16's range (±65,504 and
/// the half spacing above it) ±∞. Exact for every f64: no rounding through f32 first.
pub fn round_f16(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    // The binade's exponent from the bits (log2 can be off by one next to a power of 2);
    // below f16's least normal binade (2^-14) the spacing stays 2^-24 (subnormals).
    let exp = (((x.to_bits() >> 52) & 0x7ff) as i32 - 1023).max(-14);
    // f16 has 10 fraction bits: spacing 2^(exp − 10); the divisions by it are exact.
    let spacing = 2f64.powi(exp - 10);
    let r = (x / spacing).round_ties_even() * spacing;
    if r.abs() > 65504.0 {
        f64::INFINITY.copysign(x)
    } else {
        r
    }
}

/// An f32 input as the f16 path uploads it (`half::f16::from_f32`).
fn stored(a: &ArrayViewD<'_, f32>) -> ArrayD<f32> {
    a.mapv(|v| half::f16::from_f32(v).to_f32())
}

/// Which of a call's values the device holds rounded to f16, or rounds as a kernel stages
/// them: what [`run_held`] rounds. An f16 call ([`crate::Dtype::F16`]) holds every one in f16
/// ([`Held::F16`]); an f32 call on cooperative matrices with f16 inputs rounds what those
/// stage (`src/verify/f16.rs` says which, kernel by kernel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    /// X and the weights `W_Q`, `W_K`, `W_V` and `W_O` (X only with projections; without,
    /// X is Q, K and V, rounded by [`Held::qkv`]).
    pub inputs: bool,
    /// The biases `b_Q`, `b_K`, `b_V` and `b_O`.
    pub biases: bool,
    /// Q, K and V, each: the projected value rounded (the f64 value, [`round_f16`]), or the
    /// given one (Q, K and V of a call on them, X without projections).
    pub qkv: [bool; 3],
}

impl Held {
    /// An f16 call's: everything.
    pub const F16: Held = Held {
        inputs: true,
        biases: true,
        qkv: [true; 3],
    };

    /// Whether anything is rounded.
    pub fn any(&self) -> bool {
        self.inputs || self.biases || self.qkv.iter().any(|&r| r)
    }
}

/// The projections' weights and biases, rounded to f16 where held so, owned.
struct Rounded {
    w: [Array2<f32>; 3],
    b: [Option<Array1<f32>>; 3],
    w_o: Option<Array2<f32>>,
    b_o: Option<Array1<f32>>,
}

impl Rounded {
    fn of(p: &Projections<'_>, held: Held) -> Self {
        let f16 = |v: f32| half::f16::from_f32(v).to_f32();
        let two = |w: &ndarray::ArrayView2<'_, f32>| match held.inputs {
            true => w.mapv(f16),
            false => w.to_owned(),
        };
        let one = |b: &Option<ndarray::ArrayView1<'_, f32>>| {
            b.as_ref().map(|b| match held.biases {
                true => b.mapv(f16),
                false => b.to_owned(),
            })
        };
        Rounded {
            w: [two(&p.w_q), two(&p.w_k), two(&p.w_v)],
            b: [one(&p.b_q), one(&p.b_k), one(&p.b_v)],
            w_o: p.w_o.as_ref().map(two),
            b_o: one(&p.b_o),
        }
    }

    fn view(&self) -> Projections<'_> {
        let [w_q, w_k, w_v] = &self.w;
        let [b_q, b_k, b_v] = &self.b;
        Projections {
            w_q: w_q.view(),
            w_k: w_k.view(),
            w_v: w_v.view(),
            b_q: b_q.as_ref().map(|b| b.view()),
            b_k: b_k.as_ref().map(|b| b.view()),
            b_v: b_v.as_ref().map(|b| b.view()),
            w_o: self.w_o.as_ref().map(|w| w.view()),
            b_o: self.b_o.as_ref().map(|b| b.view()),
        }
    }
}

/// [`super::run`] on what the f16 path ([`crate::Dtype::F16`]) holds on the device, in f64:
/// every input (X, the projections' weights and biases, `W_O` and `b_O`; or Q, K and V)
/// rounded to f16 as it is uploaded, and the projected Q, K and V rounded to f16 (by
/// [`round_f16`]) as the projections store them between kernels. The mask stays as given
/// (it is uploaded in f32); scores, softmax, sums and the output projection are exact. What
/// remains between this and a GPU's f16 result is the kernels' arithmetic: f32 accumulation,
/// and f16 only where a kernel multiplies in f16.
///
/// # Errors
/// As [`super::run`].
pub fn run_f16(op: &Attention, inputs: &Inputs<'_, Host>) -> Result<Output<ArrayD<f64>>> {
    run_held(op, inputs, Held::F16)
}

/// [`super::run`] with what `held` says rounded to f16 (inputs as `half` rounds f32 values,
/// projected Q, K and V by [`round_f16`]), the rest exact: [`run_f16`] with [`Held::F16`].
///
/// # Errors
/// As [`super::run`].
pub(crate) fn run_held(
    op: &Attention,
    inputs: &Inputs<'_, Host>,
    held: Held,
) -> Result<Output<ArrayD<f64>>> {
    let mask = inputs.mask_or_none();
    match &inputs.operands {
        Operands::X(x) => {
            let x = match held.inputs && inputs.projections.is_some() {
                true => stored(&x.view()),
                false => x.to_owned(),
            };
            let rounded = inputs.projections.as_ref().map(|p| Rounded::of(p, held));
            let proj = rounded.as_ref().map(Rounded::view);
            let round = held.qkv.map(|r| r.then_some(round_f16 as fn(f64) -> f64));
            attention_masked_rounded(op, x.view(), proj.as_ref(), &mask, round)
        }
        Operands::Qkv([q, k, v]) => {
            let [q, k, v] = four([q, k, v], inputs.projections.is_some())?;
            let f16 = |v: f32| half::f16::from_f32(v).to_f32();
            let [q, k, v] = [(q, held.qkv[0]), (k, held.qkv[1]), (v, held.qkv[2])].map(|(a, r)| {
                if r {
                    a.mapv(f16)
                } else {
                    a.to_owned()
                }
            });
            sdpa_masked(op, q.view(), k.view(), v.view(), &mask)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_f16_agrees_with_half_on_f32_values_and_rounds_f64_once() {
        let mut x = 1.0e-9f32;
        while x < 7.0e4 {
            for v in [x, -x, x * 1.000_37, x * 0.999_91] {
                let want = f64::from(half::f16::from_f32(v).to_f32());
                let got = round_f16(f64::from(v));
                assert!(
                    got == want || (got.is_infinite() && want.is_infinite()),
                    "{v}: {got} vs {want}"
                );
            }
            x *= 1.37;
        }
        // 1 + 2^-11 + 2^-40 is just above the midpoint of 1 and 1 + 2^-10: it rounds up,
        // where rounding through f32 first (1 + 2^-11, a tie) would go to even, 1.
        let above = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(round_f16(above), 1.0 + 2f64.powi(-10));
        assert_eq!(round_f16(1.0 + 2f64.powi(-11)), 1.0);
        assert_eq!(round_f16(3.0 * 2f64.powi(-26)), 2f64.powi(-24));
        assert_eq!(round_f16(65519.0), 65504.0);
        assert!(round_f16(65520.0).is_infinite());
    }
}
