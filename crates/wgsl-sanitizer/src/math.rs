//! Scalar arithmetic on leaves (`u32` words) of each kind, as a GPU does it: f32 in f32,
//! f16 rounded to half after every operation (computed in f64, where sums and products of
//! halves are exact, then rounded once), integers wrapping.

use half::f16;
use naga::{BinaryOperator as B, MathFunction as M, UnaryOperator as U};

use crate::types::K;
use crate::Error;

#[inline]
pub fn f32_of(w: u32) -> f32 {
    f32::from_bits(w)
}

#[inline]
pub fn h(w: u32) -> f64 {
    f16::from_bits(w as u16).to_f64()
}

#[inline]
pub fn hw(v: f64) -> u32 {
    f16::from_f64(v).to_bits() as u32
}

/// A float leaf as f64 (exact for f32 and f16).
#[inline]
pub fn to_f64(k: K, w: u32) -> f64 {
    match k {
        K::F32 => f32::from_bits(w) as f64,
        K::F16 => h(w),
        K::I32 => w as i32 as f64,
        K::U32 => w as f64,
        K::Bool => w as f64,
    }
}

/// A leaf of kind `k` from an f64 (rounded to the kind; integers truncated).
pub fn from_f64(k: K, v: f64) -> u32 {
    match k {
        K::F32 => (v as f32).to_bits(),
        K::F16 => hw(v),
        K::I32 => v as i32 as u32,
        K::U32 => v as u32,
        K::Bool => (v != 0.0) as u32,
    }
}

/// Whether a leaf is a finite number (non-floats always are).
#[inline]
pub fn finite(k: K, w: u32) -> bool {
    match k {
        K::F32 => f32::from_bits(w).is_finite(),
        K::F16 => (w & 0x7c00) != 0x7c00,
        _ => true,
    }
}

fn int_div_i(a: i32, b: i32) -> i32 {
    if b == 0 {
        a
    } else {
        a.wrapping_div(b)
    }
}

fn int_rem_i(a: i32, b: i32) -> i32 {
    if b == 0 {
        0
    } else {
        a.wrapping_rem(b)
    }
}

