//! A pool of device buffers reused across calls by size class, so a loop of calls allocates
//! nothing after the first: the intermediates (projected Q, K, V, contexts, weights, partial
//! results) and the staging buffers of readbacks.
//!
//! A buffer goes back to the pool when its [`Buf`] is dropped, but a buffer dropped while an
//! encoder that may still use it is being recorded must not be handed out again before that
//! encoder is submitted: something submitted earlier could then write into it after the fact.
//! So dropped buffers are *retired* first, and become *free* only when no encoder of the
//! crate is open (counted by [`Pool::open`]'s guards). Submissions on one queue run in order,
//! so a free buffer's next user always runs after its last one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Buffers below this many bytes are rounded up to it.
const MIN_CLASS: u64 = 256;

/// The size a request of `bytes` is served with: rounded up to a quarter step of its power of
/// two (at most 25 % more), or to [`MIN_CLASS`].
pub(crate) fn class_of(bytes: u64) -> u64 {
    if bytes <= MIN_CLASS {
        return MIN_CLASS;
    }
    let step = 1u64 << (63 - bytes.leading_zeros()).saturating_sub(2);
    bytes.div_ceil(step) * step
}

/// What the pool holds, for [`crate::Context::memory`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Buffers the pool ever created (a loop of calls stops adding to this after its first).
    pub allocations: u64,
    /// Bytes of pooled buffers in use now (by tensors, or by a call in progress).
    pub in_use_bytes: u64,
    /// Bytes of pooled buffers kept for reuse; [`crate::Context::release_memory`] frees them.
    pub free_bytes: u64,
}

type Key = (u64, wgpu::BufferUsages);

#[derive(Default)]
struct State {
    free: HashMap<Key, Vec<wgpu::Buffer>>,
    retired: Vec<(Key, wgpu::Buffer)>,
    open: usize,
    stats: MemoryStats,
}

impl State {
    fn recycle(&mut self) {
        for (key, buffer) in self.retired.drain(..) {
            self.stats.free_bytes += key.0;
            self.free.entry(key).or_default().push(buffer);
        }
    }
}

/// The pool; one per [`crate::Context`].
#[derive(Default, Clone)]
pub(crate) struct Pool {
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A buffer of at least `bytes` with `usage`: a free one of its class, or a new one.
    pub(crate) fn take(
        &self,
        device: &wgpu::Device,
        label: &str,
        bytes: u64,
        usage: wgpu::BufferUsages,
        max: u64,
    ) -> Buf {
        self.take_mapped(device, label, (bytes, usage, max), false)
            .0
    }

    /// A free buffer of the class, or a new one (mapped at creation when `mapped`); with
    /// whether it is mapped. A class past `max` (the device's limit) would fail where the
    /// request fits: such a request is served exact. For a buffer the host writes (a
    /// `MAP_WRITE` usage), `mapped`: a new one comes mapped and the flag says so (a reused
    /// one is not mapped, and is mapped with `map_async`); created mapped, its zeroing by
    /// wgpu happens here, on the calling thread, so uploads on several threads zero their
    /// buffers side by side.
    pub(crate) fn take_mapped(
        &self,
        device: &wgpu::Device,
        label: &str,
        (bytes, usage, max): (u64, wgpu::BufferUsages, u64),
        mapped: bool,
    ) -> (Buf, bool) {
        let size = Some(class_of(bytes)).filter(|&c| c <= max).unwrap_or(bytes);
        let key = (size, usage);
        let reused = {
            let mut state = self.lock();
            let reused = state.free.get_mut(&key).and_then(Vec::pop);
            match reused {
                Some(_) => state.stats.free_bytes -= size,
                None => state.stats.allocations += 1,
            }
            state.stats.in_use_bytes += size;
            reused
        };
        let (buffer, mapped) = match reused {
            Some(b) => (b, false),
            None => (
                device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(label),
                    size,
                    usage,
                    mapped_at_creation: mapped,
                }),
                mapped,
            ),
        };
        let home = Some((key, self.clone()));
        (Buf::new(buffer, home), mapped)
    }

    /// Marks an encoder of the crate open until the guard is dropped: buffers dropped
    /// meanwhile are not reused before then.
    pub(crate) fn open(&self) -> OpenGuard {
        self.lock().open += 1;
        OpenGuard { pool: self.clone() }
    }

    fn give_back(&self, key: Key, buffer: wgpu::Buffer) {
        let mut state = self.lock();
        state.stats.in_use_bytes -= key.0;
        state.retired.push((key, buffer));
        if state.open == 0 {
            state.recycle();
        }
    }

    /// A buffer of class `key` that will not come back (see [`Buf::keep_out_of_pool`]).
    fn forget(&self, key: Key) {
        self.lock().stats.in_use_bytes -= key.0;
    }

    pub(crate) fn stats(&self) -> MemoryStats {
        self.lock().stats
    }

    /// Drops every free buffer (those in use stay, and return to the pool when dropped).
    pub(crate) fn release(&self) {
        let mut state = self.lock();
        state.free.clear();
        state.stats.free_bytes = 0;
    }
}

