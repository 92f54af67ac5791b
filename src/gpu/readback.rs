//! Reading results back: copy into staging buffers inside the forward pass's encoder, then
//! map them all and wait (or, async, await them). Every `poll` and `map_async` of the crate
//! is in this file.

use std::time::Duration;

use super::Gpu;
use crate::error::{Error, Result};
use crate::gpu::oneshot;
#[cfg(not(target_arch = "wasm32"))]
use crate::phases::Phase;
use crate::values::{first_non_finite, CHUNK};

/// How long a readback waits for the GPU before giving up with an error.
pub const READBACK_TIMEOUT: Duration = Duration::from_secs(600);

/// A staging buffer (or, on unified memory, the result's own buffer) and how many f32s to
/// read from it.
pub struct Pending {
    staging: crate::gpu::pool::Buf,
    /// `staging` is the result's own buffer (mapped where it is, not a copy).
    direct: bool,
    len: usize,
    /// The values are f16 (read back widened to f32).
    f16: bool,
    /// A mapping was asked for and the buffer is not unmapped yet.
    mapping: bool,
}

impl Drop for Pending {
    fn drop(&mut self) {
        // Dropped half way (a failed wait or mapping, an error of the call): the buffer may be
        // mapped, or become so; it must not serve another readback.
        if self.mapping {
            match self.direct {
                // The result's buffer goes back to its owner's pool: unmapped.
                true => self.staging.unmap(),
                false => self.staging.keep_out_of_pool(),
            }
        }
    }
}

/// Records a copy of the first `len` f32s of `src` into a staging buffer from the pool; on
/// unified memory (a `MAP_READ` buffer), no copy: `src` itself is read, and the pending
/// readback holds it (a clone of the `Buf`), so it goes back to the pool only once it is
/// unmapped, whenever its first holder drops it. For the results of the caller's own call
/// only (a buffer no one else maps meanwhile).
pub fn copy_out(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    src: &crate::gpu::pool::Buf,
    len: usize,
) -> Pending {
    if src.usage().contains(wgpu::BufferUsages::MAP_READ) {
        // Unified memory: the result is read where the kernels wrote it.
        return Pending {
            staging: src.clone(),
            direct: true,
            len,
            f16: false,
            mapping: false,
        };
    }
    copy_out_as(ctx, encoder, src, len, false)
}

/// A copy of `len` values of `src` stored as f16 when `f16` (as `buffer::upload_as` and
/// `buffer::output_f16` lay them out: a multiple of four halves), read back as f32, always
/// through a staging buffer: `src` may be a tensor's or a memo's, which other threads may be
/// reading too (a buffer maps for one reader at a time).
pub fn copy_out_as(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    src: &wgpu::Buffer,
    len: usize,
    f16: bool,
) -> Pending {
    let bytes = match f16 {
        true => len.max(1).next_multiple_of(4) * 2,
        false => len.max(1) * std::mem::size_of::<f32>(),
    } as u64;
    let staging = ctx.pool.take(
        &ctx.device,
        "readback staging",
        bytes,
        wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        ctx.limits().max_buffer_size,
    );
    encoder.copy_buffer_to_buffer(src, 0, &staging, 0, bytes);
    Pending {
        staging,
        direct: false,
        len,
        f16,
        mapping: false,
    }
}

/// The first `len` values of `src` (f16 when `f16`, see [`copy_out_as`]) as f32: one copy,
/// one submit, one wait.
///
/// # Errors
/// As [`finish`].
pub fn read_as(ctx: &Gpu, src: &wgpu::Buffer, len: usize, f16: bool) -> Result<Vec<f32>> {
    let mut encoder = ctx
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("readback"),
        });
    let pending = copy_out_as(ctx, &mut encoder, src, len, f16);
    let submission = ctx.queue.submit([encoder.finish()]);
    Ok(finish(ctx, submission, vec![pending])?
        .pop()
        .unwrap_or_default())
}

