//! `shaders/bias_grad_reduce.wgsl`: a relative bias table's gradient from the diagonal sums
//! of `bias_grad.wgsl`, one thread per (bucket, head); dispatched by
//! [`super::flash_tiled::Flash::dispatch_bias_grad`].

use super::loops::{run, Build};
use super::wgsl::{uniform, NoConstants};
use super::{Dim, Kernel, KernelId, Slot};

/// The kernel.
pub(crate) struct Shader;

/// Threads per workgroup (the shader's `@workgroup_size`).
pub(crate) const THREADS: u64 = 64;

uniform! {
    /// The uniform block of `bias_grad_reduce.wgsl`.
    pub(crate) struct ReduceParams {
        batch: u32,
        heads: u32,
        diags: u32,
        buckets: u32,
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::BiasGradReduce;
    const WORKGROUP: [Dim; 3] = [Dim::Fixed(THREADS as u32), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Read("diag"),
        Slot::Read("bucket_of"),
        Slot::ReadWrite("table"),
    ];
    type Consts = NoConstants;
    type Params = ReduceParams;

    /// The loop over the batch, each over every diagonal.
    fn loops(_: &NoConstants, p: &ReduceParams, _: Build) -> u64 {
        let batch = u64::from(p.batch);
        run(batch) + batch * run(u64::from(p.diags))
    }
}
