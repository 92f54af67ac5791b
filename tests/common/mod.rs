//! Shared by the integration tests: one GPU context per test binary.
//!
//! There is no silent skip: with no adapter the tests fail, naming the fix (CI installs
//! lavapipe, the software Vulkan driver).

#![allow(dead_code)]

use std::sync::OnceLock;

use wgpu_attention::Context;

pub fn ctx() -> &'static Context {
    static CTX: OnceLock<Context> = OnceLock::new();
    // Measuring for the autotuner would only slow the suite: the tests force each variant
    // (tests/tune.rs measures on contexts of its own).
    CTX.get_or_init(|| match Context::new() {
        Ok(c) => c.with_tuning(false),
        Err(e) => panic!("GPU tests need an adapter and none could be opened: {e}"),
    })
}
