//! `wgpu-attention report --quick --out DIR` writes DIR/results.md, naming the adapter, and
//! DIR/results.json with every section.

mod common;

#[test]
fn report_quick_writes_markdown_and_json_with_every_section() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let run = common::bin()
        .args(["report", "--quick", "--out"])
        .arg(&out)
        .output()
        .expect("binary runs");
    let stdout = common::ok(&run);
    assert!(stdout.contains("results.md"), "{stdout}");

    let md = std::fs::read_to_string(out.join("results.md")).expect("results.md");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap())
            .expect("results.json parses");

    let adapter = json["adapter"]["name"].as_str().expect("adapter name");
    assert!(!adapter.is_empty());
    assert!(
        md.contains(adapter),
        "results.md does not name {adapter}:\n{md}"
    );
    for key in ["backend", "driver", "device_type"] {
        assert!(json["adapter"][key].is_string(), "adapter.{key}");
    }
    assert!(json["cpu"]["model"].is_string() && json["cpu"]["threads"].as_u64() >= Some(1));
    let date = json["date_utc"].as_str().expect("date");
    assert!(md.contains(&date[..10]), "results.md is not dated {date}");
    assert_eq!(json["quick"], true);
    assert!(json["fma_peak_gflops"].as_f64() > Some(0.0));

    for section in ["forward", "backward", "decode", "matmul"] {
        let rows = json[section]["rows"].as_array().expect(section);
        assert!(!rows.is_empty(), "{section} has no rows");
    }
    let paths: Vec<&str> = json["forward"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["path"].as_str())
        .collect();
    assert!(paths.contains(&"cpu f32 ndarray"), "{paths:?}");
    assert!(paths.iter().any(|p| p.ends_with(" fused")), "{paths:?}");
    assert!(paths.iter().any(|p| p.ends_with(" +weights")), "{paths:?}");
    let first = json["first_call"].as_array().expect("first_call");
    assert_eq!(first.len(), 4, "two calls, caches as found and cold");
    for run in first {
        assert!(run["first_ms"].as_f64() > Some(0.0), "{run}");
        assert!(run["context_new_ms"].as_f64() > Some(0.0), "{run}");
    }

    for heading in [
        "## Forward",
        "## Backward",
        "## Decode",
        "## Matmul",
        "## First call",
    ] {
        assert!(md.contains(heading), "{heading} missing:\n{md}");
    }
    // PyTorch's column: measured, or says why not.
    if json["pytorch"]["available"] == true {
        assert!(!json["forward"]["pytorch"].as_array().unwrap().is_empty());
    } else {
        assert!(md.contains("not available"), "{md}");
    }
    // The cold caches' scratch directory is gone.
    let left: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
}

#[test]
fn bench_says_its_build_first_and_skips_what_is_past_a_sections_budget() {
    let run = common::cli(&[
        "bench",
        "--n",
        "64",
        "--matmul",
        "0",
        "--section-budget",
        "0",
    ]);
    let stdout = common::ok(&run);
    let first = stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("build:") && first.contains("profile"),
        "{stdout}"
    );
    // Every GPU path of the size is skipped, each saying why; the CPU baseline still runs.
    let skipped: Vec<&str> = stdout.lines().filter(|l| l.contains("skipped:")).collect();
    assert!(skipped.iter().any(|l| l.starts_with("gpu ")), "{stdout}");
    assert!(
        skipped.iter().all(|l| l.contains("--section-budget")),
        "{stdout}"
    );
    assert!(stdout.contains("cpu f32 ndarray"), "{stdout}");
    // A debug build says so on stderr.
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(
        stderr.contains("warning: this is a debug build"),
        cfg!(debug_assertions),
        "{stderr}"
    );
}
