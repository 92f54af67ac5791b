#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod attention;
pub mod bench;
pub mod checkpoint;
pub mod context;
pub mod demo;
pub mod error;
#[doc(hidden)]
pub mod fuzz;
pub mod gpu;
pub mod kernels;
pub mod mask;
pub mod npy;
#[cfg(feature = "plot")]
pub mod plot;
pub mod reference;
pub mod tune;
pub mod verify;

pub use attention::{Attention, Dims, Dtype, Kernels, Output, Plan, Projections};
pub use context::{list_adapters, AdapterSummary, Backend, Context, ContextOptions};
pub use error::{Error, Result};
pub use mask::Mask;
/// The wgpu this crate is built on, for callers who bring their own device.
pub use wgpu;
