//! The GPU plumbing in data-flow order: [`buffer`] (upload and allocation, checked against
//! the device's limits), [`texture`] (the `rgba32float` operand textures of the subgroup
//! kernels), [`pool`] (intermediates reused across calls), [`pipeline`] (the compiled kernels, cached under a typed key) and [`readback`]
//! (copy to staging, map, wait: the one place that polls the device).

pub(crate) mod buffer;
pub(crate) mod oneshot;
pub(crate) mod pipeline;
pub(crate) mod pool;
pub(crate) mod readback;
pub(crate) mod texture;
