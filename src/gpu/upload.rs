//! Uploads of host arrays in one pass: each array is copied once, straight into mapped
//! memory (a staging buffer from the context's pool, reused by the next call of the size:
//! neither allocated nor zeroed again; or on unified memory the operand's own buffer, no
//! staging: see `Hardware::unified_memory`), in chunks small enough to stay in cache while
//! the checks on the values (NaN and infinities; f16's range) and the rounding to f16 are
//! done on each chunk on its way through. A strided view (heads-first data sliced along an
//! axis, a transposed array) is copied run by run along its last axis, never gathered into
//! a contiguous copy first. An opened `.npy` file ([`crate::npy::Opened`]) is read a chunk
//! at a time straight into that memory, with the same checks: no array of it on the host.
//! The device buffers come from the context's pool, so calls of one shape reuse them.

use ndarray::{ArrayViewD, Axis};

use super::buffer::{check_len, pooled, Buf};
use super::Gpu;
use crate::error::{Error, Result};
use crate::npy::Opened;
use crate::phases::Instant;
#[cfg(not(target_arch = "wasm32"))]
use crate::phases::Phase;
use crate::values::{first_non_finite, first_past_f16, non_finite_at, past_f16, unravel, CHUNK};
use std::time::Duration;

/// What an upload checks and how it stores the values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stored {
    /// Stored as f16 (rounded to nearest; values past f16's range are an error), else f32.
    pub f16: bool,
    /// NaN and infinities are an error ([`Error::NonFinite`]); else they go through.
    pub finite: bool,
    /// Only the buffer, not its contents: the pipeline dry run, which records nothing.
    pub dry: bool,
}

/// What an upload copies: an array (any layout) or an opened `.npy` file.
#[derive(Clone)]
pub(crate) enum Values<'a> {
    Array(ArrayViewD<'a, f32>),
    File(&'a Opened),
}

impl<'a> Values<'a> {
    /// The shape of the values (an error's index is into it).
    pub fn shape(&self) -> &[usize] {
        match self {
            Values::Array(a) => a.shape(),
            Values::File(f) => f.shape(),
        }
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        match self {
            Values::Array(a) => a.len(),
            Values::File(f) => f.len(),
        }
    }

    /// The values as an array: the caller's view, or the file read whole.
    ///
    /// # Errors
    /// A file that cannot be read now.
    pub fn array(&self) -> Result<ndarray::CowArray<'a, f32, ndarray::IxDyn>> {
        Ok(match self {
            Values::Array(a) => a.clone().into(),
            Values::File(f) => f.read()?.into(),
        })
    }
}

/// Bytes of a buffer of `len` values stored as `f16` or f32 (f16 padded to whole `vec4`s).
pub(crate) fn stored_bytes(len: usize, f16: bool) -> u64 {
    match f16 {
        true => (len.max(1).next_multiple_of(4) * 2) as u64,
        false => (len.max(1) * 4) as u64,
    }
}

/// Uploads `a` (any layout) row-major into a pooled storage buffer, as `how` says; `name`
/// goes into the errors (the index of a bad value is `a`'s).
///
/// # Errors
/// [`Error::LimitExceeded`] when it is larger than the device allows, [`Error::NonFinite`]
/// or the f16 range's error for a bad value, a validation error when wgpu refuses the write.
pub(crate) fn array(ctx: &Gpu, name: &str, a: &ArrayViewD<'_, f32>, how: Stored) -> Result<Buf> {
    #[cfg(not(target_arch = "wasm32"))]
    let _upload = ctx.phases.enter(Phase::Upload);
    upload(ctx, name, &Values::Array(a.view()), how).map(|(buf, _)| buf)
}

