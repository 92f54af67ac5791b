//! [`Opened`]: a `.npy` file as an operand whose values are read only where they go. A call
//! given opened files (`Inputs::qkv(&q, &k, &v)` on three [`Opened`]) copies each file's
//! values a chunk at a time from the file into the device's memory, checked on the way, with
//! no array of them on the host: the one pass `sdpa` from files makes.

use std::fs::File;
use std::path::{Path, PathBuf};

use ndarray::ArrayD;

use super::direct::{self, Header};
use crate::error::{Error, Result};

/// A float16, float32 or float64 `.npy` file, its header read and its values not yet: an
/// operand of a call (`Inputs::qkv(&q, &k, &v)` with `&Opened`s), whose values go from the
/// file to the device in one pass, or read whole with [`Opened::read`]. A little-endian,
/// C-order file (what NumPy and PyTorch write) stays on disk until then; any other kind the
/// readers accept is read whole when opened.
///
/// ```no_run
/// use std::path::Path;
/// use wgpu_attention::{npy::Opened, Attention, Context, Inputs};
/// # fn main() -> wgpu_attention::Result<()> {
/// let [q, k, v] = ["q.npy", "k.npy", "v.npy"].map(|p| Opened::open(Path::new(p)));
/// let (q, k, v) = (q?, k?, v?);
/// let ctx = Context::new()?;
/// let out = Attention::new().run(&ctx, Inputs::qkv(&q, &k, &v))?;
/// # let _ = out;
/// # Ok(()) }
/// ```
pub struct Opened {
    path: PathBuf,
    body: Body,
}

enum Body {
    /// On disk: read a chunk at a time.
    File { file: File, header: Header },
    /// Read whole when opened (a kind the direct reader leaves to the general parser).
    Held(ArrayD<f32>),
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("path", &self.path)
            .field("shape", &self.shape())
            .field("on_disk", &matches!(self.body, Body::File { .. }))
            .finish()
    }
}

impl Opened {
    /// Opens `path` and reads its header (the values too when the file is not
    /// little-endian and C order).
    ///
    /// # Errors
    /// As [`super::read`]: [`Error::Io`] naming the path when the file is missing,
    /// unreadable, not an `.npy`, of another dtype, or truncated.
    pub fn open(path: &Path) -> Result<Opened> {
        let cannot = |e: std::io::Error| Error::io(path, format!("cannot read: {e}"));
        let header = {
            let _io = direct::clock();
            let file = File::open(path).map_err(cannot)?;
            direct::read_header(&file)
                .map_err(cannot)?
                .map(|header| (file, header))
        };
        let body = match header {
            Some((file, header)) => Body::File { file, header },
            None => {
                // Row-major, as a chunk read wants it (a Fortran-order file's array is not).
                let a = super::read(path)?;
                Body::Held(match a.is_standard_layout() {
                    true => a,
                    false => a.as_standard_layout().into_owned(),
                })
            }
        };
        Ok(Opened {
            path: path.to_path_buf(),
            body,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The array's shape.
    pub fn shape(&self) -> &[usize] {
        match &self.body {
            Body::File { header, .. } => &header.shape,
            Body::Held(a) => a.shape(),
        }
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        self.shape().iter().product()
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All of its values as an f32 array (as [`super::read`] reads them).
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be read now.
    pub fn read(&self) -> Result<ArrayD<f32>> {
        match &self.body {
            Body::File { file, header } => {
                let _io = direct::clock();
                direct::values(file, header).map_err(|e| self.cannot(e))
            }
            Body::Held(a) => Ok(a.clone()),
        }
    }

    /// Reads `out.len()` values from value `first` (row-major) on into `out`, through
    /// `scratch` (kept by the caller between chunks).
    ///
    /// # Errors
    /// [`Error::Io`] when the read fails or reaches past the values.
    pub(crate) fn read_at(
        &self,
        first: usize,
        out: &mut [f32],
        scratch: &mut Vec<u64>,
    ) -> Result<()> {
        match &self.body {
            Body::File { file, header } => {
                direct::read_at(file, header, first, out, scratch).map_err(|e| self.cannot(e))
            }
            Body::Held(a) => {
                let values = a
                    .as_slice()
                    .and_then(|s| s.get(first..first + out.len()))
                    .ok_or_else(|| self.cannot("internal: a read past the values"))?;
                out.copy_from_slice(values);
                Ok(())
            }
        }
    }

    fn cannot(&self, e: impl std::fmt::Display) -> Error {
        Error::io(&self.path, format!("cannot read: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::ShapeBuilder;

    #[test]
    fn opened_files_read_the_values_they_hold_in_any_range() {
        let dir = std::env::temp_dir().join(format!("npy-opened-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = ArrayD::from_shape_fn(vec![3, 5, 7], |i| (i[0] * 35 + i[1] * 7 + i[2]) as f32);
        let f32_path = dir.join("a32.npy");
        super::super::write(&f32_path, &a).unwrap();
        let f16_path = dir.join("a16.npy");
        super::super::write_f16(&f16_path, &a).unwrap();
        // Fortran order: read whole when opened, the same values.
        let fortran_path = dir.join("fortran.npy");
        let mut fortran = ndarray::Array3::<f64>::zeros((3, 5, 7).f());
        fortran.assign(
            &a.mapv(f64::from)
                .into_dimensionality::<ndarray::Ix3>()
                .unwrap(),
        );
        ndarray_npy::WriteNpyExt::write_npy(&fortran, File::create(&fortran_path).unwrap())
            .unwrap();
        let want: Vec<f32> = a.iter().copied().collect();
        for path in [&f32_path, &f16_path, &fortran_path] {
            let o = Opened::open(path).unwrap();
            assert_eq!(o.shape(), &[3, 5, 7]);
            assert_eq!(o.read().unwrap(), a, "{}", path.display());
            let mut out = vec![0f32; 40];
            o.read_at(61, &mut out, &mut Vec::new()).unwrap();
            assert_eq!(out, want[61..101], "{}", path.display());
            let past = o.read_at(100, &mut out, &mut Vec::new()).unwrap_err();
            assert!(
                past.to_string().contains(&*path.to_string_lossy()),
                "{past}"
            );
        }
        assert!(matches!(
            Opened::open(&f32_path).map(|o| o.body),
            Ok(Body::File { .. })
        ));
        assert!(matches!(
            Opened::open(&fortran_path).map(|o| o.body),
            Ok(Body::Held(_))
        ));
        let missing = Opened::open(&dir.join("missing.npy")).unwrap_err();
        assert!(missing.to_string().contains("missing.npy"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
