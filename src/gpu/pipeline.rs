//! Compiled compute pipelines, created on first use and cached per [`Context`] under a
//! typed [`PipelineKey`]: the kernel and the compile-time constants it was built with.

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
    /// `shaders/flash_tiled.wgsl`: fused attention from storage buffers, workgroup tiles.
    FlashTiled,
    /// `shaders/flash_subgroup.wgsl`: fused attention from textures, subgroup shuffles.
    FlashSubgroup,
    /// `shaders/pack.wgsl`: per-head rows of a storage buffer into an `rgba32float` texture.
    Pack,
}

impl KernelId {
    /// All kernels, for tests that validate every shader.
    pub const ALL: [KernelId; 6] = [
        KernelId::Matmul,
        KernelId::Softmax,
        KernelId::WeightedSum,
        KernelId::FlashTiled,
        KernelId::FlashSubgroup,
        KernelId::Pack,
    ];

    /// The WGSL file name (also the pipeline's label).
    pub fn file_name(self) -> &'static str {
        match self {
            KernelId::Matmul => "matmul.wgsl",
            KernelId::Softmax => "softmax.wgsl",
            KernelId::WeightedSum => "weighted_sum.wgsl",
            KernelId::FlashTiled => "flash_tiled.wgsl",
            KernelId::FlashSubgroup => "flash_subgroup.wgsl",
            KernelId::Pack => "pack.wgsl",
        }
    }

    /// The WGSL source as stored, without the constants the host prepends.
    pub fn source(self) -> &'static str {
        match self {
            KernelId::Matmul => include_str!("../../shaders/matmul.wgsl"),
            KernelId::Softmax => include_str!("../../shaders/softmax.wgsl"),
            KernelId::WeightedSum => include_str!("../../shaders/weighted_sum.wgsl"),
            KernelId::FlashTiled => include_str!("../../shaders/flash_tiled.wgsl"),
            KernelId::FlashSubgroup => include_str!("../../shaders/flash_subgroup.wgsl"),
            KernelId::Pack => include_str!("../../shaders/pack.wgsl"),
        }
    }

    /// Names of the `u32` constants the host prepends to the source, in [`PipelineKey`]
    /// order. They size private arrays and unroll loops, which WGSL `override`s cannot.
    pub fn constants(self) -> &'static [&'static str] {
        match self {
            KernelId::FlashTiled => &["BK", "DK4", "DV4"],
            KernelId::FlashSubgroup => &["SG", "R", "DK4", "DV4"],
            _ => &[],
        }
    }

    /// Whether the kernel uses subgroup operations (needs `Features::SUBGROUP`).
    pub fn needs_subgroups(self) -> bool {
        matches!(self, KernelId::FlashSubgroup)
    }

    /// The full WGSL text for `consts` (one value per name in [`KernelId::constants`]).
    pub fn source_with(self, consts: &[u32]) -> String {
        let mut text = String::new();
        for (name, value) in self.constants().iter().zip(consts) {
            text.push_str(&format!("const {name}: u32 = {value}u;\n"));
        }
        text.push_str(self.source());
        text
    }

    /// The entry point every kernel uses.
    pub const ENTRY: &'static str = "main";
}

/// What a cached pipeline is built from: a kernel and its prepended constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PipelineKey {
    /// The kernel.
    pub kernel: KernelId,
    /// Its constants, in [`KernelId::constants`] order (unused slots 0).
    pub consts: [u32; 4],
}

impl From<KernelId> for PipelineKey {
    fn from(kernel: KernelId) -> Self {
        PipelineKey {
            kernel,
            consts: [0; 4],
        }
    }
}

/// The cache: one pipeline per key, built once per context.
#[derive(Default)]
pub struct PipelineCache {
    pipelines: Mutex<HashMap<PipelineKey, Arc<wgpu::ComputePipeline>>>,
}

impl PipelineCache {
    /// The pipeline for `key`, compiling it on first use (inside the caller's error scope).
    pub fn get(&self, ctx: &Context, key: PipelineKey) -> Result<Arc<wgpu::ComputePipeline>> {
        let mut map = self
            .pipelines
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(p) = map.get(&key) {
            return Ok(Arc::clone(p));
        }
        let id = key.kernel;
        let source = id.source_with(&key.consts[..id.constants().len()]);
        let module = ctx
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(id.file_name()),
                source: wgpu::ShaderSource::Wgsl(source.into()),
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
        map.insert(key, Arc::clone(&pipeline));
        Ok(pipeline)
    }
}