/// [`array`] for several arrays (or files) side by side, on a thread each when they are
/// large; the first error in `arrays`' order is the one returned.
///
/// # Errors
/// As [`array`].
pub(crate) fn arrays(ctx: &Gpu, arrays: &[(&str, Values<'_>)], how: Stored) -> Result<Vec<Buf>> {
    #[cfg(not(target_arch = "wasm32"))]
    let upload_phase = ctx.phases.enter(Phase::Upload);
    let total: usize = arrays.iter().map(|(_, a)| a.len() * 4).sum();
    let (bufs, reading) = if how.dry || crate::values::threads_for(total) == 1 {
        let mut reading = Duration::ZERO;
        let mut bufs = Vec::with_capacity(arrays.len());
        for (n, a) in arrays {
            let (buf, read) = upload(ctx, n, a, how)?;
            reading += read;
            bufs.push(buf);
        }
        (bufs, reading)
    } else {
        let done = on_threads(ctx, arrays, how)?;
        // Side by side: the longest reading is the wall time the reads took.
        let reading = done.iter().map(|d| d.1).max().unwrap_or_default();
        (done.into_iter().map(|d| d.0).collect(), reading)
    };
    // The time spent reading files is `io`, not the upload's.
    #[cfg(not(target_arch = "wasm32"))]
    upload_phase.close_moving(Phase::Io, reading);
    #[cfg(target_arch = "wasm32")]
    let _ = reading;
    Ok(bufs)
}

/// [`upload`] of each of `arrays` on a thread of its own.
#[cfg(not(target_arch = "wasm32"))]
fn on_threads(
    ctx: &Gpu,
    arrays: &[(&str, Values<'_>)],
    how: Stored,
) -> Result<Vec<(Buf, Duration)>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = arrays
            .iter()
            .map(|(n, a)| scope.spawn(move || upload(ctx, n, a, how)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::invalid("upload", "internal: a thread panicked"))
                })
            })
            .collect()
    })
}

/// In the browser, one after the other: wgpu's objects stay on their thread there (and
/// `threads_for` never asks for more than one).
#[cfg(target_arch = "wasm32")]
fn on_threads(
    ctx: &Gpu,
    arrays: &[(&str, Values<'_>)],
    how: Stored,
) -> Result<Vec<(Buf, Duration)>> {
    arrays.iter().map(|(n, a)| upload(ctx, n, a, how)).collect()
}

/// [`array`] without its phase (the caller's); with the time its reads from a file took
/// (its longest thread's).
fn upload(ctx: &Gpu, name: &str, a: &Values<'_>, how: Stored) -> Result<(Buf, Duration)> {
    check_len(ctx, name, a.len())?;
    let bytes = stored_bytes(a.len(), how.f16);
    let unified = ctx.hardware().unified_memory;
    if how.dry {
        // Recorded, never run: a buffer of the size, not the pool's (whose next user would
        // get it without the zeroing a new one has) and never touched.
        let usage = if unified {
            MAPPED_OPERAND
        } else {
            STAGED_OPERAND
        };
        let size = crate::gpu::pool::class_of(bytes);
        let buf = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(name),
            size,
            usage,
            mapped_at_creation: false,
        });
        return Ok((Buf::unpooled(buf), Duration::ZERO));
    }
    let gathered;
    let runs = match a {
        Values::File(f) => Runs::File(f),
        Values::Array(a) => Runs::Slices(match pieces(a) {
            Some(p) => p,
            None => {
                // Columns not adjacent in memory (a transposed view): gathered, the rare case.
                gathered = a.iter().copied().collect::<Vec<_>>();
                gathered
                    .chunks(CHUNK)
                    .enumerate()
                    .map(|(c, s)| (c * CHUNK, s))
                    .collect()
            }
        }),
    };
    let (buf, written) = if unified {
        // Written where the kernels read it: no staging copy in the process's memory.
        write_mapped(ctx, name, MAPPED_OPERAND, bytes, |view| {
            write(view, &runs, how, a.len())
        })?
    } else {
        staged(ctx, name, bytes, |view| write(view, &runs, how, a.len()))?
    };
    match written {
        Ok(reading) => Ok((buf, reading)),
        Err(Bad::Panicked) => Err(Error::invalid(name, "internal: an upload thread panicked")),
        Err(Bad::NonFinite(at, value)) => Err(non_finite_at(name, a.shape(), at, value)),
        Err(Bad::PastF16(at, value)) => Err(past_f16(name, &unravel(at, a.shape()), value)),
        Err(Bad::Read(e)) => Err(e),
    }
}

