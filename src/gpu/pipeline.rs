//! Compiled compute pipelines, created on first use and cached per [`Context`] under the
//! typed [`PipelineKey`] a kernel's description derives (see [`crate::kernels`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::context::Context;
use crate::error::Result;
use crate::kernels::PipelineKey;

/// The cache: one pipeline per key, built once per context.
#[derive(Default)]
pub(crate) struct PipelineCache {
    pipelines: Mutex<HashMap<PipelineKey, Arc<wgpu::ComputePipeline>>>,
}

impl PipelineCache {
    /// The pipeline for `key`, compiling it on first use (inside the caller's error scope).
    pub(crate) fn get(
        &self,
        ctx: &Context,
        key: PipelineKey,
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        let mut map = self
            .pipelines
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(p) = map.get(&key) {
            return Ok(Arc::clone(p));
        }
        let info = key.kernel.info();
        let module = ctx
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(info.file),
                source: wgpu::ShaderSource::Wgsl(key.source().into()),
            });
        let pipeline = ctx
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(info.file),
                layout: None,
                module: &module,
                entry_point: Some(info.entry),
                compilation_options: Default::default(),
                cache: None,
            });
        let pipeline = Arc::new(pipeline);
        map.insert(key, Arc::clone(&pipeline));
        Ok(pipeline)
    }
}
