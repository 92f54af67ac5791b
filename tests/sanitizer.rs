//! The WGSL sanitizer wired into the crate (`Context::with_sanitizer`,
//! `WGPU_ATTENTION_SANITIZE`, `verify --sanitize`): calls planned as a GPU with 32- and
//! 64-lane subgroups, every dispatch interpreted on the native kernels, right against the f64
//! reference; and a real kernel with a barrier removed, or a loop bound one past, reported
//! at its line.

mod common;

use wgpu_attention::internals::{BlockedOptions, Sanitize};
use wgpu_attention::verify::{self, Case, ModsCase};
use wgpu_attention::{Context, Dtype, Error, Kernels, TuneCache};

/// A context under the sanitizer at `lanes` (flash_blocked's subgroup reductions on where the
/// width allows: their rank counter is initialised by the workgroup itself since the
/// sanitizer found it read before any write).
fn sanitized(lanes: u32) -> Context {
    common::isolate();
    Context::new()
        .expect("GPU tests need an adapter")
        .with_sanitizer(Sanitize::Lanes(lanes))
        .with_tuning(false)
        .with_tune_cache(TuneCache::at(None))
}

/// Grouped-query attention (4 query heads on 2 K/V heads), causal with a window 4 keys
/// back, on Q, K, V.
fn window_gqa(kernels: Kernels, fused: bool, dtype: Dtype) -> Case {
    Case::new(19, 16, 32, 32)
        .sdpa((23, 2))
        .heads(4)
        .batch(2)
        .causal(true)
        .mods(ModsCase::WindowLeft)
        .kernels(kernels)
        .fused(fused)
        .dtype(dtype)
}

#[test]
fn the_sanitizer_plans_as_a_gpu_of_its_width() {
    let ctx = sanitized(64);
    assert_eq!(ctx.sanitizing(), Sanitize::Lanes(64));
    let info = ctx.adapter_info();
    assert!(
        info.name.contains("WGSL sanitizer") && info.name.contains("64-lane"),
        "{}",
        info.name
    );
    assert_eq!(
        info.device_type,
        wgpu_attention::wgpu::DeviceType::DiscreteGpu
    );
    assert_eq!(ctx.subgroup_size(), Some(64));
    assert_eq!(ctx.limits().max_compute_workgroup_storage_size, 48 << 10);
    let coop = ctx
        .coop_shape()
        .expect("cooperative matrices, as an H100's");
    assert_eq!(coop.size, 16);
    assert_eq!(ctx.sanitizer_summary().total_dispatches(), 0);
    for (text, want) in [("32", Sanitize::Lanes(32)), ("16", Sanitize::Lanes(16))] {
        assert_eq!(text.parse::<Sanitize>().unwrap(), want);
    }
}

#[test]
fn calls_under_the_sanitizer_match_the_reference_at_32_and_64_lanes() {
    for lanes in [32, 64] {
        let ctx = sanitized(lanes);
        let mut cases = Vec::new();
        for dtype in [Dtype::F32, Dtype::F16] {
            for fused in [false, true] {
                cases.push(window_gqa(Kernels::Storage, fused, dtype));
            }
        }
        // The subgroup family's fused kernel at the sanitizer's width, on textures.
        cases.push(window_gqa(Kernels::Subgroup, true, Dtype::F32));
        for (i, case) in cases.iter().enumerate() {
            let r = verify::run_case(&ctx, case, 7 + i as u64)
                .unwrap_or_else(|e| panic!("{lanes} lanes, {case}: {e}"));
            assert!(r.passed(), "{lanes} lanes: {r}");
        }
        let summary = ctx.sanitizer_summary();
        assert_eq!(summary.total_errors(), 0, "{summary}");
        assert_eq!(summary.failed, 0, "{summary}");
        for kernel in ["flash_blocked.wgsl", "flash_subgroup.wgsl", "softmax.wgsl"] {
            assert!(summary.dispatches.contains_key(kernel), "{summary}");
        }
        assert!(
            summary.to_string().contains(&format!("{lanes}-lane")),
            "{summary}"
        );
    }
}

/// flash_blocked without its row reduction's barrier (SGR off: the partial maxima go
/// through `red`): the rows' threads read `red` while others write it.
fn without_the_reduction_barrier(kernel: &str, text: &str) -> Option<String> {
    if kernel != "flash_blocked.wgsl" {
        return None;
    }
    let at = text.find("red[li] = mx;")?;
    let barrier = at + text[at..].find("workgroupBarrier();")?;
    Some(format!(
        "{}{}",
        &text[..barrier],
        &text[barrier + "workgroupBarrier();".len()..]
    ))
}

