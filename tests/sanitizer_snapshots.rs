//! The WGSL sanitizer's tests run frozen copies of real kernels
//! (`crates/wgsl-sanitizer/tests/kernels/*.wgsl`, so that they need not build this crate):
//! each is a file `wgpu-attention shaders --out DIR` writes. This fails when a copy has
//! drifted from what the crate composes now, and says how to regenerate it;
//! `WGPU_ATTENTION_SNAPSHOTS=write cargo test --test sanitizer_snapshots` rewrites them.

use std::path::Path;

/// `(file under the shaders command's DIR, snapshot under the sanitizer's tests/kernels)`.
const SNAPSHOTS: [(&str, &str); 3] = [
    ("storage/matmul-f32.wgsl", "matmul-f32.wgsl"),
    (
        "storage/flash-blocked-32x64-d32-f32.wgsl",
        "flash-blocked-32x64-d32-f32.wgsl",
    ),
    (
        "coop/coop-matmul-16-f16-ab.wgsl",
        "coop-matmul-16-f16-ab.wgsl",
    ),
];

/// The first line where `a` and `b` differ (1-based), with both sides.
fn first_difference(a: &str, b: &str) -> (usize, String, String) {
    let (mut la, mut lb) = (a.lines(), b.lines());
    for n in 1.. {
        match (la.next(), lb.next()) {
            (Some(x), Some(y)) if x == y => continue,
            (None, None) => break,
            (x, y) => {
                let show = |l: Option<&str>| l.unwrap_or("(end of file)").trim().to_string();
                return (n, show(x), show(y));
            }
        }
    }
    // Same lines, other line endings or final newline.
    (0, String::new(), String::new())
}

#[test]
fn the_sanitizers_kernel_snapshots_are_what_the_shaders_command_writes() {
    let out = tempfile::tempdir().expect("a temporary directory");
    wgpu_attention::bench::write_shaders(out.path(), None).expect("shaders --out");
    let kernels = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/wgsl-sanitizer/tests/kernels");
    let rewrite = std::env::var("WGPU_ATTENTION_SNAPSHOTS").is_ok_and(|v| v == "write");
    let mut drifted = Vec::new();
    for (generated, snapshot) in SNAPSHOTS {
        let now = std::fs::read_to_string(out.path().join(generated))
            .unwrap_or_else(|e| panic!("`shaders --out` wrote no {generated}: {e}"));
        let frozen = std::fs::read_to_string(kernels.join(snapshot))
            .unwrap_or_else(|e| panic!("no snapshot {snapshot}: {e}"));
        if now != frozen && rewrite {
            std::fs::write(kernels.join(snapshot), &now)
                .unwrap_or_else(|e| panic!("writing {snapshot}: {e}"));
            println!("rewrote {snapshot}");
        } else if now != frozen {
            let (line, was, is) = first_difference(&frozen, &now);
            drifted.push(format!(
                "  {snapshot} (from {generated}): line {line} was `{was}`, is now `{is}`"
            ));
        }
    }
    let copies: Vec<String> = SNAPSHOTS
        .iter()
        .map(|(g, s)| format!("  cp DIR/{g} crates/wgsl-sanitizer/tests/kernels/{s}"))
        .collect();
    assert!(
        drifted.is_empty(),
        "the sanitizer's kernel snapshots have drifted from the kernels:\n{}\n\
         Regenerate them: `WGPU_ATTENTION_SNAPSHOTS=write cargo test --test \
         sanitizer_snapshots`, or by hand:\n  cargo run --bin wgpu-attention -- shaders --out DIR\n{}\n\
         Then check the barrier lines crates/wgsl-sanitizer/tests/real_kernels.rs names \
         (flash_blocked_without_any_one_of_its_barriers_races), note the date in \
         crates/wgsl-sanitizer/tests/kernels/README.md, and run `cargo test -p wgsl-sanitizer`.",
        drifted.join("\n"),
        copies.join("\n")
    );
}
