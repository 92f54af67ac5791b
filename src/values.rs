//! Checks on the values of host arrays that every entry point makes on what it is given (the
//! op, tensors, decoding, the reference), below all of them: NaN and infinities, and f16's
//! range for operands stored as f16.

use ndarray::{ArrayViewD, Dimension};

use crate::error::{Error, Result};

/// f16's largest finite value.
const F16_MAX: f32 = 65504.0;

/// `Err(NonFinite)` naming the array and the first NaN or infinity in it.
///
/// # Errors
/// [`Error::NonFinite`] with the array's `name`, the value and its index.
pub fn check_finite<D: ndarray::Dimension>(
    name: &str,
    a: &ndarray::ArrayView<'_, f32, D>,
) -> Result<()> {
    // The common case first: a plain scan (indexing a dynamic-dimension view per element
    // costs ~30 ns, 8 ms for a 4096 × 64 X).
    let all_finite = match a.as_slice_memory_order() {
        Some(s) => s.iter().all(|v| v.is_finite()),
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
    let out_of_range = |v: &f32| v.is_finite() && v.abs() > F16_MAX;
    if let Some((idx, v)) = a.indexed_iter().find(|(_, v)| out_of_range(v)) {
        return Err(Error::invalid(
            "input",
            format!(
                "{name}{:?} = {v:e} is beyond f16's range (±{F16_MAX}); use f32",
                idx.slice()
            ),
        ));
    }
    Ok(())
}
