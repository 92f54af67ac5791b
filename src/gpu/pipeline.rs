//! Compiled compute pipelines, created on first use and cached per [`Context`] under a
//! typed [`KernelId`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::context::Context;
use crate::error::Result;

/// Every kernel the crate has: one WGSL file under `shaders/` each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelId {
    /// `shaders/matmul.wgsl`: batched strided matmul with optional bias.
    Matmul,
    /// `shaders/softmax.wgsl`: row-wise scaled softmax with causal mask.
    Softmax,
    /// `shaders/weighted_sum.wgsl`: attention weights times values.
    WeightedSum,
}

impl KernelId {
    /// All kernels, for tests that validate every shader.
    pub const ALL: [KernelId; 3] = [KernelId::Matmul, KernelId::Softmax, KernelId::WeightedSum];

    /// The WGSL file name (also the pipeline's label).
    pub fn file_name(self) -> &'static str {
        match self {
            KernelId::Matmul => "matmul.wgsl",
            KernelId::Softmax => "softmax.wgsl",
            KernelId::WeightedSum => "weighted_sum.wgsl",
        }
    }

    /// The WGSL source.
    pub fn source(self) -> &'static str {
        match self {
            KernelId::Matmul => include_str!("../../shaders/matmul.wgsl"),
            KernelId::Softmax => include_str!("../../shaders/softmax.wgsl"),
            KernelId::WeightedSum => include_str!("../../shaders/weighted_sum.wgsl"),
        }
    }

    /// The entry point every kernel uses.
    pub const ENTRY: &'static str = "main";
}

/// The cache: one pipeline per kernel, built once per context.
#[derive(Default)]
pub struct PipelineCache {
    pipelines: Mutex<HashMap<KernelId, Arc<wgpu::ComputePipeline>>>,
}

impl PipelineCache {
    /// The pipeline for `id`, compiling it on first use (inside the caller's error scope).
    pub fn get(&self, ctx: &Context, id: KernelId) -> Result<Arc<wgpu::ComputePipeline>> {
        let mut map = self
            .pipelines
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(p) = map.get(&id) {
            return Ok(Arc::clone(p));
        }
        let module = ctx
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(id.file_name()),
                source: wgpu::ShaderSource::Wgsl(id.source().into()),
            });
        let pipeline = ctx
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(id.file_name()),
                layout: None,
                module: &module,
                entry_point: Some(KernelId::ENTRY),
                compilation_options: Default::default(),
                cache: None,
            });
        let pipeline = Arc::new(pipeline);
        map.insert(id, Arc::clone(&pipeline));
        Ok(pipeline)
    }
}
