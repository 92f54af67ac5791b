//! The command line's plots: `demo --plot`, `run --plot` and `bench --plot` write the
//! images they name, and refuse what they cannot write.

mod common;

use ndarray::Array3;

use common::{cli, ok};

/// The stderr of a run that must fail.
fn fails(out: &std::process::Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "succeeded:\n{stderr}");
    stderr
}

/// A PNG's width and height, from its signature and IHDR chunk.
fn png_size(path: &std::path::Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    assert_eq!(&bytes[12..16], b"IHDR");
    let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    (be(16), be(20))
}

#[test]
fn demo_plot_writes_a_heatmap_labelled_with_the_words() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("demo.png");
    let stdout = ok(&cli(&["demo", "--plot", png.to_str().unwrap()]));
    assert!(stdout.contains("heatmap -> "), "{stdout}");
    let (w, h) = png_size(&png);
    assert!(w >= 400 && h >= 400, "{w}x{h}");
    let svg = dir.path().join("demo.svg");
    ok(&cli(&[
        "demo",
        "the cat sat on the mat",
        "--plot",
        svg.to_str().unwrap(),
    ]));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("the cat sat on the mat"));
    // Each word labels its row and its column ("the" twice over).
    assert_eq!(text.matches(">\nthe\n<").count(), 4);
    assert_eq!(text.matches(">\nmat\n<").count(), 2);

    let gif = dir.path().join("x.gif");
    let stderr = fails(&cli(&["demo", "--plot", gif.to_str().unwrap()]));
    assert!(stderr.contains(".png or .svg"), "{stderr}");
}

#[test]
fn run_plot_draws_a_panel_per_head_and_refuses_no_weights() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let x = Array3::from_shape_fn((2, 5, 8), |(b, i, j)| {
        ((b * 40 + i * 8 + j) as f32 * 0.37).sin()
    });
    ndarray_npy::write_npy(p("x.npy"), &x).unwrap();
    let x_path = p("x.npy");
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--x", x_path.as_str()];
        args.extend(extra);
        cli(&args)
    };
    let stdout = ok(&run(&[
        "--heads",
        "4",
        "--out",
        &p("o"),
        "--plot",
        &p("w.svg"),
    ]));
    assert!(stdout.contains("heatmap   -> "), "{stdout}");
    let svg = std::fs::read_to_string(p("w.svg")).unwrap();
    for h in 0..4 {
        assert!(svg.contains(&format!(">\nhead {h}\n<")), "head {h}");
    }
    assert!(!svg.contains(">\nhead 4\n<"));
    assert!(svg.contains("(sequence 0 of 2)"));
    ok(&run(&["--out", &p("o1"), "--plot", &p("w.png")]));
    png_size(std::path::Path::new(&p("w.png")));

    // Refused before any output is written.
    let stderr = fails(&run(&[
        "--context-only",
        "--out",
        &p("o2"),
        "--plot",
        &p("n.png"),
    ]));
    assert!(stderr.contains("--context-only"), "{stderr}");
    assert!(!dir.path().join("o2").exists());
    // An unwritable plot path is an error, not a panic.
    let stderr = fails(&run(&["--out", &p("o3"), "--plot", &p("no/dir/w.png")]));
    assert!(stderr.starts_with("error: "), "{stderr}");
}

#[test]
fn bench_plot_draws_gflops_against_n_for_gpu_and_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("bench.svg");
    ok(&cli(&[
        "bench",
        "--n",
        "16,32",
        "--d",
        "8",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--matmul",
        "0",
        "--kernels",
        "storage",
        "--fused-only",
        "--plot",
        svg.to_str().unwrap(),
    ]));
    // A line for the GPU and one for the CPU baseline, by their legend entries.
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains(">\ngpu storage fused\n<"), "{text}");
    assert!(text.contains(">\ncpu f32 ndarray\n<"), "{text}");
}
