//! `.npy` files in and out. Arrays are read as float16, float32 or float64 (converted to
//! f32); masks also as bool; lengths as any integer dtype. Anything else is an error that
//! names the file and what it holds. Written files are float32 (or float16), readable by
//! NumPy (`np.load`) and PyTorch (`torch.from_numpy(np.load(...))`).
//!
//! Each reader is a parser over the file's bytes (`parse`, `parse_mask`, `parse_lengths`)
//! behind a function that reads the file, so the fuzz targets (`tests/fuzz`) exercise exactly
//! what the CLI runs.

use std::path::Path;

use ndarray::ArrayD;
use ndarray_npy::{ReadNpyError, ReadNpyExt, ReadableElement, WriteNpyExt};

use crate::error::{Error, Result};

mod direct;
mod opened;

pub use opened::Opened;

/// What a parser found wrong, without the file name.
type Parsed<T> = std::result::Result<T, String>;

fn load(path: &Path) -> Result<Vec<u8>> {
    let _io = direct::clock();
    std::fs::read(path).map_err(|e| Error::io(path, format!("cannot read: {e}")))
}

/// Wall time this process has spent reading and writing `.npy` files through this module:
/// the `io` phase of the CLI's `--timings`.
pub fn io_time() -> std::time::Duration {
    direct::io_time()
}

/// Reads a float16, float32 or float64 `.npy` file as f32. A little-endian, C-order file (what
/// NumPy and PyTorch write) is read straight into the returned array's memory (float32), or
/// widened into it as it is read (float16, float64): one pass, on several threads when large.
///
/// # Errors
/// [`Error::Io`] naming the path when the file is missing, unreadable, not an `.npy`, of
/// another dtype, or truncated.
pub fn read(path: &Path) -> Result<ArrayD<f32>> {
    let fast = {
        let _io = direct::clock();
        let file =
            std::fs::File::open(path).map_err(|e| Error::io(path, format!("cannot read: {e}")))?;
        direct::read(&file).map_err(|e| Error::io(path, format!("cannot read: {e}")))?
    };
    match fast {
        Some(a) => Ok(a),
        None => parse(&load(path)?).map_err(|m| Error::io(path, m)),
    }
}

/// Parses the bytes of a float16, float32 or float64 `.npy` file as f32.
///
/// # Errors
/// The message [`read`] would put in its [`Error::Io`] (without the path): no NumPy header,
/// a header longer than the bytes, another dtype, or truncated data.
pub fn parse(bytes: &[u8]) -> Parsed<ArrayD<f32>> {
    check_header(bytes)?;
    match typed::<f32>(bytes) {
        Ok(a) => Ok(a),
        Err(ReadNpyError::WrongDescriptor(_)) => match typed::<f64>(bytes) {
            Ok(a) => Ok(a.mapv(|v| v as f32)),
            Err(ReadNpyError::WrongDescriptor(descr)) if descr.to_string().contains("f2") => {
                parse_f16(bytes)
            }
            Err(ReadNpyError::WrongDescriptor(descr)) => Err(format!(
                "unsupported dtype {descr}: expected a float16, float32 or float64 .npy"
            )),
            Err(e) => Err(describe(e)),
        },
        Err(e) => Err(describe(e)),
    }
}

fn typed<T: ReadableElement>(bytes: &[u8]) -> std::result::Result<ArrayD<T>, ReadNpyError> {
    ArrayD::<T>::read_npy(bytes)
}

