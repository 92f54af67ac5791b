//! The GPU plumbing in data-flow order: [`buffer`] (upload and allocation, checked against
//! the device's limits), [`texture`] (the `rgba32float` operand textures of the subgroup
//! kernels), [`pipeline`] (the compiled kernels, cached under a typed key), [`timing`]
//! (timestamp queries per kernel, for benchmarks) and [`readback`] (copy to staging, map,
//! wait: the one place that polls the device).

pub mod buffer;
pub mod pipeline;
pub mod readback;
pub mod texture;
pub mod timing;
