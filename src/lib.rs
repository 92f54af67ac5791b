#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod attention;
pub mod bench;
pub mod context;
pub mod demo;
pub mod error;
pub mod gpu;
pub mod kernels;
pub mod npy;
pub mod plot;
pub mod reference;
pub mod tune;
pub mod verify;

pub use attention::{Attention, Dims, Kernels, Output, Plan, Projections};
pub use context::{list_adapters, AdapterSummary, Backend, Context, ContextOptions};
pub use error::{Error, Result};
/// The wgpu this crate is built on, for callers who bring their own device.
pub use wgpu;
