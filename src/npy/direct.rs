//! `.npy` data in one pass: the common files (little-endian float16/32/64 in C order, as NumPy
//! and PyTorch write them) read straight into the array's final memory, float32 by the kernel
//! itself (`pread` into the array), float16 and float64 widened a chunk at a time as they are
//! read; large files on several threads, each its own part of the file. float16 files are
//! written the same way. Anything else (another byte order, Fortran order, a header or
//! length that does not add up) is left to the general parser, which says what is wrong.
//! The time spent here is this process's `io` phase.

use std::fs::File;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ndarray::ArrayD;

use crate::values::{threads_for, CHUNK};

static IO_NANOS: AtomicU64 = AtomicU64::new(0);

/// Counts its lifetime as `.npy` I/O.
pub(super) struct Clock(Instant);

impl Drop for Clock {
    fn drop(&mut self) {
        let nanos = u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        IO_NANOS.fetch_add(nanos, Ordering::Relaxed);
    }
}

/// Starts counting `.npy` I/O until the guard drops.
pub(super) fn clock() -> Clock {
    Clock(Instant::now())
}

/// The `.npy` I/O counted so far in this process.
pub(super) fn io_time() -> Duration {
    Duration::from_nanos(IO_NANOS.load(Ordering::Relaxed))
}

/// Bytes per value of the dtypes read here.
#[cfg(unix)]
fn element_size(descr: &str) -> Option<usize> {
    match descr {
        "<f2" => Some(2),
        "<f4" => Some(4),
        "<f8" => Some(8),
        _ => None,
    }
}

/// Where the values of a common file are: `shape`, `elem` bytes each from byte `data` on.
#[derive(Debug, Clone)]
#[cfg_attr(not(unix), allow(dead_code))]
pub(super) struct Header {
    pub shape: Vec<usize>,
    pub elem: usize,
    pub data: u64,
}

impl Header {
    /// The number of values.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The header of `file` when it is one of the common kinds (and its length adds up), `None`
/// to leave it to the general parser.
///
/// # Errors
/// A read that fails part way.
#[cfg(unix)]
pub(super) fn read_header(file: &File) -> io::Result<Option<Header>> {
    use std::os::unix::fs::FileExt;
    let size = file.metadata()?.len();
    let mut pre = [0u8; 12];
    if size < 12 || file.read_exact_at(&mut pre, 0).is_err() || &pre[..6] != b"\x93NUMPY" {
        return Ok(None);
    }
    let (len, start) = match pre[6] {
        1 => (u64::from(u16::from_le_bytes([pre[8], pre[9]])), 10),
        2 | 3 => (
            u64::from(u32::from_le_bytes([pre[8], pre[9], pre[10], pre[11]])),
            12,
        ),
        _ => return Ok(None),
    };
    let data = start + len;
    if data > size {
        return Ok(None);
    }
    let mut head = vec![0u8; data as usize];
    file.read_exact_at(&mut head, 0)?;
    let Ok(npy) = npyz::NpyFile::new(&head[..]) else {
        return Ok(None);
    };
    let npyz::DType::Plain(ts) = npy.dtype() else {
        return Ok(None);
    };
    let Some(elem) = element_size(&ts.to_string()) else {
        return Ok(None);
    };
    if npy.order() != npyz::Order::C {
        return Ok(None);
    }
    let Ok(shape) = npy
        .shape()
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<Vec<usize>, _>>()
    else {
        return Ok(None);
    };
    let count = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    let fits = count
        .and_then(|n| n.checked_mul(elem))
        .is_some_and(|bytes| data.checked_add(bytes as u64) == Some(size));
    Ok(fits.then_some(Header { shape, elem, data }))
}

/// Elsewhere the general parser reads every file.
#[cfg(not(unix))]
pub(super) fn read_header(_file: &File) -> io::Result<Option<Header>> {
    Ok(None)
}

/// The array in `file` when it is one of the common kinds, `None` to leave it to the
/// general parser.
///
/// # Errors
/// A read that fails part way.
pub(super) fn read(file: &File) -> io::Result<Option<ArrayD<f32>>> {
    read_header(file)?.map(|h| values(file, &h)).transpose()
}

/// All of `h`'s values from `file`, as an f32 array of its shape.
///
/// # Errors
/// A read that fails part way.
pub(super) fn values(file: &File, h: &Header) -> io::Result<ArrayD<f32>> {
    // Zeroed by the allocator (fresh pages from the OS when large: no pass of ours).
    let mut values = vec![0f32; h.len()];
    fill(file, h, &mut values)?;
    ArrayD::from_shape_vec(h.shape.clone(), values).map_err(io::Error::other)
}

/// Reads all of `h`'s values from `file` into `out`, widened to f32, in parts on several
/// threads when large.
fn fill(file: &File, h: &Header, out: &mut [f32]) -> io::Result<()> {
    let threads = threads_for(out.len() * 4);
    let per = out
        .len()
        .div_ceil(threads)
        .next_multiple_of(CHUNK)
        .max(CHUNK);
    let part = |index: usize, dst: &mut [f32]| -> io::Result<()> {
        read_at(file, h, index * per, dst, &mut Vec::new())
    };
    if threads == 1 {
        return part(0, out);
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = out
            .chunks_mut(per)
            .enumerate()
            .map(|(i, d)| scope.spawn(move || part(i, d)))
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| io::Error::other("a reading thread panicked"))??;
        }
        Ok(())
    })
}

