//! Per-kernel GPU times from timestamp queries, for `bench`: while profiling is on, every
//! compute pass a forward pass records writes a timestamp at its start and end, and the
//! readback resolves them into milliseconds per kernel.

use crate::context::Context;
use crate::gpu::readback::{self, Pending};

/// Passes one forward pass can time.
const CAPACITY: u32 = 64;

/// The time one compute pass took on the GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelTime {
    /// The kernel's file name.
    pub kernel: &'static str,
    /// Milliseconds between the pass's start and end timestamps.
    pub ms: f64,
}

/// Timestamp queries for the passes of one submission.
pub(crate) struct Profiler {
    set: wgpu::QuerySet,
    labels: Vec<&'static str>,
}

impl Profiler {
    pub(crate) fn new(ctx: &Context) -> Self {
        let set = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("kernel timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: 2 * CAPACITY,
        });
        Profiler {
            set,
            labels: Vec::new(),
        }
    }

    /// Timestamp writes for the next pass, `None` once the set is full.
    pub(crate) fn next(
        &mut self,
        label: &'static str,
    ) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        let i = self.labels.len() as u32;
        if i >= CAPACITY {
            return None;
        }
        self.labels.push(label);
        Some(wgpu::ComputePassTimestampWrites {
            query_set: &self.set,
            beginning_of_pass_write_index: Some(2 * i),
            end_of_pass_write_index: Some(2 * i + 1),
        })
    }

    /// Records the resolve and the copy out; returns what to read back and the labels.
    pub(crate) fn resolve(
        self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
    ) -> Option<(Pending, Vec<&'static str>)> {
        let count = 2 * self.labels.len() as u32;
        if count == 0 {
            return None;
        }
        let bytes = u64::from(count) * 8;
        let resolved = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("resolved timestamps"),
            size: bytes,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        encoder.resolve_query_set(&self.set, 0..count, &resolved, 0);
        // Read as f32 words; `times` puts the u64 ticks back together.
        let pending = readback::copy_out(ctx, encoder, &resolved, 2 * count as usize);
        Some((pending, self.labels))
    }
}

/// Pairs of u64 ticks (read back as f32 words) into milliseconds per pass.
pub(crate) fn times(words: &[f32], labels: &[&'static str], period_ns: f32) -> Vec<KernelTime> {
    let ticks: Vec<u64> = words
        .chunks_exact(2)
        .map(|w| u64::from(w[0].to_bits()) | (u64::from(w[1].to_bits()) << 32))
        .collect();
    labels
        .iter()
        .zip(ticks.chunks_exact(2))
        .map(|(&kernel, t)| KernelTime {
            kernel,
            ms: t[1].saturating_sub(t[0]) as f64 * f64::from(period_ns) * 1e-6,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_reassemble_from_words() {
        let begin: u64 = 5_000_000_000;
        let end: u64 = begin + 2_500_000;
        let words: Vec<f32> = [begin, end]
            .iter()
            .flat_map(|t| [f32::from_bits(*t as u32), f32::from_bits((*t >> 32) as u32)])
            .collect();
        let t = times(&words, &["k"], 1.0);
        assert_eq!(t.len(), 1);
        assert!((t[0].ms - 2.5).abs() < 1e-9);
    }
}