/// Waits (at most [`READBACK_TIMEOUT`]) until `submission` has run.
///
/// # Errors
/// [`Error::Poll`] when the wait fails or times out, [`Error::DeviceLost`] when the device
/// was lost meanwhile.
pub fn wait(ctx: &Gpu, submission: wgpu::SubmissionIndex) -> Result<()> {
    ctx.device
        .poll(wgpu::PollType::Wait {
            submission_index: Some(submission),
            timeout: Some(READBACK_TIMEOUT),
        })
        .map_err(|e| Error::Poll(e.to_string()))?;
    ctx.check_alive()
}

/// Maps the first `bytes` of `buffer` (a `MAP_WRITE` buffer of unified memory) for writing,
/// waiting until it is (after whatever submitted work still uses it).
///
/// # Errors
/// As [`wait_all`]; [`Error::Readback`] when the mapping fails.
pub fn map_for_write(ctx: &Gpu, buffer: &wgpu::Buffer, bytes: u64) -> Result<()> {
    let (send, rx) = oneshot::channel();
    buffer.slice(..bytes).map_async(wgpu::MapMode::Write, send);
    #[cfg(not(target_arch = "wasm32"))]
    {
        wait_all(ctx)?;
        take_mapped(ctx, &rx)?.map_err(|e| Error::Readback(e.to_string()))
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = (ctx, rx);
        Err(Error::Readback(
            "the browser maps no storage buffer (unified memory is native only)".into(),
        ))
    }
}

/// Asks for the whole of `buffer` (a `MAP_READ` buffer) to be mapped for reading; [`mapped`]
/// waits for the answers once the submission that fills it has run (the sanitizer's
/// readback of a dispatch's resources).
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn map_read(
    buffer: &wgpu::Buffer,
) -> oneshot::Receiver<std::result::Result<(), wgpu::BufferAsyncError>> {
    let (send, rx) = oneshot::channel();
    buffer.slice(..).map_async(wgpu::MapMode::Read, send);
    rx
}

/// Waits for the mappings [`map_read`] asked for (after [`wait`] on their submission).
///
/// # Errors
/// [`Error::Readback`] when one fails or never comes.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn mapped(
    ctx: &Gpu,
    mappings: Vec<oneshot::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>>,
) -> Result<()> {
    for rx in &mappings {
        take_mapped(ctx, rx)?.map_err(|e| Error::Readback(e.to_string()))?;
    }
    Ok(())
}

/// Waits (at most [`READBACK_TIMEOUT`]) until everything submitted so far has run.
///
/// # Errors
/// As [`wait`].
pub fn wait_all(ctx: &Gpu) -> Result<()> {
    ctx.device
        .poll(wgpu::PollType::Wait {
            submission_index: None,
            timeout: Some(READBACK_TIMEOUT),
        })
        .map_err(|e| Error::Poll(e.to_string()))?;
    ctx.check_alive()
}

/// Waits for `submission` and returns the contents of every pending buffer, in order.
///
/// # Errors
/// [`Error::Poll`] when the wait fails or times out, [`Error::Readback`] when mapping fails.
pub fn finish(
    ctx: &Gpu,
    submission: wgpu::SubmissionIndex,
    pending: Vec<Pending>,
) -> Result<Vec<Vec<f32>>> {
    oneshot::block_on(finish_async(ctx, submission, pending))
}

/// A map callback's result, natively, once the submission has run: at once when our wait
/// fired it; else polling the device again, and waiting, up to 5 s, for another thread whose
/// poll took the callback and has yet to call it (threads sharing a context poll each other's
/// callbacks).
#[cfg(not(target_arch = "wasm32"))]
fn take_mapped<T>(ctx: &Gpu, rx: &oneshot::Receiver<T>) -> Result<T> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(r) = rx.try_take() {
            return Ok(r);
        }
        if std::time::Instant::now() > deadline {
            return Err(Error::Readback("map callback never fired".into()));
        }
        let _ = ctx.device.poll(wgpu::PollType::Poll);
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// [`finish`] without blocking: natively the same wait on the device; in the browser, whose
/// event loop completes the mappings, it awaits them instead.
///
/// # Errors
/// As [`finish`].
pub async fn finish_async(
    ctx: &Gpu,
    submission: wgpu::SubmissionIndex,
    pending: Vec<Pending>,
) -> Result<Vec<Vec<f32>>> {
    let read = finish_scanned_async(ctx, submission, pending).await?;
    Ok(read.into_iter().map(|(values, _)| values).collect())
}

