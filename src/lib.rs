//! Scaled dot-product attention in WGSL compute shaders on [`wgpu`], on any Vulkan, Metal,
//! DX12 or GL adapter (and lavapipe, Mesa's software Vulkan, where there is no GPU), checked
//! against an f64 CPU [`reference`](mod@reference).
//!
//! Three steps: describe the op ([`Attention`]), give it [`Inputs`] (arrays, or device
//! [`Tensor`]s), and run it now ([`Attention::run`], [`Attention::run_async`]) or record it
//! into a [`Recorder`] ([`Attention::record`]). Every forward returns one [`Output`]; a saved
//! forward's [`Saved::backward`] returns one [`Gradients`]. A [`Layer`] keeps its projection
//! weights on the device; a [`KvCache`] and a [`Decoder`] generate token by token.
//!
//! ```
//! use wgpu_attention::ndarray::Array4;
//! use wgpu_attention::{Attention, Context, Inputs, Mask};
//!
//! # fn main() -> wgpu_attention::Result<()> {
//! let ctx = Context::new()?;
//! // PyTorch's scaled_dot_product_attention(q, k, v, is_causal=True): (batch, heads, L, E).
//! let q = Array4::from_shape_fn((1, 2, 5, 8), |(_, h, i, e)| ((h * 40 + i * 8 + e) as f32 * 0.1).sin());
//! let (k, v) = (q.clone(), q.mapv(|x| 2.0 * x));
//! let lengths = Mask::none().with_kv_lengths(&[4]); // the fifth key is padding
//! let out = Attention::new().causal(true).run(&ctx, Inputs::qkv(&q, &k, &v).mask(&lengths))?;
//! assert_eq!(out.context.shape(), &[1, 2, 5, 8]);
//! let weights = out.weights.unwrap(); // (batch, heads, L, S)
//! assert_eq!(weights[[0, 0, 4, 4]], 0.0);
//! # Ok(()) }
//! ```
//!
//! Guides (shapes and mask semantics, the command line, decoding, training, kernels and
//! tuning, architecture, testing) are in the repository's `docs/`; `README.md` has the
//! set-up and current results.
#![warn(missing_docs)]

// The public surface: the context, the op and its inputs and outputs, masks, errors,
// checkpoints, `.npy` I/O, the CPU reference and verify; and, for tools, the names of the
// kernels behind a call (`internals`).
pub mod attention;
pub mod checkpoint;
pub mod context;
pub mod decode;
pub mod demo;
pub mod error;
pub mod internals;
pub mod mask;
pub mod modifiers;
pub mod npy;
#[cfg(feature = "plot")]
pub mod plot;
pub mod reference;
pub mod tensor;
pub mod verify;

// The machinery behind it, free to change: GPU plumbing, kernels, the tuner, timing.
mod dtype;
mod gpu;
mod kernels;
mod phases;
mod setters;
mod settings;
mod tune;
mod values;
mod variant;

// For the binary and the benches only: not part of the API, and may change at any time.
#[doc(hidden)]
pub mod bench;
#[doc(hidden)]
pub mod fuzz;
#[doc(hidden)]
pub mod profile;

pub use attention::{Adam, MseLoss};
pub use attention::{
    Attention, Dims, Files, Gradients, Host, Inputs, Kind, Layer, OnDevice, Operand, Options,
    Output, Projections, Saved,
};
pub use context::{
    default_adapter, list_adapters, AdapterSummary, Backend, Context, ContextOptions,
};
pub use decode::{CacheElement, Decoder, KvCache, KvCacheSpec};
pub use dtype::Dtype;
pub use error::{Error, Limit, Result};
pub use gpu::pool::MemoryStats;
pub use gpu::timing::{KernelTime, Profiling};
/// The half (2) whose `f16` an f16 [`KvCache`] takes.
pub use half;
pub use mask::Mask;
pub use modifiers::{BufferData, ModBuffer, Modifiers, Preset};
/// The ndarray (0.17) whose arrays and views the API takes and returns.
pub use ndarray;
pub use phases::PhaseTimes;
pub use settings::TuneCache;
pub use tensor::{Recorder, Tensor};
pub use variant::Kernels;
/// The wgpu this crate is built on, for callers who bring their own device.
pub use wgpu;

// Every Rust example of the README and the guides is a doctest: `cargo test` runs them.
#[cfg(doctest)]
mod guides {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[doc = include_str!("../docs/library.md")]
    struct Library;
    #[doc = include_str!("../docs/semantics.md")]
    struct Semantics;
    #[doc = include_str!("../docs/cli.md")]
    struct CommandLine;
    #[doc = include_str!("../docs/decoding.md")]
    struct Decoding;
    #[doc = include_str!("../docs/training.md")]
    struct Training;
    #[doc = include_str!("../docs/browser.md")]
    struct Browser;
    #[doc = include_str!("../docs/kernels.md")]
    struct Kernels;
    #[doc = include_str!("../docs/architecture.md")]
    struct Architecture;
    #[doc = include_str!("../docs/testing.md")]
    struct Testing;
    #[doc = include_str!("../docs/RESULTS.md")]
    struct Results;
}
