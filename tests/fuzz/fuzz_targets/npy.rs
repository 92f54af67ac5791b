#![no_main]
//! `cargo +nightly fuzz run --fuzz-dir tests/fuzz npy`: see src/fuzz.rs.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    wgpu_attention::fuzz::npy(data);
});