/// A device buffer of `bytes` filled by `fill` through a staging buffer of the pool (reused by
/// the next call of the size, so neither allocated nor faulted in again), copied in a
/// submission of its own, which runs before the call's; nothing is copied when `fill` fails.
/// In the browser, where a buffer maps again only asynchronously, through the staging memory
/// `Queue::write_buffer_with` hands out, each call.
///
/// # Errors
/// As [`write_mapped`]; a write that wgpu refuses.
fn staged<T, E>(
    ctx: &Gpu,
    name: &str,
    bytes: u64,
    fill: impl FnOnce(wgpu::WriteOnly<'_, [u8]>) -> std::result::Result<T, E>,
) -> Result<(Buf, std::result::Result<T, E>)> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        let (staging, written) = write_mapped(ctx, "upload staging", STAGING, bytes, fill)?;
        let buf = pooled(ctx, name, bytes);
        if written.is_ok() {
            let mut encoder = ctx
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("upload"),
                });
            encoder.copy_buffer_to_buffer(&staging, 0, &buf, 0, bytes);
            ctx.queue.submit([encoder.finish()]);
        }
        Ok((buf, written))
    }
    #[cfg(target_arch = "wasm32")]
    {
        let buf = pooled(ctx, name, bytes);
        let size = wgpu::BufferSize::new(bytes).ok_or_else(|| Error::invalid(name, "empty"))?;
        let mut view = ctx.queue.write_buffer_with(&buf, 0, size).ok_or_else(|| {
            ctx.check_alive()
                .err()
                .unwrap_or_else(|| Error::Validation(format!("{name}: wgpu refused the upload")))
        })?;
        let written = fill(view.slice(..));
        drop(view);
        Ok((buf, written))
    }
}

/// A pooled buffer of `usage` (host-writable) holding at least `bytes`, its first `bytes`
/// mapped and handed to `fill`, then unmapped. A new one is created mapped (wgpu zeroes it
/// there, on this thread); a reused one is mapped once the device is done with it, and is
/// not zeroed again.
///
/// # Errors
/// A mapping that fails (the buffer is then kept out of the pool).
fn write_mapped<T>(
    ctx: &Gpu,
    name: &str,
    usage: wgpu::BufferUsages,
    bytes: u64,
    fill: impl FnOnce(wgpu::WriteOnly<'_, [u8]>) -> T,
) -> Result<(Buf, T)> {
    let limits = ctx.limits();
    let max = limits
        .max_storage_buffer_binding_size
        .min(limits.max_buffer_size);
    let (buf, mapped) = ctx
        .pool
        .take_mapped(&ctx.device, name, (bytes, usage, max), true);
    if !mapped {
        if let Err(e) = super::readback::map_for_write(ctx, &buf, bytes) {
            buf.keep_out_of_pool();
            return Err(e);
        }
    }
    let filled = {
        let mut range = buf
            .slice(..bytes)
            .get_mapped_range_mut()
            .map_err(|e| Error::Validation(format!("{name}: {e}")))?;
        fill(range.slice(..))
    };
    buf.unmap();
    Ok((buf, filled))
}

/// The usage of the staging buffers of a device whose memory is not the host's.
#[cfg(not(target_arch = "wasm32"))]
const STAGING: wgpu::BufferUsages =
    wgpu::BufferUsages::MAP_WRITE.union(wgpu::BufferUsages::COPY_SRC);

/// The usage of an operand's buffer written through staging.
const STAGED_OPERAND: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// The usage of an operand's buffer on unified memory: mapped for writing by the upload.
const MAPPED_OPERAND: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST)
    .union(wgpu::BufferUsages::MAP_WRITE);

/// What stopped a write: the first bad value (row-major position and value), a file's
/// read, or a thread.
enum Bad {
    NonFinite(usize, f32),
    PastF16(usize, f32),
    Read(Error),
    Panicked,
}

/// The values of an upload as runs in row-major order, each at most [`CHUNK`] values: slices
/// of the caller's array (each with the position of its first value), or the chunks of an
/// opened file, read into the writing thread's scratch as they come.
enum Runs<'a> {
    Slices(Vec<(usize, &'a [f32])>),
    File(&'a Opened),
}

/// A writing thread's buffers for a file's chunks, and the time it spent reading them.
#[derive(Default)]
struct Scratch {
    values: Vec<f32>,
    raw: Vec<u64>,
    reading: Duration,
}

impl Runs<'_> {
    /// The number of runs.
    fn count(&self) -> usize {
        match self {
            Runs::Slices(p) => p.len(),
            Runs::File(f) => f.len().div_ceil(CHUNK),
        }
    }

    /// The position of run `i`'s first value (`i == count()`: the number of values).
    fn start(&self, i: usize, len: usize) -> usize {
        match self {
            Runs::Slices(p) => p.get(i).map_or(len, |r| r.0),
            Runs::File(..) => (i * CHUNK).min(len),
        }
    }

    /// Run `i`'s values.
    fn run<'s>(
        &'s self,
        i: usize,
        scratch: &'s mut Scratch,
    ) -> std::result::Result<&'s [f32], Bad> {
        match self {
            Runs::Slices(p) => Ok(p[i].1),
            Runs::File(file) => {
                let first = i * CHUNK;
                let n = CHUNK.min(file.len() - first);
                scratch.values.resize(CHUNK, 0.0);
                let out = &mut scratch.values[..n];
                let start = Instant::now();
                file.read_at(first, out, &mut scratch.raw)
                    .map_err(Bad::Read)?;
                scratch.reading += start.elapsed();
                Ok(out)
            }
        }
    }
}

