//! `.npy` files in and out: float32 read as is, float64 converted; masks also as bool, lengths
//! as any integer dtype; anything else is an error that names the file and what it holds. Written files are float32, readable by NumPy
//! (`np.load`) and PyTorch (`torch.from_numpy(np.load(...))`).

use std::path::Path;

use ndarray::ArrayD;
use ndarray_npy::{ReadNpyError, WriteNpyExt};

use crate::error::{Error, Result};

/// Reads a float16, float32 or float64 `.npy` file as f32.
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
                Err(ReadNpyError::WrongDescriptor(descr)) if descr.to_string().contains("f2") => {
                    read_f16(path)
                }
                Err(ReadNpyError::WrongDescriptor(descr)) => Err(Error::io(
                    path,
                    format!(
                        "unsupported dtype {descr}: expected a float16, float32 or float64 .npy"
                    ),
                )),
                Err(e) => Err(describe(path, e)),
            }
        }
        Err(e) => Err(describe(path, e)),
    }
}

/// A mask as read from a `.npy` file: boolean (`true` = attend) or float (added to the
/// scores).
#[derive(Debug, Clone)]
pub enum MaskArray {
    /// A bool `.npy`.
    Bool(ArrayD<bool>),
    /// A float32 or float64 `.npy`.
    Float(ArrayD<f32>),
}

impl MaskArray {
    /// The mask over this array (see [`crate::mask`]).
    pub fn mask(&self) -> crate::mask::Mask<'_> {
        match self {
            MaskArray::Bool(m) => crate::mask::Mask::boolean(m.view()),
            MaskArray::Float(m) => crate::mask::Mask::additive(m.view()),
        }
    }
}

/// Reads a mask: a bool, float32 or float64 `.npy` file.
///
/// # Errors
/// [`Error::Io`] naming the path when the file is unreadable or of another dtype.
pub fn read_mask(path: &Path) -> Result<MaskArray> {
    match ndarray_npy::read_npy::<_, ArrayD<bool>>(path) {
        Ok(a) => Ok(MaskArray::Bool(a)),
        Err(ReadNpyError::WrongDescriptor(_)) => match read(path) {
            Ok(f) => Ok(MaskArray::Float(f)),
            Err(Error::Io { message, .. }) if message.starts_with("unsupported dtype") => {
                Err(Error::io(
                    path,
                    message.replace(
                        "a float16, float32 or float64",
                        "a bool, float16, float32 or float64",
                    ),
                ))
            }
            Err(e) => Err(e),
        },
        Err(e) => Err(describe(path, e)),
    }
}

/// Reads per-sequence lengths: a 1-D `.npy` of any integer dtype, no value negative.
///
/// # Errors
/// [`Error::Io`] naming the path when the file is unreadable, not integer, not 1-D, or holds a
/// negative length.
pub fn read_lengths(path: &Path) -> Result<Vec<usize>> {
    /// The array's number of axes and its values.
    type Read = std::result::Result<(usize, Vec<i128>), ReadNpyError>;
    fn try_read<T>(path: &Path) -> Read
    where
        T: ndarray_npy::ReadableElement + Copy + Into<i128>,
    {
        ndarray_npy::read_npy::<_, ArrayD<T>>(path)
            .map(|a| (a.ndim(), a.iter().map(|&v| v.into()).collect()))
    }
    let readers: [fn(&Path) -> Read; 8] = [
        try_read::<i64>,
        try_read::<i32>,
        try_read::<u64>,
        try_read::<u32>,
        try_read::<i16>,
        try_read::<u16>,
        try_read::<i8>,
        try_read::<u8>,
    ];
    let mut last = None;
    for reader in readers {
        match reader(path) {
            Ok((ndim, v)) => {
                if ndim != 1 {
                    return Err(Error::io(
                        path,
                        format!("expected a 1-D array of lengths, found {ndim} axes"),
                    ));
                }
                return v
                    .iter()
                    .enumerate()
                    .map(|(i, &len)| {
                        usize::try_from(len).map_err(|_| {
                            Error::io(path, format!("length [{i}] = {len} is not a valid length"))
                        })
                    })
                    .collect();
            }
            Err(ReadNpyError::WrongDescriptor(d)) => last = Some(d),
            Err(e) => return Err(describe(path, e)),
        }
    }
    Err(Error::io(
        path,
        format!(
            "unsupported dtype {}: expected an integer .npy",
            last.map(|d| d.to_string()).unwrap_or_default()
        ),
    ))
}

fn describe(path: &Path, e: ReadNpyError) -> Error {
    match e {
        ReadNpyError::Io(io) => Error::io(path, format!("cannot read: {io}")),
        ReadNpyError::ParseHeader(h) => Error::io(path, format!("not a valid .npy file: {h}")),
        other => Error::io(path, format!("invalid .npy data: {other}")),
    }
}

/// A float16 `.npy` (NumPy's `<f2`), widened to f32.
fn read_f16(path: &Path) -> Result<ArrayD<f32>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, format!("cannot read: {e}")))?;
    let npy = npyz::NpyFile::new(&bytes[..])
        .map_err(|e| Error::io(path, format!("not a valid .npy file: {e}")))?;
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let fortran = npy.order() == npyz::Order::Fortran;
    let values: Vec<f32> = npy
        .into_vec::<half::f16>()
        .map_err(|e| Error::io(path, format!("invalid float16 data: {e}")))?
        .into_iter()
        .map(half::f16::to_f32)
        .collect();
    let a = if fortran {
        let reversed: Vec<usize> = shape.iter().rev().copied().collect();
        ArrayD::from_shape_vec(reversed, values).map(|a| a.reversed_axes())
    } else {
        ArrayD::from_shape_vec(shape, values)
    };
    a.map_err(|e| Error::io(path, format!("invalid float16 data: {e}")))
}

/// Writes an f32 array as a float16 `.npy` file (each value rounded to the nearest f16).
///
/// # Errors
/// [`Error::Io`] naming the path.
pub fn write_f16(path: &Path, a: &ArrayD<f32>) -> Result<()> {
    use npyz::WriterBuilder;
    let fail = |e: std::io::Error| Error::io(path, format!("cannot write: {e}"));
    let file =
        std::fs::File::create(path).map_err(|e| Error::io(path, format!("cannot create: {e}")))?;
    let shape: Vec<u64> = a.shape().iter().map(|&d| d as u64).collect();
    let mut writer = npyz::WriteOptions::<half::f16>::new()
        .default_dtype()
        .shape(&shape)
        .writer(std::io::BufWriter::new(file))
        .begin_nd()
        .map_err(fail)?;
    writer
        .extend(a.iter().map(|&v| half::f16::from_f32(v)))
        .map_err(fail)?;
    writer.finish().map_err(fail)
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
