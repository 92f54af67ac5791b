//! The tests write nothing into the user's home: the autotuner's cache, the one file the
//! crate writes on its own, goes to the tests' temporary directory (`tests/common`), both
//! from the library in the test process and from the CLI the tests start.
//!
//! One test in this binary: it points `HOME` at an empty directory for the whole process.

mod common;

use ndarray::Array2;
use wgpu_attention::{Attention, Context, Inputs, Kernels, Options};

/// Every file under `dir`, relative to it.
fn files(dir: &std::path::Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else {
                found.push(path.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    found
}

#[test]
fn tuning_from_the_tests_and_their_cli_runs_writes_nothing_into_home() {
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    // Alone in this binary, so no other thread reads the environment meanwhile.
    std::env::set_var("HOME", home.path());
    std::env::remove_var("XDG_CACHE_HOME");
    common::isolate();

    // A problem big enough for the autotuner to measure (256 rows and more), and so to
    // write its cache.
    let n = 256;
    let x = Array2::from_shape_fn((n, 8), |(i, j)| ((i * 8 + j) as f32 * 0.01).sin());
    let ctx = Context::new().unwrap().with_tuning(true);
    Attention::new()
        .options(Options::default().kernels(Kernels::Auto))
        .return_weights(false)
        .run(&ctx, Inputs::x(&x))
        .unwrap();
    let x_path = work.path().join("x.npy");
    ndarray_npy::write_npy(&x_path, &x).unwrap();
    let run = |command: &mut std::process::Command| {
        let out = command
            .args([
                "run",
                "--x",
                x_path.to_str().unwrap(),
                "--context-only",
                "--out",
            ])
            .arg(work.path().join("out"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&mut common::bin());
    assert_eq!(
        files(home.path()),
        Vec::<String>::new(),
        "written into HOME"
    );
    assert!(common::tune_cache().exists());

    // The check can fail: without the tests' setting, the CLI writes its cache into HOME.
    // (Beside the tuning results, where the adapter keeps one: the compiled pipelines.)
    run(common::bin().env_remove("WGPU_ATTENTION_TUNE_CACHE"));
    let dir = format!(".cache{0}wgpu-attention{0}", std::path::MAIN_SEPARATOR);
    let written = files(home.path());
    assert!(written.contains(&format!("{dir}tune.json")), "{written:?}");
    assert!(written.iter().all(|f| f.starts_with(&dir)), "{written:?}");
}
