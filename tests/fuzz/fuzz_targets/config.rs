#![no_main]
//! `cargo +nightly fuzz run --fuzz-dir tests/fuzz config`: see src/fuzz.rs.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    wgpu_attention::fuzz::config(data);
});