/// `a op b` for leaves of kind `k` (operands of one kind; shifts take a u32 right side).
/// Comparisons return bools.
#[inline]
pub fn binary(op: B, k: K, a: u32, b: u32) -> Result<u32, Error> {
    Ok(match k {
        K::F32 => {
            let (x, y) = (f32_of(a), f32_of(b));
            match op {
                B::Add => (x + y).to_bits(),
                B::Subtract => (x - y).to_bits(),
                B::Multiply => (x * y).to_bits(),
                B::Divide => (x / y).to_bits(),
                B::Modulo => (x % y).to_bits(),
                B::Equal => (x == y) as u32,
                B::NotEqual => (x != y) as u32,
                B::Less => (x < y) as u32,
                B::LessEqual => (x <= y) as u32,
                B::Greater => (x > y) as u32,
                B::GreaterEqual => (x >= y) as u32,
                _ => return Err(bad_op(op, k)),
            }
        }
        K::F16 => {
            let (x, y) = (h(a), h(b));
            match op {
                B::Add => hw(x + y),
                B::Subtract => hw(x - y),
                B::Multiply => hw(x * y),
                B::Divide => hw(x / y),
                B::Modulo => hw(x % y),
                B::Equal => (x == y) as u32,
                B::NotEqual => (x != y) as u32,
                B::Less => (x < y) as u32,
                B::LessEqual => (x <= y) as u32,
                B::Greater => (x > y) as u32,
                B::GreaterEqual => (x >= y) as u32,
                _ => return Err(bad_op(op, k)),
            }
        }
        K::I32 => {
            let (x, y) = (a as i32, b as i32);
            match op {
                B::Add => x.wrapping_add(y) as u32,
                B::Subtract => x.wrapping_sub(y) as u32,
                B::Multiply => x.wrapping_mul(y) as u32,
                B::Divide => int_div_i(x, y) as u32,
                B::Modulo => int_rem_i(x, y) as u32,
                B::Equal => (x == y) as u32,
                B::NotEqual => (x != y) as u32,
                B::Less => (x < y) as u32,
                B::LessEqual => (x <= y) as u32,
                B::Greater => (x > y) as u32,
                B::GreaterEqual => (x >= y) as u32,
                B::And => a & b,
                B::InclusiveOr => a | b,
                B::ExclusiveOr => a ^ b,
                B::ShiftLeft => x.wrapping_shl(b & 31) as u32,
                B::ShiftRight => x.wrapping_shr(b & 31) as u32,
                _ => return Err(bad_op(op, k)),
            }
        }
        K::U32 => match op {
            B::Add => a.wrapping_add(b),
            B::Subtract => a.wrapping_sub(b),
            B::Multiply => a.wrapping_mul(b),
            B::Divide => a.checked_div(b).unwrap_or(a),
            B::Modulo => a.checked_rem(b).unwrap_or(0),
            B::Equal => (a == b) as u32,
            B::NotEqual => (a != b) as u32,
            B::Less => (a < b) as u32,
            B::LessEqual => (a <= b) as u32,
            B::Greater => (a > b) as u32,
            B::GreaterEqual => (a >= b) as u32,
            B::And => a & b,
            B::InclusiveOr => a | b,
            B::ExclusiveOr => a ^ b,
            B::ShiftLeft => a.wrapping_shl(b & 31),
            B::ShiftRight => a.wrapping_shr(b & 31),
            _ => return Err(bad_op(op, k)),
        },
        K::Bool => match op {
            B::Equal => (a == b) as u32,
            B::NotEqual => (a != b) as u32,
            B::And | B::LogicalAnd => a & b,
            B::InclusiveOr | B::LogicalOr => a | b,
            B::ExclusiveOr => a ^ b,
            _ => return Err(bad_op(op, k)),
        },
    })
}

fn bad_op(op: B, k: K) -> Error {
    Error::Unsupported(format!("the operator {op:?} on {k:?}"))
}

pub fn unary(op: U, k: K, a: u32) -> Result<u32, Error> {
    Ok(match (op, k) {
        (U::Negate, K::F32) => a ^ 0x8000_0000,
        (U::Negate, K::F16) => a ^ 0x8000,
        (U::Negate, K::I32) => (a as i32).wrapping_neg() as u32,
        (U::LogicalNot, K::Bool) => a ^ 1,
        (U::BitwiseNot, K::I32 | K::U32) => !a,
        (U::BitwiseNot, K::Bool) => a ^ 1,
        _ => return Err(Error::Unsupported(format!("the operator {op:?} on {k:?}"))),
    })
}

/// Converts a leaf of kind `from` to kind `to` (WGSL value conversion: float to int
/// saturates, NaN to 0).
pub fn convert(from: K, to: K, a: u32) -> u32 {
    if from == to {
        return a;
    }
    match to {
        K::F32 => match from {
            K::F16 => (h(a) as f32).to_bits(),
            K::I32 => (a as i32 as f32).to_bits(),
            K::U32 => (a as f32).to_bits(),
            K::Bool => (a as f32).to_bits(),
            K::F32 => a,
        },
        K::F16 => match from {
            K::F32 => f16::from_f32(f32::from_bits(a)).to_bits() as u32,
            K::I32 => hw(a as i32 as f64),
            K::U32 => hw(a as f64),
            K::Bool => hw(a as f64),
            K::F16 => a,
        },
        K::I32 => match from {
            K::F32 => f32::from_bits(a) as i32 as u32,
            K::F16 => h(a) as i32 as u32,
            _ => a,
        },
        K::U32 => match from {
            K::F32 => f32::from_bits(a) as u32,
            K::F16 => h(a) as u32,
            _ => a,
        },
        K::Bool => match from {
            K::F32 => (f32::from_bits(a) != 0.0) as u32,
            K::F16 => (h(a) != 0.0) as u32,
            _ => (a != 0) as u32,
        },
    }
}

