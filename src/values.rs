//! Checks on the values of host arrays that every entry point makes on what it is given (the
//! op, tensors, decoding, the reference), below all of them: NaN and infinities, and f16's
//! range for operands stored as f16.

use ndarray::{ArrayViewD, Dimension};

use crate::dtype::Dtype;
use crate::error::{Error, Result};

/// f16's largest finite value.
const F16_MAX: f32 = 65504.0;

/// Values scanned per step of the vectorised checks: small enough to stay in L1 while a copy
/// reads the same values again, large enough that the scan's branch is rare.
pub(crate) const CHUNK: usize = 4096;

/// How many threads a host pass over `bytes` of memory gets: one below 4 MiB (a thread costs
/// tens of microseconds to start), else up to the cores there are (at most 8). Copies into
/// fresh memory are bound by the page faults of first touch as much as by bandwidth, and
/// both scale with cores. One in the browser.
pub(crate) fn threads_for(bytes: usize) -> usize {
    if cfg!(target_arch = "wasm32") || bytes < (4 << 20) {
        return 1;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
}

/// The largest `|v|` bit pattern (sign cleared) in `s`, in one branch-free pass the compiler
/// vectorises (an `all(is_finite)` stops early and so cannot be).
#[inline]
fn max_magnitude_bits(s: &[f32]) -> u32 {
    s.iter()
        .map(|v| v.to_bits() & 0x7fff_ffff)
        .fold(0, u32::max)
}

/// The index of the first NaN or infinity in `s`, chunk by chunk without early exits inside a
/// chunk (vectorised).
pub(crate) fn first_non_finite(s: &[f32]) -> Option<usize> {
    const INF: u32 = 0x7f80_0000;
    s.chunks(CHUNK).enumerate().find_map(|(c, chunk)| {
        (max_magnitude_bits(chunk) >= INF)
            .then(|| chunk.iter().position(|v| !v.is_finite()))
            .flatten()
            .map(|i| c * CHUNK + i)
    })
}

/// The index of the first value of `s` that is finite and past f16's range (±65,504).
pub(crate) fn first_past_f16(s: &[f32]) -> Option<usize> {
    let max = F16_MAX.to_bits();
    s.chunks(CHUNK).enumerate().find_map(|(c, chunk)| {
        (max_magnitude_bits(chunk) > max)
            .then(|| {
                chunk
                    .iter()
                    .position(|v| v.is_finite() && v.abs() > F16_MAX)
            })
            .flatten()
            .map(|i| c * CHUNK + i)
    })
}

/// The `(row-major) index`-th position of an array of `shape`, as an index per axis.
pub(crate) fn unravel(mut index: usize, shape: &[usize]) -> Vec<usize> {
    let mut at = vec![0; shape.len()];
    for (slot, &n) in at.iter_mut().zip(shape).rev() {
        *slot = index % n.max(1);
        index /= n.max(1);
    }
    at
}

/// [`Error::NonFinite`] for the value at row-major position `index` of `a`.
pub(crate) fn non_finite_at(name: &str, shape: &[usize], index: usize, value: f32) -> Error {
    Error::NonFinite {
        array: name.to_string(),
        value,
        index: unravel(index, shape),
    }
}

/// The error for a value past f16's range at `index` (one per axis).
pub(crate) fn past_f16(name: &str, index: &[usize], value: f32) -> Error {
    Error::invalid(
        "input",
        format!("{name}{index:?} = {value:e} is beyond f16's range (±{F16_MAX}); use f32"),
    )
}

/// `Err(Overflow)` at the first NaN or infinity of `values`, the result `what` computed in
/// `dtype`: finite inputs give finite results unless the arithmetic overflowed.
pub(crate) fn check_overflow(what: &str, dtype: Dtype, values: &[f32]) -> Result<()> {
    overflow_at(what, dtype, first_non_finite(values))
}

/// `Err(Overflow)` when a scan of the result `what` found a NaN or infinity at `index`.
pub(crate) fn overflow_at(what: &str, dtype: Dtype, index: Option<usize>) -> Result<()> {
    match index {
        Some(index) => Err(Error::Overflow {
            what: what.into(),
            dtype,
            index,
        }),
        None => Ok(()),
    }
}

/// `Err(NonFinite)` naming the array and the first NaN or infinity in it.
///
/// # Errors
/// [`Error::NonFinite`] with the array's `name`, the value and its index.
pub fn check_finite<D: ndarray::Dimension>(
    name: &str,
    a: &ndarray::ArrayView<'_, f32, D>,
) -> Result<()> {
    // The common case first: a vectorised scan of contiguous memory (indexing a
    // dynamic-dimension view per element costs ~30 ns, 8 ms for a 4096 × 64 X).
    if let Some(s) = a.as_slice() {
        return match first_non_finite(s) {
            Some(i) => Err(non_finite_at(name, a.shape(), i, s[i])),
            None => Ok(()),
        };
    }
    let all_finite = match a.as_slice_memory_order() {
        Some(s) => first_non_finite(s).is_none(),
        None => a.iter().all(|v| v.is_finite()),
    };
    if all_finite {
        return Ok(());
    }
    match a.indexed_iter().find(|(_, v)| !v.is_finite()) {
        None => Ok(()),
        Some((idx, v)) => Err(Error::NonFinite {
            array: name.to_string(),
            value: *v,
            index: ndarray::IntoDimension::into_dimension(idx)
                .as_array_view()
                .to_vec(),
        }),
    }
}

/// `Err` naming the array and the first finite value past f16's range (±65,504) in it.
pub(crate) fn check_f16_range(name: &str, a: &ArrayViewD<'_, f32>) -> Result<()> {
    if let Some(s) = a.as_slice() {
        return match first_past_f16(s) {
            Some(i) => Err(past_f16(name, &unravel(i, a.shape()), s[i])),
            None => Ok(()),
        };
    }
    let out_of_range = |v: &f32| v.is_finite() && v.abs() > F16_MAX;
    if let Some((idx, v)) = a.indexed_iter().find(|(_, v)| out_of_range(v)) {
        return Err(past_f16(name, idx.slice(), *v));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vectorised_scans_find_the_first_bad_value_in_any_chunk() {
        for at in [0, 1, CHUNK - 1, CHUNK, 3 * CHUNK + 17] {
            let mut v = vec![1.0f32; 4 * CHUNK];
            v[at] = f32::NAN;
            v[at + 5] = f32::INFINITY;
            assert_eq!(first_non_finite(&v), Some(at));
            assert_eq!(
                first_past_f16(&v),
                None,
                "NaN and inf are not past f16's range"
            );
            v[at + 3] = -70000.0;
            assert_eq!(first_past_f16(&v), Some(at + 3));
        }
        assert_eq!(first_non_finite(&[f32::MAX, -0.0, f32::MIN_POSITIVE]), None);
        assert_eq!(first_past_f16(&[65504.0, -65504.0]), None);
        assert_eq!(unravel(7, &[2, 3, 2]), vec![1, 0, 1]);
    }
}