/// Writes `runs` (of `len` values in all) into `view` as `how` says, in contiguous groups
/// of runs, one per thread; the rest of `view` (f16's padding, an empty array's stand-in)
/// zero. The first bad value in row-major order stops it. Returns the time the longest
/// thread spent reading a file's chunks.
fn write(
    view: wgpu::WriteOnly<'_, [u8]>,
    runs: &Runs<'_>,
    how: Stored,
    len: usize,
) -> std::result::Result<Duration, Bad> {
    let width = if how.f16 { 2 } else { 4 };
    let threads = crate::values::threads_for(len * 4);
    let per = len.div_ceil(threads).max(1);
    // Groups of runs, as index ranges, each of about `per` values.
    let count = runs.count();
    let mut groups: Vec<std::ops::Range<usize>> = Vec::with_capacity(threads);
    let mut first = 0;
    while first < count {
        let want = runs.start(first, len) + per;
        let mut end = first + 1;
        while end < count && runs.start(end, len) < want {
            end += 1;
        }
        groups.push(first..end);
        first = end;
    }
    let mut parts = Vec::with_capacity(groups.len());
    let mut remaining = view;
    for group in &groups {
        let values = runs.start(group.end, len) - runs.start(group.start, len);
        let (part, tail) = remaining.split_at(values * width);
        parts.push(Part(part));
        remaining = tail;
    }
    remaining.fill(0);
    let fill = |group: std::ops::Range<usize>, Part(mut out): Part<'_>| {
        let mut halves = vec![half::f16::ZERO; if how.f16 { CHUNK } else { 0 }];
        let mut scratch = Scratch::default();
        let mut at = 0;
        for i in group {
            let first = runs.start(i, len);
            let chunk = runs.run(i, &mut scratch)?;
            if how.finite {
                if let Some(i) = first_non_finite(chunk) {
                    return Err(Bad::NonFinite(first + i, chunk[i]));
                }
            }
            let n = chunk.len() * width;
            if how.f16 {
                if let Some(i) = first_past_f16(chunk) {
                    return Err(Bad::PastF16(first + i, chunk[i]));
                }
                let halves = &mut halves[..chunk.len()];
                half::slice::HalfFloatSliceExt::convert_from_f32_slice(halves, chunk);
                out.slice(at..at + n)
                    .copy_from_slice(bytemuck::cast_slice(halves));
            } else {
                out.slice(at..at + n)
                    .copy_from_slice(bytemuck::cast_slice(chunk));
            }
            at += n;
        }
        Ok(scratch.reading)
    };
    let results: Vec<std::result::Result<Duration, Bad>> = if parts.len() > 1 {
        std::thread::scope(|scope| {
            let handles: Vec<_> = groups
                .iter()
                .zip(parts)
                .map(|(group, part)| scope.spawn(move || fill(group.clone(), part)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(Err(Bad::Panicked)))
                .collect()
        })
    } else {
        groups
            .iter()
            .zip(parts)
            .map(|(g, p)| fill(g.clone(), p))
            .collect()
    };
    // The groups are in row-major order: the first error is the first bad value.
    let mut reading = Duration::ZERO;
    for r in results {
        reading = reading.max(r?);
    }
    Ok(reading)
}

/// A part of the staging view that one thread fills. wgpu 30's `WriteOnly<T>` is `Send` for
/// sized `T` only (its impl lacks `?Sized`), though a `WriteOnly<[u8]>` is as much an
/// exclusive pointer to plain bytes.
struct Part<'a>(wgpu::WriteOnly<'a, [u8]>);

// SAFETY: a write-only, exclusive view of bytes, as wgpu-types' own `Send` impl for sized
// `T: Send` reasons; the parts are disjoint (`split_at`) and joined before the view drops.
unsafe impl Send for Part<'_> {}