/// A float function of one argument, rounded to the kind.
fn f1(k: K, a: u32, f32f: fn(f32) -> f32, f64f: fn(f64) -> f64) -> u32 {
    match k {
        K::F32 => f32f(f32_of(a)).to_bits(),
        _ => hw(f64f(h(a))),
    }
}

fn round_even32(x: f32) -> f32 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 {
        2.0 * (x / 2.0).round()
    } else {
        r
    }
}

fn round_even64(x: f64) -> f64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 {
        2.0 * (x / 2.0).round()
    } else {
        r
    }
}

/// A component-wise math function of up to three leaves of kind `k`.
pub fn math(fun: M, k: K, a: u32, b: u32, c: u32) -> Result<u32, Error> {
    let bad = || Error::Unsupported(format!("the math function {fun:?} on {k:?}"));
    if k.is_float() {
        return Ok(match fun {
            M::Abs => match k {
                K::F32 => a & 0x7fff_ffff,
                _ => a & 0x7fff,
            },
            M::Min => match k {
                K::F32 => f32_of(a).min(f32_of(b)).to_bits(),
                _ => hw(h(a).min(h(b))),
            },
            M::Max => match k {
                K::F32 => f32_of(a).max(f32_of(b)).to_bits(),
                _ => hw(h(a).max(h(b))),
            },
            M::Clamp => match k {
                K::F32 => f32_of(a).max(f32_of(b)).min(f32_of(c)).to_bits(),
                _ => hw(h(a).max(h(b)).min(h(c))),
            },
            M::Saturate => f1(k, a, |x| x.clamp(0.0, 1.0), |x| x.clamp(0.0, 1.0)),
            M::Cos => f1(k, a, f32::cos, f64::cos),
            M::Cosh => f1(k, a, f32::cosh, f64::cosh),
            M::Sin => f1(k, a, f32::sin, f64::sin),
            M::Sinh => f1(k, a, f32::sinh, f64::sinh),
            M::Tan => f1(k, a, f32::tan, f64::tan),
            M::Tanh => f1(k, a, f32::tanh, f64::tanh),
            M::Acos => f1(k, a, f32::acos, f64::acos),
            M::Asin => f1(k, a, f32::asin, f64::asin),
            M::Atan => f1(k, a, f32::atan, f64::atan),
            M::Asinh => f1(k, a, f32::asinh, f64::asinh),
            M::Acosh => f1(k, a, f32::acosh, f64::acosh),
            M::Atanh => f1(k, a, f32::atanh, f64::atanh),
            M::Radians => f1(k, a, f32::to_radians, f64::to_radians),
            M::Degrees => f1(k, a, f32::to_degrees, f64::to_degrees),
            M::Ceil => f1(k, a, f32::ceil, f64::ceil),
            M::Floor => f1(k, a, f32::floor, f64::floor),
            M::Round => f1(k, a, round_even32, round_even64),
            M::Fract => f1(k, a, |x| x - x.floor(), |x| x - x.floor()),
            M::Trunc => f1(k, a, f32::trunc, f64::trunc),
            M::Exp => f1(k, a, f32::exp, f64::exp),
            M::Exp2 => f1(k, a, f32::exp2, f64::exp2),
            M::Log => f1(k, a, f32::ln, f64::ln),
            M::Log2 => f1(k, a, f32::log2, f64::log2),
            M::Sqrt => f1(k, a, f32::sqrt, f64::sqrt),
            M::InverseSqrt => f1(k, a, |x| 1.0 / x.sqrt(), |x| 1.0 / x.sqrt()),
            M::Sign => f1(
                k,
                a,
                |x| {
                    if x > 0.0 {
                        1.0
                    } else if x < 0.0 {
                        -1.0
                    } else {
                        0.0
                    }
                },
                |x| {
                    if x > 0.0 {
                        1.0
                    } else if x < 0.0 {
                        -1.0
                    } else {
                        0.0
                    }
                },
            ),
            M::Atan2 => match k {
                K::F32 => f32_of(a).atan2(f32_of(b)).to_bits(),
                _ => hw(h(a).atan2(h(b))),
            },
            M::Pow => match k {
                K::F32 => f32_of(a).powf(f32_of(b)).to_bits(),
                _ => hw(h(a).powf(h(b))),
            },
            M::Step => match k {
                K::F32 => ((f32_of(b) >= f32_of(a)) as u32 as f32).to_bits(),
                _ => hw((h(b) >= h(a)) as u32 as f64),
            },
            M::Fma => match k {
                K::F32 => f32_of(a).mul_add(f32_of(b), f32_of(c)).to_bits(),
                // A product of halves is exact in f64, so one rounding of the sum to half.
                _ => hw(h(a) * h(b) + h(c)),
            },
            M::Mix => match k {
                K::F32 => {
                    let (x, y, t) = (f32_of(a), f32_of(b), f32_of(c));
                    (x * (1.0 - t) + y * t).to_bits()
                }
                _ => {
                    let (x, y, t) = (h(a), h(b), h(c));
                    let one_t = h(hw(1.0 - t));
                    let p = h(hw(x * one_t));
                    let q = h(hw(y * t));
                    hw(p + q)
                }
            },
            M::SmoothStep => match k {
                K::F32 => {
                    let (e0, e1, x) = (f32_of(a), f32_of(b), f32_of(c));
                    let t = ((x - e0) / (e1 - e0)).clamp(0.0, 1.0);
                    (t * t * (3.0 - 2.0 * t)).to_bits()
                }
                _ => {
                    let (e0, e1, x) = (h(a), h(b), h(c));
                    let t = ((x - e0) / (e1 - e0)).clamp(0.0, 1.0);
                    hw(t * t * (3.0 - 2.0 * t))
                }
            },
            M::Ldexp => match k {
                K::F32 => (f32_of(a) * 2f32.powi(b as i32)).to_bits(),
                _ => hw(h(a) * 2f64.powi(b as i32)),
            },
            _ => return Err(bad()),
        });
    }
    let signed = k == K::I32;
    Ok(match fun {
        M::Abs => {
            if signed {
                (a as i32).wrapping_abs() as u32
            } else {
                a
            }
        }
        M::Min => {
            if signed {
                (a as i32).min(b as i32) as u32
            } else {
                a.min(b)
            }
        }
        M::Max => {
            if signed {
                (a as i32).max(b as i32) as u32
            } else {
                a.max(b)
            }
        }
        M::Clamp => {
            if signed {
                (a as i32).max(b as i32).min(c as i32) as u32
            } else {
                a.max(b).min(c)
            }
        }
        M::Sign if signed => (a as i32).signum() as u32,
        M::CountTrailingZeros => a.trailing_zeros(),
        M::CountLeadingZeros => a.leading_zeros(),
        M::CountOneBits => a.count_ones(),
        M::ReverseBits => a.reverse_bits(),
        M::FirstTrailingBit => {
            if a == 0 {
                u32::MAX
            } else {
                a.trailing_zeros()
            }
        }
        M::FirstLeadingBit => {
            let x = if signed && (a as i32) < 0 { !a } else { a };
            if x == 0 {
                u32::MAX
            } else {
                31 - x.leading_zeros()
            }
        }
        M::ExtractBits => {
            let offset = b.min(32);
            let count = c.min(32 - offset);
            if count == 0 {
                0
            } else if signed {
                let shifted = ((a as i32) << (32 - offset - count)) >> (32 - count);
                shifted as u32
            } else {
                (a >> offset) & (u32::MAX >> (32 - count))
            }
        }
        _ => return Err(bad()),
    })
}

/// `insertBits(e, newbits, offset, count)`.
pub fn insert_bits(e: u32, nb: u32, offset: u32, count: u32) -> u32 {
    let offset = offset.min(32);
    let count = count.min(32 - offset);
    if count == 0 {
        return e;
    }
    let mask = (u32::MAX >> (32 - count)) << offset;
    (e & !mask) | ((nb << offset) & mask)
}
