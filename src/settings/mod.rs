//! What a [`crate::Context`] carries above its device: the fused GPU kernel's inner-loop
//! options ([`BlockedOptions`], defined beside that kernel, which reads them), the tuner's
//! remembered choices ([`TuneCache`]) and whether the tuner may measure. Above the kernels;
//! below the context that composes a device with them, and the variants and the tuner that
//! read them through it.

mod tune_cache;

pub use tune_cache::TuneCache;

use crate::kernels::flash_blocked::BlockedOptions;

/// A context's settings.
pub(crate) struct Settings {
    /// How `flash_blocked` runs its inner loop ([`crate::Context::with_blocked_options`]).
    pub blocked: BlockedOptions,
    /// The tuner's remembered choices ([`crate::Context::with_tune_cache`]).
    pub tune: TuneCache,
    /// Whether the tuner may measure ([`crate::Context::with_tuning`]).
    pub tuning: bool,
}

impl Settings {
    /// The defaults: the adapter's own inner-loop choices, the cache [`TuneCache::from_env`]
    /// names, and measuring unless `WGPU_ATTENTION_TUNE=off`. The tuner times runs by
    /// blocking on the device, which the browser cannot do: there every kernel is its
    /// family's default.
    pub fn from_env() -> Self {
        Settings {
            blocked: BlockedOptions::default(),
            tune: TuneCache::from_env(),
            tuning: tuning_enabled() && cfg!(not(target_arch = "wasm32")),
        }
    }
}

/// Whether measuring is on by default (`WGPU_ATTENTION_TUNE` is not `off`); see
/// [`crate::Context::with_tuning`].
pub(crate) fn tuning_enabled() -> bool {
    !std::env::var("WGPU_ATTENTION_TUNE").is_ok_and(|v| v.eq_ignore_ascii_case("off"))
}