/// The values of `a` in row-major order as pieces of at most [`CHUNK`] values contiguous in
/// memory, each with the row-major position of its first value; `None` when the last axis is
/// not contiguous.
fn pieces<'a>(a: &'a ArrayViewD<'_, f32>) -> Option<Vec<(usize, &'a [f32])>> {
    let split = |start: usize, s: &'a [f32]| {
        s.chunks(CHUNK)
            .enumerate()
            .map(move |(c, p)| (start + c * CHUNK, p))
    };
    if let Some(s) = a.as_slice() {
        return Some(split(0, s).collect());
    }
    let last = Axis(a.ndim().checked_sub(1)?);
    let width = a.len_of(last);
    if a.stride_of(last) != 1 && width > 1 {
        return None;
    }
    let mut out = Vec::new();
    for (r, lane) in a.lanes(last).into_iter().enumerate() {
        out.extend(split(r * width, lane.to_slice()?));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array4, Axis};

    fn read(ctx: &Gpu, buf: &wgpu::Buffer, len: usize, f16: bool) -> Vec<f32> {
        crate::gpu::readback::read_as(ctx, buf, len, f16).unwrap()
    }

    const PLAIN: Stored = Stored {
        f16: false,
        finite: true,
        dry: false,
    };

    #[test]
    fn strided_views_upload_row_major_in_both_precisions() {
        let ctx = crate::context::test_context();
        let a = Array4::from_shape_fn((2, 3, 37, 7), |(b, h, i, c)| {
            (b * 1000 + h * 100 + i) as f32 + c as f32 * 0.125
        });
        // Contiguous, sliced along the rows (runs of 7), and permuted (gathered).
        let sliced = a.slice_axis(Axis(2), (5..30).into());
        let permuted = a.view().permuted_axes([0, 2, 1, 3]);
        for view in [a.view(), sliced, permuted] {
            let want: Vec<f32> = view.iter().copied().collect();
            for f16 in [false, true] {
                let how = Stored { f16, ..PLAIN };
                let buf = array(ctx, "A", &view.view().into_dyn(), how).unwrap();
                let got = read(ctx, &buf, want.len(), f16);
                let round = |v: f32| {
                    if f16 {
                        half::f16::from_f32(v).to_f32()
                    } else {
                        v
                    }
                };
                let want: Vec<f32> = want.iter().map(|&v| round(v)).collect();
                assert_eq!(got, want, "f16 {f16}, shape {:?}", view.shape());
            }
        }
    }

    #[test]
    fn both_ways_up_write_what_they_are_given_and_reuse_their_buffers() {
        // Unified memory (lavapipe as it is: the operand's own buffer, mapped) and a discrete
        // GPU's way (the stand-in: a pooled staging buffer, copied), twice each: the second
        // upload of a size allocates nothing.
        let unified = crate::context::test_context();
        let staged = crate::Context::new()
            .unwrap()
            .with_tuning(false)
            .with_stand_in(crate::gpu::hardware::StandIn::Gpu);
        assert!(unified.hardware().unified_memory && !staged.hardware().unified_memory);
        for ctx in [unified, &staged] {
            for salt in [1.0f32, 2.0] {
                let a = Array4::from_shape_fn((2, 3, 37, 7), |(b, h, i, c)| {
                    salt * ((b * 1000 + h * 100 + i) as f32 + c as f32 * 0.125)
                });
                let want: Vec<f32> = a.iter().copied().collect();
                let before = ctx.memory().allocations;
                let buf = array(ctx, "A", &a.view().into_dyn(), PLAIN).unwrap();
                assert_eq!(read(ctx, &buf, want.len(), false), want);
                drop(buf);
                if salt > 1.0 {
                    assert_eq!(ctx.memory().allocations, before, "reused");
                }
            }
        }
    }

    #[test]
    fn a_bad_value_is_named_at_its_index_in_the_callers_array() {
        let ctx = crate::context::test_context();
        let mut a = Array4::<f32>::ones((2, 3, 2000, 4));
        a[[1, 2, 1500, 3]] = f32::NAN;
        let sliced = a.slice_axis(Axis(2), (1000..2000).into()).into_dyn();
        let err = array(ctx, "Q", &sliced, PLAIN).unwrap_err();
        assert!(
            matches!(&err, Error::NonFinite { array, index, .. } if array == "Q" && index == &[1, 2, 500, 3]),
            "{err}"
        );
        // Passed through when asked, and then only f16's range is checked.
        let through = Stored {
            finite: false,
            ..PLAIN
        };
        assert!(array(ctx, "Q", &sliced, through).is_ok());
        a[[0, 1, 1999, 0]] = 1e6;
        let f16 = Stored {
            f16: true,
            ..through
        };
        let err = array(ctx, "K", &a.view().into_dyn(), f16).unwrap_err();
        assert!(err.to_string().contains("K[0, 1, 1999, 0]"), "{err}");
    }
}
