//! For tools (the command line, the benches, kernel tests and tuning scripts): what names the
//! kernels behind a call. The variants a call can be forced to ([`FlashVariant`],
//! [`MatmulVariant`], through [`crate::Options`]), how the fused kernel splits its keys
//! ([`KeySplit`]) and runs its inner loop ([`BlockedOptions`], through
//! [`crate::Context::with_blocked_options`]), what a call will run ([`Plan`], from
//! [`crate::Attention::plan`]; [`TINY_ROWS`]), the cooperative-matrix shape a device offers
//! ([`CoopShape`]), the GPU stand-in ([`StandIn`]) and the WGSL sanitizer ([`Sanitize`],
//! [`SanitizerSummary`], [`LoopPeak`]).
//!
//! These follow the kernels, not the op: a release may add, rename or remove any of them.
//! A program that only computes attention needs none of them; the defaults suit every
//! adapter.

pub use crate::attention::plan::{Plan, TINY_ROWS};
pub use crate::gpu::coop::CoopShape;
pub use crate::gpu::hardware::StandIn;
pub use crate::gpu::sanitizer::{LoopPeak, Sanitize, SanitizerSummary};
pub use crate::kernels::flash::FlashVariant;
pub use crate::kernels::flash_blocked::BlockedOptions;
pub use crate::kernels::flash_combine::KeySplit;
pub use crate::variant::MatmulVariant;
