//! The first call: where its time goes (`--timings`), tiny calls planned for the least
//! compiling, and `wgpu-attention tune` warming the caches ahead of time (issue 14, item 6).

mod common;

#[test]
fn timings_flag_reports_every_phase_of_demo() {
    let out = common::bin()
        .args(["demo", "--timings"])
        .output()
        .expect("binary runs");
    common::ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("timings"))
        .unwrap_or_else(|| panic!("no timings line in:\n{stderr}"));
    for phase in [
        "adapter",
        "compile",
        "pipelines",
        "tune",
        "upload",
        "record",
        "dispatch",
        "readback",
        "total",
    ] {
        assert!(line.contains(phase), "{phase} missing from {line}");
    }
}

#[test]
fn info_log_has_each_calls_timings() {
    let out = common::bin()
        .args(["demo"])
        .env("RUST_LOG", "wgpu_attention=info")
        .output()
        .expect("binary runs");
    common::ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("timings: adapter") && stderr.contains("dispatch"),
        "{stderr}"
    );
}