/// [`finish_async`] that also returns, for each buffer, the index of its first NaN or
/// infinity: found while copying it out (each chunk scanned while in cache), not in a second
/// pass.
///
/// # Errors
/// As [`finish`].
pub async fn finish_scanned_async(
    ctx: &Gpu,
    submission: wgpu::SubmissionIndex,
    pending: Vec<Pending>,
) -> Result<Vec<(Vec<f32>, Option<usize>)>> {
    let mut pending = pending;
    let mut mapped = Vec::with_capacity(pending.len());
    for p in &mut pending {
        let (send, rx) = oneshot::channel();
        p.staging.slice(..).map_async(wgpu::MapMode::Read, send);
        p.mapping = true;
        mapped.push(rx);
    }
    #[cfg(not(target_arch = "wasm32"))]
    let _readback = {
        {
            let _device = ctx.phases.enter(Phase::Dispatch);
            wait(ctx, submission)?;
        }
        let readback = ctx.phases.enter(Phase::Readback);
        for rx in &mapped {
            take_mapped(ctx, rx)?.map_err(|e| Error::Readback(e.to_string()))?;
        }
        readback
    };
    #[cfg(target_arch = "wasm32")]
    {
        let _ = submission;
        for rx in mapped {
            rx.await.map_err(|e| Error::Readback(e.to_string()))?;
        }
        ctx.check_alive()?;
    }
    pending
        .into_iter()
        .map(|mut p| {
            let out = {
                let view = p
                    .staging
                    .slice(..)
                    .get_mapped_range()
                    .map_err(|e| Error::Readback(e.to_string()))?;
                if p.f16 {
                    copy_scanned(&bytemuck::cast_slice::<u8, half::f16>(&view)[..p.len])
                } else {
                    copy_scanned(&bytemuck::cast_slice::<u8, f32>(&view)[..p.len])
                }
            };
            p.staging.unmap();
            p.mapping = false;
            Ok(out)
        })
        .collect()
}

/// Values a readback can widen to f32 a chunk at a time.
trait Widen: Copy {
    fn widen(src: &[Self], dst: &mut [f32]);
}

impl Widen for f32 {
    fn widen(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

impl Widen for half::f16 {
    fn widen(src: &[half::f16], dst: &mut [f32]) {
        half::slice::HalfFloatSliceExt::convert_to_f32_slice(src, dst);
    }
}

/// `src` widened into a new vector in one pass (parts of it on several threads when it is
/// large), with the index of its first NaN or infinity.
fn copy_scanned<T: Widen + Sync>(src: &[T]) -> (Vec<f32>, Option<usize>) {
    let mut out = vec![0.0; src.len()];
    let scan = |from: &[T], to: &mut [f32]| {
        let mut bad = None;
        for (c, (from, to)) in from.chunks(CHUNK).zip(to.chunks_mut(CHUNK)).enumerate() {
            T::widen(from, to);
            if bad.is_none() {
                bad = first_non_finite(to).map(|i| c * CHUNK + i);
            }
        }
        bad
    };
    let threads = crate::values::threads_for(src.len() * 4);
    if threads == 1 {
        let bad = scan(src, &mut out);
        return (out, bad);
    }
    let per = src.len().div_ceil(threads).next_multiple_of(CHUNK);
    let bad = std::thread::scope(|scope| {
        let handles: Vec<_> = src
            .chunks(per)
            .zip(out.chunks_mut(per))
            .map(|(from, to)| scope.spawn(move || scan(from, to)))
            .collect();
        let found: Vec<Option<usize>> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Some(0)))
            .collect();
        found
            .into_iter()
            .enumerate()
            .find_map(|(part, bad)| bad.map(|i| part * per + i))
    });
    (out, bad)
}

