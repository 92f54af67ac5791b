#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

// The public surface: the context, the op and its inputs and outputs, masks, errors,
// checkpoints, `.npy` I/O, the CPU reference and verify.
pub mod attention;
pub mod checkpoint;
pub mod context;
pub mod decode;
pub mod demo;
pub mod error;
pub mod mask;
pub mod npy;
#[cfg(feature = "plot")]
pub mod plot;
pub mod reference;
pub mod tensor;
pub mod verify;

// The machinery behind it, free to change: GPU plumbing, kernels, the tuner, timing.
mod gpu;
mod kernels;
mod phases;
mod timing;
mod tune;
mod variant;

// For the binary and the benches only: not part of the API, and may change at any time.
#[doc(hidden)]
pub mod bench;
#[doc(hidden)]
pub mod fuzz;

pub use attention::{Adam, MseLoss};
pub use attention::{
    Attention, Device, Dims, Dtype, Gradients, Host, Inputs, Kind, Layer, Operand, Options,
    Output, Plan, Projections, Saved,
};
pub use context::{list_adapters, AdapterSummary, Backend, Context, ContextOptions, CoopShape};
pub use decode::{CacheElement, Decoder, KvCache, KvCacheSpec};
pub use error::{Error, Result};
pub use gpu::pool::MemoryStats;
/// The half (2) whose `f16` an f16 [`KvCache`] takes.
pub use half;
pub use kernels::flash_blocked::BlockedOptions;
pub use mask::Mask;
/// The ndarray (0.17) whose arrays and views the API takes and returns.
pub use ndarray;
pub use phases::PhaseTimes;
pub use tensor::{Recorder, Tensor};
pub use timing::{KernelTime, Profiling};
pub use tune::TuneCache;
pub use variant::{FlashVariant, Kernels, KeySplit, MatmulVariant};
/// The wgpu this crate is built on, for callers who bring their own device.
pub use wgpu;
