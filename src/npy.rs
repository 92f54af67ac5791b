//! `.npy` files in and out: float32 read as is, float64 converted; anything else is an error
//! that names the file and what it holds. Written files are float32, readable by NumPy
//! (`np.load`) and PyTorch (`torch.from_numpy(np.load(...))`).

use std::path::Path;

use ndarray::ArrayD;
use ndarray_npy::{ReadNpyError, WriteNpyExt};

use crate::error::{Error, Result};

/// Reads a float32 or float64 `.npy` file as f32.
///
/// # Errors
/// [`Error::Io`] naming the path when the file is missing, unreadable, not an `.npy`, of
/// another dtype, or truncated.
pub fn read(path: &Path) -> Result<ArrayD<f32>> {
    match ndarray_npy::read_npy::<_, ArrayD<f32>>(path) {
        Ok(a) => Ok(a),
        Err(ReadNpyError::WrongDescriptor(_)) => {
            match ndarray_npy::read_npy::<_, ArrayD<f64>>(path) {
                Ok(a) => Ok(a.mapv(|v| v as f32)),
                Err(ReadNpyError::WrongDescriptor(descr)) => Err(Error::io(
                    path,
                    format!("unsupported dtype {descr}: expected a float32 or float64 .npy"),
                )),
                Err(e) => Err(describe(path, e)),
            }
        }
        Err(e) => Err(describe(path, e)),
    }
}

fn describe(path: &Path, e: ReadNpyError) -> Error {
    match e {
        ReadNpyError::Io(io) => Error::io(path, format!("cannot read: {io}")),
        ReadNpyError::ParseHeader(h) => Error::io(path, format!("not a valid .npy file: {h}")),
        other => Error::io(path, format!("invalid .npy data: {other}")),
    }
}

/// Writes an f32 array as a float32 `.npy` file.
///
/// # Errors
/// [`Error::Io`] naming the path.
pub fn write(path: &Path, a: &ArrayD<f32>) -> Result<()> {
    let file =
        std::fs::File::create(path).map_err(|e| Error::io(path, format!("cannot create: {e}")))?;
    let a = a.as_standard_layout();
    a.write_npy(std::io::BufWriter::new(file))
        .map_err(|e| Error::io(path, format!("cannot write: {e}")))
}