#[cfg(test)]
mod tests {
    use crate::gpu::pool::{Buf, Pool};

    #[test]
    fn a_result_read_where_it_lies_goes_back_to_its_pool_only_once_read() {
        // On unified memory a result is mapped where the kernels wrote it. Its caller may drop
        // its handle before the readback ends (the backward's relative-bias gradient did): the
        // buffer must not serve another caller meanwhile, who would bind it to a submission
        // or map it while it is mapped here (validation errors, seen in CI as a race between
        // two tests on one device).
        let ctx = crate::context::test_context();
        assert!(
            ctx.hardware().unified_memory,
            "the test context is lavapipe's: unified memory, results mapped where they lie"
        );
        let pool = Pool::default();
        let usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::MAP_READ;
        let take = || pool.take(ctx.device(), "result", 37 * 4, usage, u64::MAX);
        let values: Vec<f32> = (0..37).map(|i| i as f32 * 0.5).collect();
        let result = take();
        ctx.queue()
            .write_buffer(&result, 0, bytemuck::cast_slice(&values));
        let first = (*result).clone();
        let mut encoder = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
        let pending = super::copy_out(ctx, &mut encoder, &result, 37);
        drop(result);
        let meanwhile = take();
        assert!(
            *meanwhile != first,
            "handed out while its readback is pending"
        );
        let submission = ctx.queue().submit([encoder.finish()]);
        let got = super::finish(ctx, submission, vec![pending]).unwrap();
        assert_eq!(got[0], values);
        // Read and unmapped: back in the pool, the next request of its class gets it.
        let next = take();
        assert!(*next == first, "not back in the pool once read");
    }

    #[test]
    fn nan_fill_really_poisons_outputs_no_kernel_writes() {
        // The guarantee the sweep relies on: a NaN-filled output buffer reads back as NaN until a
        // kernel writes it, and the comparison fails on it.
        let ctx = crate::context::test_context();
        let buf = crate::gpu::buffer::output(ctx, "poisoned", 37, true).unwrap();
        let mut encoder = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
        let pending = super::copy_out(ctx, &mut encoder, &buf, 37);
        let submission = ctx.queue().submit([encoder.finish()]);
        let data = super::finish(ctx, submission, vec![pending]).unwrap();
        assert!(data[0].iter().all(|v| v.is_nan()));
        let out = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[37]), data[0].clone()).unwrap();
        let (rel, _) =
            crate::reference::compare(&out, &ndarray::ArrayD::zeros(ndarray::IxDyn(&[37])));
        assert!(
            rel.is_infinite(),
            "NaN output must fail any tolerance, got {rel}"
        );
    }

    #[test]
    fn a_staging_buffer_a_failed_call_left_mapped_is_never_reused() {
        // A call that fails between mapping its staging buffers and reading them (a wait that
        // times out, an error scope that pops an error) drops them mapped; the next readback
        // of that size must get another buffer, or its copy is a validation error.
        let ctx = crate::context::test_context();
        let values: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        let src = Buf::unpooled(crate::gpu::buffer::upload(ctx, "src", &values).unwrap());
        for _ in 0..3 {
            let mut encoder = ctx
                .device()
                .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
            let mut p = super::copy_out(ctx, &mut encoder, &src, values.len());
            let submission = ctx.queue().submit([encoder.finish()]);
            p.staging.slice(..).map_async(wgpu::MapMode::Read, |_| {});
            p.mapping = true;
            super::wait(ctx, submission).unwrap();
            drop(p); // mapped, never read
            let got = ctx
                .scoped(|| super::read_as(ctx, &src, values.len(), false))
                .unwrap();
            assert_eq!(got, values);
        }
    }
}
