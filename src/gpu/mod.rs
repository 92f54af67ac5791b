//! The device layer, the crate's ground floor: it knows wgpu and nothing of kernels, settings
//! or the op. [`device`] (the open device, its limits, error scopes and the features the
//! kernels need, [`coop`] among them), then the plumbing in data-flow order: [`buffer`]
//! (allocation, checked against the device's limits), [`upload`] (host arrays in one pass,
//! checked on the way), [`texture`] (the
//! `rgba32float` operand textures of the subgroup kernels), [`pool`] (intermediates reused
//! across calls), [`pipeline`] (the compiled kernels, cached under an opaque hash of the
//! kernels' key), [`timing`] (per-pass times while profiling, and the wall-clock
//! measurements) and [`readback`] (copy to staging, map, wait: the one place that polls the
//! device).

pub(crate) mod buffer;
pub(crate) mod coop;
pub(crate) mod device;
pub(crate) mod hardware;
pub(crate) mod oneshot;
pub(crate) mod pipeline;
pub(crate) mod pool;
pub(crate) mod readback;
pub(crate) mod sanitizer;
pub(crate) mod subgroups;
pub(crate) mod texture;
pub(crate) mod timing;
pub(crate) mod unroll;
pub(crate) mod upload;

pub use device::Gpu;