#[test]
fn a_removed_barrier_in_a_real_kernel_is_a_race_at_its_line() {
    // The barrier removed is the workgroup-memory reduction's (`red`), which the subgroup
    // reductions skip: those are off here.
    let ctx = sanitized(32)
        .with_blocked_options(BlockedOptions::default().subgroups(false))
        .with_sanitizer_edit(without_the_reduction_barrier);
    let case = window_gqa(Kernels::Storage, true, Dtype::F32);
    let err = verify::run_case(&ctx, &case, 7).expect_err("a race");
    let Error::Sanitizer { kernel, message } = &err else {
        panic!("not the sanitizer's error: {err}");
    };
    assert!(kernel.starts_with("flash_blocked.wgsl"), "{kernel}");
    assert!(
        message.contains("data race on workgroup memory") && message.contains("`red`"),
        "{message}"
    );
    // The line in the kernel's own file: the write or the read of `red`.
    let file = include_str!("../shaders/flash_blocked.wgsl");
    let line_of = |code: &str| {
        file.lines()
            .position(|l| l.trim().starts_with(code))
            .map(|i| format!("shaders/flash_blocked.wgsl:{}", i + 1))
            .expect(code)
    };
    let (write, read) = (line_of("red[li] = mx;"), line_of("m_new = max(m_new, red["));
    assert!(
        message.contains(&write) || message.contains(&read),
        "{write} or {read} in: {message}"
    );
    assert!(ctx.sanitizer_summary().total_errors() > 0);
    assert!(
        message.contains("WGPU_ATTENTION_SANITIZE_SEED=0 reproduces it"),
        "{message}"
    );
}

#[test]
fn several_seeds_report_the_one_that_found_it_and_it_alone_reproduces_it() {
    // Three schedules per dispatch from seed 5: a clean call stays right under each, and a
    // race is reported with a seed of those three.
    let clean = sanitized(32).with_sanitizer_seeds(3);
    let case = window_gqa(Kernels::Storage, true, Dtype::F32);
    verify::run_case(&clean, &case, 7).expect("right under three seeds");
    assert_eq!(clean.sanitizer_summary().seeds, 3);
    assert!(clean
        .sanitizer_summary()
        .to_string()
        .contains("under 3 seeds"));

    let racy = sanitized(32)
        .with_sanitizer_seeds(3)
        .with_blocked_options(BlockedOptions::default().subgroups(false))
        .with_sanitizer_edit(without_the_reduction_barrier);
    let err = verify::run_case(&racy, &case, 7).expect_err("a race");
    let message = err.to_string();
    assert!(
        message.contains("WGPU_ATTENTION_SANITIZE_SEED=0 reproduces it"),
        "the first seed with an error is reported: {message}"
    );
}

/// softmax with its writing loop's bound one past (`<=`): each row also writes the next
/// row's first weight.
fn softmax_one_past(kernel: &str, text: &str) -> Option<String> {
    let bound = "for (var j = li; j < p.cols; j += WG) {";
    (kernel == "softmax.wgsl" && text.contains(bound))
        .then(|| text.replace(bound, "for (var j = li; j <= p.cols; j += WG) {"))
}

#[test]
fn a_loop_bound_one_past_in_a_real_kernel_is_reported_at_its_line() {
    let ctx = sanitized(32).with_sanitizer_edit(softmax_one_past);
    let case = window_gqa(Kernels::Storage, false, Dtype::F32);
    let err = verify::run_case(&ctx, &case, 7).expect_err("a write one past");
    let Error::Sanitizer { kernel, message } = &err else {
        panic!("not the sanitizer's error: {err}");
    };
    assert!(kernel.starts_with("softmax.wgsl"), "{kernel}");
    // Row r's extra write lands on row r + 1's first weight, which row r + 1's workgroup
    // writes too (or, past the last row, outside the buffer).
    assert!(
        message.contains("data race on a storage resource")
            || message.contains("index out of bounds"),
        "{message}"
    );
    // The extra write's line in the kernel's own file.
    let file = include_str!("../shaders/softmax.wgsl");
    let write = file
        .lines()
        .position(|l| l.trim() == "s[base + j] = w;")
        .map(|i| format!("shaders/softmax.wgsl:{}", i + 1))
        .expect("softmax's write");
    assert!(message.contains(&write), "{write} in: {message}");
}