/// Reads `out.len()` of `h`'s values from value `first` on into `out`, widened to f32 a
/// chunk at a time through `scratch` (float16 and float64; float32 straight into `out`).
/// Without `pread` (not unix) never called: every file goes to the general parser there.
///
/// # Errors
/// A read that fails, or a range past the file's values.
pub(super) fn read_at(
    file: &File,
    h: &Header,
    first: usize,
    out: &mut [f32],
    scratch: &mut Vec<u64>,
) -> io::Result<()> {
    if first + out.len() > h.len() {
        return Err(io::Error::other("internal: a read past the values"));
    }
    #[cfg(not(unix))]
    {
        let _ = (file, scratch);
        Err(io::Error::other("not read directly on this platform"))
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        let mut from = h.data + (first * h.elem) as u64;
        if h.elem == 4 {
            return file.read_exact_at(bytemuck::cast_slice_mut(out), from);
        }
        // u64s: aligned for the f16 and f64 views of the bytes read (CHUNK of them hold a
        // chunk of f64s).
        scratch.resize(CHUNK, 0);
        for d in out.chunks_mut(CHUNK) {
            let words = &mut scratch[..(d.len() * h.elem).div_ceil(8)];
            let bytes = &mut bytemuck::cast_slice_mut::<u64, u8>(words)[..d.len() * h.elem];
            file.read_exact_at(bytes, from)?;
            if h.elem == 2 {
                let halves: &[half::f16] = bytemuck::cast_slice(bytes);
                half::slice::HalfFloatSliceExt::convert_to_f32_slice(halves, d);
            } else {
                let doubles: &[f64] = bytemuck::cast_slice(bytes);
                for (o, v) in d.iter_mut().zip(doubles) {
                    *o = *v as f32;
                }
            }
            from += (d.len() * h.elem) as u64;
        }
        Ok(())
    }
}

/// The header of a version 1.0 `.npy` of `descr` values in C order and `shape`, padded so
/// the data starts at a multiple of 64 bytes.
fn header(descr: &str, shape: &[usize]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
    let tuple = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {tuple}, }}");
    let used = 10 + dict.len() + 1;
    dict.push_str(&" ".repeat(used.next_multiple_of(64) - used));
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

/// Writes `values` (row-major, of `shape`) as a float16 `.npy` to `file`, each rounded to the
/// nearest f16 a chunk at a time.
///
/// # Errors
/// A failed write.
pub(super) fn write_f16(file: File, shape: &[usize], values: &[f32]) -> io::Result<()> {
    let mut out = io::BufWriter::with_capacity(1 << 16, file);
    out.write_all(&header("<f2", shape))?;
    let mut halves = vec![half::f16::ZERO; CHUNK];
    for chunk in values.chunks(CHUNK) {
        let h = &mut halves[..chunk.len()];
        half::slice::HalfFloatSliceExt::convert_from_f32_slice(h, chunk);
        out.write_all(bytemuck::cast_slice(h))?;
    }
    out.flush()
}

/// Writes `values` (row-major, of `shape`) as a float32 `.npy` to `file`: the header, then
/// the values' bytes as they are in memory (little-endian hosts; `None` elsewhere, for the
/// general writer).
///
/// # Errors
/// A failed write.
pub(super) fn write_f32(file: &File, shape: &[usize], values: &[f32]) -> Option<io::Result<()>> {
    if cfg!(target_endian = "big") {
        return None;
    }
    let mut out = file;
    Some(
        out.write_all(&header("<f4", shape))
            .and_then(|()| out.write_all(bytemuck::cast_slice(values))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_what_numpy_writes() {
        let h = header("<f2", &[4, 16, 1024, 64]);
        assert_eq!(h.len() % 64, 0);
        let text = String::from_utf8_lossy(&h[10..]);
        assert!(text
            .starts_with("{'descr': '<f2', 'fortran_order': False, 'shape': (4, 16, 1024, 64), }"));
        assert!(text.ends_with(" \n"));
        assert!(String::from_utf8_lossy(&header("<f2", &[7])).contains("(7,)"));
        assert!(String::from_utf8_lossy(&header("<f2", &[])).contains("'shape': ()"));
    }

    #[test]
    fn large_files_of_each_dtype_read_back_exactly() {
        let dir = std::env::temp_dir().join(format!("npy-direct-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Past the threads' threshold (4 MiB of f32), odd length so the parts are uneven.
        let n = (1 << 20) + 12_345;
        let values: Vec<f32> = (0..n)
            .map(|i| ((i % 2048) as f32 - 1024.0) * 0.25)
            .collect();
        let a = ArrayD::from_shape_vec(vec![n], values.clone()).unwrap();
        let f32_path = dir.join("a32.npy");
        super::super::write(&f32_path, &a).unwrap();
        let f16_path = dir.join("a16.npy");
        super::super::write_f16(&f16_path, &a).unwrap();
        for path in [&f32_path, &f16_path] {
            let file = File::open(path).unwrap();
            let got = read(&file).unwrap().expect("read directly");
            let wrong = got.iter().zip(&values).position(|(a, b)| a != b);
            assert_eq!(wrong, None, "{}", path.display());
            // The general parser agrees.
            let parsed = super::super::parse(&std::fs::read(path).unwrap()).unwrap();
            assert_eq!(parsed, got);
        }
        // float64, narrowed as it is read (past the threads' threshold too).
        let f64_path = dir.join("a64.npy");
        // A relative change below f32's half-ulp, which narrowing rounds away.
        let wide = values.iter().map(|&v| f64::from(v) * (1.0 + 1e-12));
        let wide = ndarray::Array1::from_iter(wide);
        ndarray_npy::WriteNpyExt::write_npy(&wide, std::fs::File::create(&f64_path).unwrap())
            .unwrap();
        let got = read(&File::open(&f64_path).unwrap())
            .unwrap()
            .expect("read directly");
        let wrong = got.iter().zip(&values).position(|(a, b)| a != b);
        assert_eq!(wrong, None, "the first value narrowed wrong");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