/// While alive, an encoder of the crate is being recorded (see [`Pool::open`]).
#[must_use]
pub(crate) struct OpenGuard {
    pool: Pool,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        let mut state = self.pool.lock();
        state.open -= 1;
        if state.open == 0 {
            state.recycle();
        }
    }
}

/// A device buffer, from the pool (returned to it when the last of its clones is dropped) or
/// not. A clone shares the buffer: a readback that maps a result where it lies holds one, so
/// the buffer cannot go to another caller (and be bound or mapped there) while it is mapped,
/// whatever its first holder drops meanwhile.
#[derive(Debug, Clone)]
pub(crate) struct Buf {
    inner: Arc<Held>,
}

#[derive(Debug)]
struct Held {
    buffer: wgpu::Buffer,
    home: Mutex<Option<(Key, Pool)>>,
}

impl Buf {
    fn new(buffer: wgpu::Buffer, home: Option<(Key, Pool)>) -> Self {
        Buf {
            inner: Arc::new(Held {
                buffer,
                home: Mutex::new(home),
            }),
        }
    }

    /// A buffer that is not the pool's (dropped as any buffer is).
    pub(crate) fn unpooled(buffer: wgpu::Buffer) -> Self {
        Buf::new(buffer, None)
    }

    /// Drops this buffer for good when it is dropped, instead of handing it to the next
    /// caller: a staging buffer whose mapping a failed call left pending or mapped would make
    /// the next copy into it a validation error.
    pub(crate) fn keep_out_of_pool(&self) {
        let home = self
            .inner
            .home
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some((key, pool)) = home {
            pool.forget(key);
        }
    }

    /// The buffer itself, out of the pool for good: one that its holder keeps (a layer's
    /// weight) rather than one a call hands back.
    pub(crate) fn detach(self) -> wgpu::Buffer {
        self.keep_out_of_pool();
        self.inner.buffer.clone()
    }
}

impl std::ops::Deref for Buf {
    type Target = wgpu::Buffer;
    fn deref(&self) -> &wgpu::Buffer {
        &self.inner.buffer
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let home = self
            .home
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some((key, pool)) = home {
            pool.give_back(key, self.buffer.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_by_at_most_a_quarter() {
        assert_eq!(class_of(1), MIN_CLASS);
        assert_eq!(class_of(256), 256);
        assert_eq!(class_of(257), 320);
        assert_eq!(class_of(1024), 1024);
        assert_eq!(class_of(1025), 1280);
        for bytes in [300u64, 4097, 1 << 20, (1 << 20) + 1, 3_000_000_007] {
            let c = class_of(bytes);
            assert!(
                c >= bytes && c as f64 <= bytes as f64 * 1.25 + 1.0,
                "{bytes} → {c}"
            );
        }
    }

    #[test]
    fn a_buffer_is_reused_only_once_no_encoder_is_open() {
        let ctx = crate::context::test_context();
        let pool = Pool::default();
        let usage = wgpu::BufferUsages::STORAGE;
        let take = || pool.take(ctx.device(), "t", 1000, usage, u64::MAX);
        let guard = pool.open();
        let a = take();
        let first = (*a).clone();
        drop(a);
        // Retired while an encoder is open: a new request gets a new buffer.
        let b = take();
        assert!(*b != first);
        assert_eq!(pool.stats().allocations, 2);
        drop(guard);
        // Now both are free; the same class reuses them.
        drop(b);
        let c = take();
        let d = take();
        assert_eq!(pool.stats().allocations, 2, "{:?}", pool.stats());
        assert_eq!(pool.stats().in_use_bytes, 2 * 1024);
        drop((c, d));
        assert_eq!(pool.stats().free_bytes, 2 * 1024);
        pool.release();
        assert_eq!(pool.stats().free_bytes, 0);
    }
}