/// The header length an `.npy` declares fits in the bytes there are. (ndarray-npy allocates
/// the declared length before reading it: a 100-byte file claiming a 3.5 GB header made the
/// fuzzer run out of memory.)
fn check_header(bytes: &[u8]) -> Parsed<()> {
    const MAGIC: &[u8] = b"\x93NUMPY";
    if bytes.len() < 10 || !bytes.starts_with(MAGIC) {
        return Err("not a valid .npy file: no NumPy header".into());
    }
    let (len, start) = match bytes[6] {
        1 => (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
        2 | 3 if bytes.len() >= 12 => {
            let l = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
            (usize::try_from(l).unwrap_or(usize::MAX), 12)
        }
        v => return Err(format!("not a valid .npy file: unknown format version {v}")),
    };
    if len > bytes.len() - start {
        return Err(format!(
            "not a valid .npy file: its header claims {len} bytes, the file has {}",
            bytes.len()
        ));
    }
    Ok(())
}

/// A mask as read from a `.npy` file: boolean (`true` = attend) or float (added to the
/// scores).
#[derive(Debug, Clone)]
pub enum MaskArray {
    /// A bool `.npy`.
    Bool(ArrayD<bool>),
    /// A float16, float32 or float64 `.npy`.
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

/// Reads a mask: a bool, float16, float32 or float64 `.npy` file.
///
/// # Errors
/// [`Error::Io`] naming the path when the file is missing, unreadable, not an `.npy`, of
/// another dtype, or truncated.
pub fn read_mask(path: &Path) -> Result<MaskArray> {
    parse_mask(&load(path)?).map_err(|m| Error::io(path, m))
}

/// Parses the bytes of a mask `.npy` (bool, float16, float32 or float64).
///
/// # Errors
/// The message [`read_mask`] would put in its [`Error::Io`] (without the path): as
/// [`parse`], with bool also accepted.
pub fn parse_mask(bytes: &[u8]) -> Parsed<MaskArray> {
    check_header(bytes)?;
    match typed::<bool>(bytes) {
        Ok(a) => Ok(MaskArray::Bool(a)),
        Err(ReadNpyError::WrongDescriptor(_)) => parse(bytes)
            .map(MaskArray::Float)
            .map_err(|m| m.replace("a float16,", "a bool, float16,")),
        Err(e) => Err(describe(e)),
    }
}

/// Reads per-sequence lengths: a 1-D `.npy` of any integer dtype, no value negative.
///
/// # Errors
/// [`Error::Io`] naming the path when the file is unreadable, not integer, not 1-D, or holds a
/// negative length.
pub fn read_lengths(path: &Path) -> Result<Vec<usize>> {
    parse_lengths(&load(path)?).map_err(|m| Error::io(path, m))
}

/// Parses the bytes of a lengths `.npy` (1-D, any integer dtype, none negative).
///
/// # Errors
/// The message [`read_lengths`] would put in its [`Error::Io`] (without the path): no NumPy
/// header, a header longer than the bytes, a non-integer dtype, not 1-D, a negative length,
/// or truncated data.
pub fn parse_lengths(bytes: &[u8]) -> Parsed<Vec<usize>> {
    let a = parse_ints(bytes)?;
    if a.ndim() != 1 {
        return Err(format!(
            "expected a 1-D array of lengths, found {} axes",
            a.ndim()
        ));
    }
    a.iter()
        .enumerate()
        .map(|(i, &len)| {
            usize::try_from(len).map_err(|_| format!("length [{i}] = {len} is not a valid length"))
        })
        .collect()
}

/// Reads an integer `.npy` of any shape and integer dtype (document ids, a modifier's
/// `array<i32>`), as i64.
///
/// # Errors
/// [`Error::Io`] naming the path when the file is unreadable, not integer, or holds a value
/// past i64.
pub fn read_ints(path: &Path) -> Result<ArrayD<i64>> {
    parse_ints(&load(path)?).map_err(|m| Error::io(path, m))
}

/// Parses the bytes of an integer `.npy` of any shape and integer dtype.
///
/// # Errors
/// The message [`read_ints`] would put in its [`Error::Io`] (without the path).
pub fn parse_ints(bytes: &[u8]) -> Parsed<ArrayD<i64>> {
    type Read = std::result::Result<ArrayD<i128>, ReadNpyError>;
    fn try_read<T>(bytes: &[u8]) -> Read
    where
        T: ReadableElement + Copy + Into<i128>,
    {
        typed::<T>(bytes).map(|a| a.mapv(Into::into))
    }
    check_header(bytes)?;
    let readers: [fn(&[u8]) -> Read; 8] = [
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
        match reader(bytes) {
            Ok(a) => {
                if let Some(v) = a.iter().find(|&&v| i64::try_from(v).is_err()) {
                    return Err(format!("value {v} does not fit in 64 bits"));
                }
                return Ok(a.mapv(|v| v as i64));
            }
            Err(ReadNpyError::WrongDescriptor(d)) => last = Some(d),
            Err(e) => return Err(describe(e)),
        }
    }
    Err(format!(
        "unsupported dtype {}: expected an integer .npy",
        last.map(|d| d.to_string()).unwrap_or_default()
    ))
}

fn describe(e: ReadNpyError) -> String {
    match e {
        ReadNpyError::Io(io) => format!("cannot read: {io}"),
        ReadNpyError::ParseHeader(h) => format!("not a valid .npy file: {h}"),
        other => format!("invalid .npy data: {other}"),
    }
}

/// A float16 `.npy` (NumPy's `<f2`), widened to f32.
fn parse_f16(bytes: &[u8]) -> Parsed<ArrayD<f32>> {
    let npy = npyz::NpyFile::new(bytes).map_err(|e| format!("not a valid .npy file: {e}"))?;
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let fortran = npy.order() == npyz::Order::Fortran;
    // A header may claim more elements than the file holds: check before allocating.
    let count = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= bytes.len() / 2)
        .ok_or_else(|| format!("invalid float16 data: shape {shape:?} does not fit the file"))?;
    let values: Vec<f32> = npy
        .into_vec::<half::f16>()
        .map_err(|e| format!("invalid float16 data: {e}"))?
        .into_iter()
        .map(half::f16::to_f32)
        .collect();
    if values.len() != count {
        return Err(format!(
            "invalid float16 data: {} values for shape {shape:?}",
            values.len()
        ));
    }
    let a = if fortran {
        let reversed: Vec<usize> = shape.iter().rev().copied().collect();
        ArrayD::from_shape_vec(reversed, values).map(|a| a.reversed_axes())
    } else {
        ArrayD::from_shape_vec(shape, values)
    };
    a.map_err(|e| format!("invalid float16 data: {e}"))
}

/// Writes an f32 array as a float16 `.npy` file (each value rounded to the nearest f16),
/// converted a chunk at a time on its way to the file.
///
/// # Errors
/// [`Error::Io`] naming the path when the file cannot be created or written.
pub fn write_f16(path: &Path, a: &ArrayD<f32>) -> Result<()> {
    let _io = direct::clock();
    let file =
        std::fs::File::create(path).map_err(|e| Error::io(path, format!("cannot create: {e}")))?;
    let a = a.as_standard_layout();
    let values = a.as_slice().unwrap_or_default();
    direct::write_f16(file, a.shape(), values)
        .map_err(|e| Error::io(path, format!("cannot write: {e}")))
}

/// Writes an f32 array as a float32 `.npy` file.
///
/// # Errors
/// [`Error::Io`] naming the path when the file cannot be created or written.
pub fn write(path: &Path, a: &ArrayD<f32>) -> Result<()> {
    let _io = direct::clock();
    let file =
        std::fs::File::create(path).map_err(|e| Error::io(path, format!("cannot create: {e}")))?;
    let a = a.as_standard_layout();
    let fail = |e: std::io::Error| Error::io(path, format!("cannot write: {e}"));
    // The values' bytes in one write where they are little-endian already.
    let values = a.as_slice().unwrap_or_default();
    match direct::write_f32(&file, a.shape(), values) {
        Some(written) => written.map_err(fail),
        None => a
            .write_npy(std::io::BufWriter::new(file))
            .map_err(|e| Error::io(path, format!("cannot write: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_longer_than_the_file_is_an_error_not_an_allocation() {
        // The fuzzer's find (tests/fuzz/regressions/npy/oom-header-length): version 3, a
        // header length of 0xd47b0076 bytes in a 76-byte file.
        let bytes = include_bytes!("../tests/fuzz/regressions/npy/oom-header-length");
        for e in [
            parse(bytes).unwrap_err(),
            parse_mask(bytes).map(|_| ()).unwrap_err(),
            parse_lengths(bytes).map(|_| ()).unwrap_err(),
        ] {
            assert!(e.contains("header claims"), "{e}");
        }
        assert!(parse(b"short").unwrap_err().contains("no NumPy header"));
    }
}
