//! What the command line says when something is wrong: one line `error: …` on stderr, exit
//! status 2 for a usage error and 1 for any other failure, usage only with `--help`, and
//! help that says what each input takes.

mod common;

use std::process::Output;

fn cli(args: &[&str]) -> Output {
    common::bin().args(args).output().expect("binary runs")
}

/// Asserts `out` failed with `status`, printing nothing on stdout and exactly one line on
/// stderr that starts `error: ` and mentions `needle`.
fn one_line_error(args: &[&str], out: &Output, status: i32, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(status), "{args:?}: {stderr}");
    assert!(out.stdout.is_empty(), "{args:?}: stdout not empty");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: not one line:\n{stderr}");
    assert!(lines[0].starts_with("error: "), "{args:?}: {stderr}");
    assert!(
        lines[0].contains(needle),
        "{args:?}: no {needle:?} in {stderr}"
    );
    assert!(
        !stderr.contains("Usage"),
        "{args:?}: usage printed: {stderr}"
    );
}

#[test]
fn bad_arguments_to_every_subcommand_are_one_line_usage_errors() {
    let run = ["run", "--x", "x.npy", "--out", "o"];
    let sdpa = [
        "sdpa", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o",
    ];
    let with = |base: &[&'static str], extra: &[&'static str]| {
        let mut v = base.to_vec();
        v.extend_from_slice(extra);
        v
    };
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec![], "a command is needed"),
        (vec!["frobnicate"], "'frobnicate'"),
        (vec!["--bogus"], "'--bogus'"),
        (
            vec!["devices", "--backend", "bogus"],
            "unknown backend \"bogus\"",
        ),
        (vec!["devices", "extra"], "'extra'"),
        (with(&run, &["--heads", "abc"]), "'abc' for '--heads"),
        (with(&run, &["--heads", "-1"]), "-1"),
        (
            with(&run, &["--kernels", "fast"]),
            "expected auto, storage or subgroup",
        ),
        (with(&run, &["--dtype", "bf16"]), "expected f32 or f16"),
        (with(&run, &["--scale"]), "--scale"),
        (with(&run, &["--head", "2"]), "'--heads'"),
        (
            vec!["run", "--x", "x", "--out", "o", "--wq", "q", "--wv", "v"],
            "--wk",
        ),
        (vec!["run", "--out", "o"], "--x"),
        (vec!["run", "--x", "x"], "--out"),
        (
            vec!["sdpa", "--q", "q", "--k", "k", "--out", "o"],
            "--v <V>",
        ),
        (with(&sdpa, &["--scale", "big"]), "'big'"),
        (with(&sdpa, &["--backend", "cuda"]), "\"cuda\""),
        (vec!["verify", "--trials", "-1"], "0 or more"),
        (vec!["verify", "--trials", "many"], "'many'"),
        (vec!["verify", "--seed", "-3"], "whole number"),
        (vec!["verify", "--dtype", "f64"], "'f64'"),
        (vec!["bench", "--n", "0"], "1 or more"),
        (vec!["bench", "--n", "256,x"], "'x'"),
        (
            vec!["bench", "--kernels", "fast"],
            "storage, subgroup or all",
        ),
        (vec!["bench", "--repeats", "-2"], "1 or more"),
        (vec!["bench", "--warmup", "-1"], "0 or more"),
        (vec!["demo", "--bogus"], "'--bogus'"),
        (vec!["demo", "--seed", "-1"], "whole number"),
        (vec!["demo", "a", "b"], "'b'"),
    ];
    for (args, needle) in &cases {
        one_line_error(args, &cli(args), 2, needle);
    }
    // The line says where the usage is.
    let out = cli(&with(&run, &["--heads", "abc"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("(see `wgpu-attention run --help`)"),
        "{stderr}"
    );
}

#[test]
fn failures_after_parsing_are_one_line_with_status_1() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.npy");
    let missing = missing.to_str().unwrap();
    let out_dir = dir.path().join("o");
    let out_dir = out_dir.to_str().unwrap();
    let args = ["run", "--x", missing, "--out", out_dir];
    one_line_error(&args, &cli(&args), 1, missing);
    let args = [
        "sdpa", "--q", missing, "--k", missing, "--v", missing, "--out", out_dir,
    ];
    one_line_error(&args, &cli(&args), 1, missing);
    let args = ["demo", "--plot", "heatmap.gif"];
    one_line_error(&args, &cli(&args), 1, ".png or .svg");
    assert!(!dir.path().join("o").exists());
}

#[test]
fn a_typo_in_wgpu_backend_is_named_as_such() {
    for args in [&["devices"][..], &["verify", "--trials", "0"], &["demo"]] {
        let out = common::bin()
            .args(args)
            .env("WGPU_BACKEND", "vulkan,bogus")
            .output()
            .unwrap();
        one_line_error(args, &out, 1, "unknown backend \"bogus\" in WGPU_BACKEND");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("expected one of vulkan"), "{stderr}");
    }
}

#[test]
fn help_is_printed_on_request_and_says_what_inputs_and_exit_statuses_mean() {
    let help = |args: &[&str]| {
        let out = cli(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(out.stderr.is_empty(), "{args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let top = help(&["--help"]);
    for want in ["Exit status: 0 success", "1 failure", "2 usage error"] {
        assert!(top.contains(want), "no {want:?} in:\n{top}");
    }
    assert!(!help(&["--version"]).is_empty());
    for cmd in ["run", "sdpa"] {
        let text = help(&[cmd, "--help"]);
        assert!(
            text.contains("float16, float32 or float64"),
            "{cmd}:\n{text}"
        );
    }
    assert_eq!(help(&["help", "run"]), help(&["run", "--help"]));
    let demo = help(&["demo", "--help"]);
    assert!(
        demo.contains("Building the Self-Attention Mechanism of Large Language Models"),
        "{demo}"
    );
    assert!(!demo.to_lowercase().contains("seed 000"), "{demo}");
    assert!(demo.contains("relative"), "{demo}");
}
