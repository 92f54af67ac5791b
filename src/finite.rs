//! NaN and infinities in host arrays: the check every entry point makes on what it is given
//! (the op, tensors, decoding, the reference), below all of them.

use crate::error::{Error, Result};

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
